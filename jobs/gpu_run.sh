#!/bin/bash
# One device-tool run on a GPU machine, from the repo root there (jobs/gpu_prep.sh first):
# m4 trainings side by side on one GPU (bench/train_device.py), then bench/m4_gpu.py.
#   bash .devcarry/gpu/gpu_run.sh          # device run: carry [".devcarry/gpu"]
# MIN (default 5) is each training's budget; give the run timeout_s >= 60 * MIN + 260: about a
# minute to load and score the anchor first, one to score the test periods after, M4GPU_S (90)
# for the bench. Those minutes grow with the splits: with 1,500 validation components (an export
# of components) the anchor's score took 2.5 minutes and an epoch 3.6; LIMIT is each trainer's.
# Each training writes its best epoch as it goes, and every tick the checkpoints so far are
# packed into $OUT/ckpts.tgz, so a run stopped at its limit still brings them back.
# RUNS: one line per training, "name: train_device.py train options" (default below).
set -u
MIN=${MIN:-5}; PY=${PY:-python3}; W=${W:-/tmp/m4ray_gpu}; OUT=${OUT:-/tmp/m4ray_out}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${DATA:-$HERE/data.pt.gz}
RUNS=${RUNS:-"h200: --hidden 200 --correction-l1 0
h200_prior: --hidden 200 --correction-l1 0 --model flow_prior=true
h64: --hidden 64 --correction-l1 0.1"}
mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$HERE/site${PYTHONPATH:+:$PYTHONPATH}
exec > >(tee "$OUT/main.log") 2>&1
date
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -2
$PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
gunzip -c "$DATA" > "$W/data.pt" || exit 1
timeout 120 $PY bench/train_device.py schedule --samples "$W/data.pt" --out "$W/sched.pt" \
    --workers "$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))" || exit 1
LIMIT=${LIMIT:-$($PY -c "print(int(60 * $MIN + 150))")}
PIDS=()
NAMES=()
while IFS= read -r line; do
    [ -z "$line" ] && continue
    name=${line%%:*}
    # shellcheck disable=SC2086
    timeout "$LIMIT" $PY bench/train_device.py train --samples "$W/sched.pt" --workers 1 \
        --minutes "$MIN" ${line#*:} --out "$W/$name" > "$OUT/$name.log" 2>&1 &
    PIDS+=($!)
    NAMES+=("$name")
done <<< "$RUNS"
# packed beside, then renamed: a run stopped mid-pack keeps the last whole archive (2026-11-30's
# lease lost its checkpoints to a tar cut at the outer limit)
pack() {
    (cd "$W" && ls -d "${NAMES[@]}" 2>/dev/null | xargs -r tar czf "$OUT/.ckpts.tgz") \
        && mv -f "$OUT/.ckpts.tgz" "$OUT/ckpts.tgz"
}
alive() { for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
while alive; do
    sleep "${TICK:-20}"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
    for n in "${NAMES[@]}"; do tail -n1 "$OUT/$n.log"; done
    pack
done
wait "${PIDS[@]}"
pack
ls -la "$OUT"
date
timeout "${M4GPU_S:-90}" $PY bench/m4_gpu.py --flows 512 4096 16384 --gpus 512 --seconds 1 \
    > "$OUT/m4_gpu.log" 2>&1
tail -25 "$OUT/m4_gpu.log"
date
