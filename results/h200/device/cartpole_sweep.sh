#!/usr/bin/env bash
# Hyperparameter sweep that chose the cartpole preset: each line of CONFIGS is one `hotloop train` run (CPU, one
# thread each, all in parallel on the H200 machine's 16 cores; hotloop must be importable, e.g. the wheel on
# PYTHONPATH as device_run_hot.sh puts it). Run at a working tree between 03ec571 and 7cf70ac, 2026-11-29; its table
# is learning/cartpole_preset_sweep.csv.
# Usage: bash results/h200/device/cartpole_sweep.sh OUT_DIR EPOCHS
set -u
out=$1; epochs=$2
CONFIGS=(
  "base|"
  "tui100|target_update_interval=100"
  "tui100_lr2.5e-4|target_update_interval=100 lr=2.5e-4"
  "tui100_lr1e-3|target_update_interval=100 lr=1e-3"
  "tui250|target_update_interval=250"
  "polyak0.005|target_update_interval=1 tau=0.005"
  "tui100_b256|target_update_interval=100 batch_size=256"
  "tui100_small|target_update_interval=100 trunk_hidden=[64,64] head_hidden=32"
  "tui100_nosn|target_update_interval=100 spectral_norm=False"
  "tui100_rb500k|target_update_interval=100 replay_capacity=500000"
  "tui100_alpha0.4|target_update_interval=100 per_alpha=0.4"
  "tui100_envs4|target_update_interval=100 num_envs=4"
  "tui100_clip1|target_update_interval=100 max_grad_norm=1.0"
  "tui100_seed2|target_update_interval=100 seed=2"
)
for entry in "${CONFIGS[@]}"; do
  name=${entry%%|*}; sets=()
  for kv in ${entry#*|}; do sets+=(--set "$kv"); done
  OMP_NUM_THREADS=1 python3 -m hotloop.guards.cli train --preset cartpole --device cpu --epochs "$epochs" --no-progress \
    --out "$out/$name" "${sets[@]}" > "$out/$name.log" 2>&1 &
done
wait
