#!/usr/bin/env bash
# Submit an m4ray experiment to a running Ray cluster as a Ray Job.
#
#   jobs/submit.sh [RAY_ADDRESS] [hydra overrides...]
#   jobs/submit.sh http://head:8265 +experiment=gray_failure workload.scale=1
#
# The job runs `python -m m4ray.sweeps ... ray=cluster` on the head node with this checkout as
# its working directory; outputs go to paths.output_dir (an absolute path every node can write,
# e.g. paths.output_dir=/shared/m4ray-outputs). `python` is the one of the head's virtualenv with
# the pinned stack, put first on the job's PATH (a job's plain PATH finds the system Python):
# $M4RAY_VENV if set (`${VAR}` references expand on the head); else this checkout's .venv for a
# cluster on this machine (a loopback address), else ${HOME}/m4ray/.venv, where
# `ray up jobs/cluster.yaml` puts it.
set -euo pipefail
cd "$(dirname "$0")/.."
address="${1:-${RAY_ADDRESS:-http://127.0.0.1:8265}}"
shift || true
overrides=("$@")
[ ${#overrides[@]} -gt 0 ] || overrides=(+experiment=gray_failure)
case "$address" in
  *://127.0.0.1:* | *://localhost:* | 127.0.0.1:* | localhost:*) default_venv="$PWD/.venv" ;;
  *) default_venv='${HOME}/m4ray/.venv' ;;  # expanded on the head by Ray's runtime env
esac
venv="${M4RAY_VENV:-$default_venv}"
echo "submit.sh: the job runs on $address with $venv/bin/python"
runtime_env=$(printf '{"excludes": [".venv", "outputs", ".git"], "env_vars": {"PATH": "%s/bin:${PATH}"}}' "$venv")
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
# A head that has just started may answer "No available agent to submit job" until its
# dashboard agent is up: nothing was submitted then, so wait and try again (1 minute at most).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for attempt in 1 2 3 4 5 6 7; do
  set +e
  .venv/bin/ray job submit --address "$address" --working-dir . \
    --runtime-env-json "$runtime_env" \
    -- python -m m4ray.sweeps "${overrides[@]}" ray=cluster 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ] && [ "$attempt" -lt 7 ] && grep -q "No available agent" "$log"; then
    echo "submit.sh: the head has no job agent yet; trying again in 10 s" >&2
    sleep 10
    continue
  fi
  exit "$status"
done
