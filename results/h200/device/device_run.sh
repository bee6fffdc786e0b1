#!/usr/bin/env bash
# One batched H200 run (device tool): GPU cartpole training (2 seeds, background) beside the whole test suite
# on the GPU (slow CPU learning test excluded: CI runs it), then the kernel bench alone on the GPU.
# Usage (repo root, on the H200, .whl carried): bash results/h200/device/device_run.sh OUT_DIR [EPOCHS] [TRAIN_LIMIT_S]
set -u
out=$1; epochs=${2:-40}; limit=${3:-420}
mkdir -p "$out" /tmp/r
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "commit $commit date $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
for seed in 1 2; do
  timeout "$limit" python3 -m hotloop.guards.cli train --preset cartpole --device cuda --epochs "$epochs" --seed "$seed" \
    --no-progress --out "/tmp/r/cartpole_cuda_seed$seed" > "/tmp/r/cartpole_cuda_seed$seed.log" 2>&1 &
done
python3 -m pytest -q -p no:cacheprovider -m "not slow" -rs --junitxml="$out/junit.xml" > /tmp/r/pytest.log 2>&1
echo "pytest rc=$?"; tail -n 30 /tmp/r/pytest.log
wait
python3 -m lab.kernel_bench --out /tmp/r/kernels.csv > /tmp/r/bench.log 2>&1; echo "bench rc=$?"
cat /tmp/r/bench.log | tail -n 40
for seed in 1 2; do tail -n 3 "/tmp/r/cartpole_cuda_seed$seed.log"; done
(cd /tmp/r && tar czf "$out/results.tgz" .)
