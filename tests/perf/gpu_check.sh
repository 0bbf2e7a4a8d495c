#!/usr/bin/env bash
# The GPU checks, as one script for a lent CUDA machine (see tests/gpu and tests/perf/gpu_staging.py):
# build in place, run the gpu-marked tests and the writer tests with CUDA present, then the staging
# benchmark. Logs and JSON go to ${OUT:-./gpu-out}.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
nproc; free -g | head -2; df -h /tmp | tail -1
t0=$(date +%s)
$PY -m pip install --no-build-isolation --no-deps -q -e . 2>&1 | grep -v "as the 'root' user" | tail -5
echo "build: $(( $(date +%s) - t0 )) s"
$PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
timeout "${CPU_TESTS_S:-300}" $PY -m pytest -q -p no:cacheprovider -m 'not slow' tests/checkpoint tests/native 2>&1 \
    | tee "$OUT/cpu-tests.log" | tail -4
$PY tests/perf/gpu_staging.py --size "${SIZE:-2GiB}" --rounds 5 --save "$OUT" ${PROFILE:+--profile} 2>&1 \
    | tee "$OUT/gpu-staging.log" | grep -v "^ \|^--\|^$\|^Name\|Self CPU\|Self CUDA\|function calls\|Ordered by\|List reduced"
echo "total: $(( $(date +%s) - t0 )) s"
