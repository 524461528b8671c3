#!/bin/bash
# Prepare what a GPU machine (the device tool's nvidia-h200: Python 3.12 with torch, no Ray, no
# Hydra, no registry) needs for jobs/gpu_run.sh, in .devcarry/gpu (git-ignored; carry it):
# a compact training export of a dataset (anchor schedules are computed there) and the pure
# Python packages the image lacks (hydra, omegaconf, antlr4: the scale ladder's job; greenlet,
# a wheel for its Python: m4's replay).
#   jobs/gpu_prep.sh outputs/datagen_cc/dataset [n_train n_val n_test]   # default 2400 300 600
# Several datasets go in one quoted argument (n periods from each); DATA_OPTS are the export's
# DataConfig overrides, e.g. DATA_OPTS="components=true max_flows=1000".
set -euo pipefail
DATA=${1:?usage: jobs/gpu_prep.sh "<dataset folder>..." [n_train n_val n_test]}
shift
N=${*:-2400 300 600}
PYV=${PYV:-3.12}  # the GPU image's Python
C=.devcarry/gpu
mkdir -p "$C/site"
# shellcheck disable=SC2086
.venv/bin/python bench/train_device.py export --dataset $DATA --n $N --compact \
    --data ${DATA_OPTS:-} --out "$C/data.pt"
gzip -f "$C/data.pt"
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for pkg in hydra omegaconf antlr4; do
    rm -rf "${C:?}/site/$pkg"
    cp -r "$SITE/$pkg" "$C/site/"
done
GREENLET=$(.venv/bin/python -c "import greenlet; print(greenlet.__version__)")
WHL=$(mktemp -d)
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHL" "greenlet==$GREENLET"
(cd "$C/site" && rm -rf greenlet && unzip -q -o "$WHL"/greenlet-*.whl)
rm -rf "$WHL"
find "$C/site" -name __pycache__ -prune -exec rm -rf {} +
cp jobs/gpu_run.sh "$C/"
du -sh "$C"
echo "carry [\"$C\"] and run: bash $C/gpu_run.sh   (its header says how to size timeout_s)"
