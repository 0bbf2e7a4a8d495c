#!/usr/bin/env bash
# The GPU checks, as one script for a lent CUDA machine (see tests/gpu and tests/perf/gpu_staging.py):
# build in place, run the gpu-marked tests, the default preflight with the state on the GPU (the GPU compute
# probe measures the interference), the staging benchmark, then a prediction check of one job shape.
# Each step has its own time limit so a slow one cannot starve the rest. Logs and JSON go to ${OUT:-./gpu-out}.
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CKPTBENCH_LOG_PROGRESS=0
PY=${PY:-python3}
LOG="$OUT/gpu-check.log"
t0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)" | tee -a "$LOG"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2; df -h /var/tmp | tail -1
  $PY -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'; } 2>&1 | tee -a "$LOG"
step build
$PY -m pip install --no-build-isolation --no-deps -q -e . 2>&1 | grep -v "as the 'root' user" | tail -5 | tee -a "$LOG"
step "gpu tests"
timeout "${GPU_TESTS_S:-300}" $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tail -25 | tee -a "$LOG"
if [ -n "${ONLY_TESTS:-}" ]; then step done; exit 0; fi
step "preflight --device cuda (the README's main job, state on the GPU)"
mkdir -p /var/tmp/ckptbench-preflight
timeout "${PREFLIGHT_S:-240}" $PY -m ckptbench preflight /var/tmp/ckptbench-preflight --device cuda --output "$OUT" \
    --plot "$OUT/preflight-gpu-waste.png" 2>&1 | tail -40 | tee -a "$LOG"
step "gpu staging benchmark"
timeout "${STAGING_S:-150}" $PY tests/perf/gpu_staging.py --size "${SIZE:-1GiB}" --rounds 3 --async-rounds 1 \
    --save "$OUT" 2>&1 | grep -v "^ \|^--\|^$" | tail -30 | tee -a "$LOG"
if [ -n "${PREDICT_S:-}" ]; then
  step "prediction check (one shape)"
  timeout "$PREDICT_S" $PY tests/perf/prediction_check.py --dir /var/tmp --shapes "${SHAPE:-1rank-2GB:142.9M:1}" \
      --output "$OUT/prediction-check-gpu.json" 2>&1 | tail -20 | tee -a "$LOG"
fi
step done
