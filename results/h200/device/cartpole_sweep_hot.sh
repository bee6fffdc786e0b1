#!/usr/bin/env bash
# Sweep of the hotloop learner on CartPole on the GPU (issue 4's "solves CartPole-v1"): each CONFIGS line is
# `hotloop train` with the settings of the CPU sweep's best run (results/cpu/cartpole_sweep/: FAST
# below) plus the line's --set overrides, for seeds 1-6; 8 runs at a time share the GPU (their wall times are
# not timings), then one line per config: seeds that reached a mean return of 475, median learner steps to it,
# seeds whose last epoch still holds >= 475, median last greedy evaluation.
# Usage (repo root, hotloop importable: part `cpsweep` of device_run_hot.sh puts the wheel on PYTHONPATH):
#   bash results/h200/device/cartpole_sweep_hot.sh OUT_DIR
set -u
out=$1; mkdir -p "$out"
FAST="num_envs=64 lr=7e-4 spectral_norm=False tau=0.05 target_update_interval=1 max_grad_norm=1.0 eps_decay_fraction=0.1"
CONFIGS=(
  "fast|"
  "lr3e-4|lr=3e-4"
  "tau0.01|tau=0.01"
  "lr3e-4_tau0.01|lr=3e-4 tau=0.01"
  "b256|batch_size=256"
  "sn|spectral_norm=True"
  "eps0.2|eps_decay_fraction=0.2"
  "envs32|num_envs=32"
  "lr3e-4_b256|lr=3e-4 batch_size=256"
  "tau0.01_b256|tau=0.01 batch_size=256"
)
for entry in "${CONFIGS[@]}"; do
  for seed in 1 2 3 4 5 6; do
    name=${entry%%|*}
    echo "$name $seed $FAST ${entry#*|}"
  done
done | xargs -P 8 -I{} bash -c 'set -- $1; name=$1; seed=$2; shift 2; sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
  timeout 240 python3 -m hotloop.guards.cli train --preset cartpole --device cuda --epochs 24 --no-progress --seed $seed \
    --set learner_steps_per_epoch=500 "${sets[@]}" --out '"$out"'/${name}_s$seed > '"$out"'/${name}_s$seed.log 2>&1' _ {}
python3 - "$out" <<'PY'
import glob, sys, collections, pandas as pd
from hotloop.profiles.epoch_table import solved_at
rows = collections.defaultdict(list)
for f in sorted(glob.glob(f"{sys.argv[1]}/*_s*/epochs.csv")):
    name, seed = f.split("/")[-2].rsplit("_s", 1)
    t = pd.read_csv(f); hit = solved_at(t)
    steps = hit["learner_steps"] if hit else None
    rows[name].append((int(seed), steps, t.mean_return_100.iloc[-1], t.eval_return.iloc[-1]))
for name, r in rows.items():
    solved = [s for _, s, _, _ in r if s is not None]
    print(f"{name:16s} solved {len(solved)}/{len(r)} steps_to_475 median "
          f"{pd.Series(solved).median() if solved else float('nan'):7.0f} holds {sum(m >= 475 for _, _, m, _ in r)}/{len(r)}"
          f" last_mean_return_100 {pd.Series([m for *_, m, _ in r]).median():6.1f} eval {pd.Series([e for *_, e in r]).median():6.1f}"
          f"  per seed {[(sd, st) for sd, st, _, _ in sorted(r)]}")
PY
