#!/usr/bin/env bash
# Wheels for benchmarks/gpu.py on a GPU machine that has torch (and numpy, scipy, xarray, pandas, h5py, tqdm,
# opt-einsum, matplotlib) but not Pyro (see benchmarks/gpu.py's docstring).
#
#   bash benchmarks/gpu_setup.sh            # here, with network: the pure-Python wheels -> benchmarks/wheels/
#   bash benchmarks/gpu_setup.sh install    # there, offline: install them into /tmp/site (no torch, no deps
#                                           # resolved: each needed wheel is named below); then
#                                           # export PYTHONPATH=/tmp/site:.
#
# benchmarks/wheels/ is ignored by git; carry it to the GPU machine with the working tree.
set -euo pipefail
cd "$(dirname "$0")"
WHEELS=wheels
# pyro-ppl and what it and race_nuts.py (arviz) need beyond that machine's packages; all pure Python
PACKAGES=(pyro-ppl==1.9.2 pyro-api==0.1.2 arviz==0.23.4 xarray-einstats==0.9.1 h5netcdf==1.8.2 platformdirs==4.3.8)
if [ "${1:-download}" = "install" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
    echo "installed into /tmp/site: export PYTHONPATH=/tmp/site:."
else
    mkdir -p "$WHEELS"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
        --platform any -d "$WHEELS" "${PACKAGES[@]}"
    ls -l "$WHEELS"
fi
