#!/usr/bin/env bash
# Generate the full-size m4 training dataset on a Ray cluster (a Ray Job through submit.sh).
#
#   jobs/datagen.sh [RAY_ADDRESS] [SCENARIOS] [extra hydra overrides...]
#   jobs/datagen.sh http://head:8265 1000 paths.output_dir=/shared/m4ray-outputs
#
# Full size = m4's 2000 flows per training-fabric scenario and larger collectives; the dataset
# lands in <paths.output_dir>/datagen-<SCENARIOS>/dataset (a path every node can write).
# Re-submitting the same command resumes: finished scenarios are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
address="${1:-${RAY_ADDRESS:-http://127.0.0.1:8265}}"
scenarios="${2:-1000}"
shift 2 || true
exec jobs/submit.sh "$address" +experiment=datagen \
  "datagen.scenarios=${scenarios}" \
  "datagen.families.m4_fabric.n_flows=[2000,2000]" \
  "datagen.families.rail.size_bytes=[262144,16777216]" \
  "name=datagen-${scenarios}" \
  "$@"
