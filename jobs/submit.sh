#!/usr/bin/env bash
# Submit an m4ray experiment to a running Ray cluster as a Ray Job.
#
#   jobs/submit.sh [RAY_ADDRESS] [hydra overrides...]
#   jobs/submit.sh http://head:8265 +experiment=gray_failure workload.scale=1
#
# The job runs `python -m m4ray.sweeps ... ray=cluster` on the head node, in the cluster's .venv,
# with this checkout as its working directory; outputs go to paths.output_dir (default: a shared
# path is advised, e.g. paths.output_dir=/shared/m4ray-outputs).
set -euo pipefail
cd "$(dirname "$0")/.."
address="${1:-${RAY_ADDRESS:-http://127.0.0.1:8265}}"
shift || true
overrides=("$@")
[ ${#overrides[@]} -gt 0 ] || overrides=(+experiment=gray_failure)
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec .venv/bin/ray job submit --address "$address" --working-dir . \
  --runtime-env-json '{"excludes": [".venv", "outputs", ".git"]}' \
  -- python -m m4ray.sweeps "${overrides[@]}" ray=cluster
