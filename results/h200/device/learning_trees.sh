#!/usr/bin/env bash
# The hotloop learner's CartPole outcomes for several code trees at once on one H200 (device tool):
#   bash results/h200/device/learning_trees.sh OUT_DIR FIRST_SEED LAST_SEED
# Every tree of .abtrees (results/h200/device/ab_trees.sh; carry .abtrees and .whl) trains cartpole-fast on each
# seed, all runs at once on the one GPU (outcomes only: sharing the GPU changes the wall times, not the learning:
# the loop is in step with itself). Prints per run: reached 475, best, last-3-epochs mean, final greedy eval, held
# (run_outcomes.py); OUT_DIR gets results.tgz (the runs' epochs.csv, outcomes.csv and logs).
set -u
out=$1; first=$2; last=$3
rm -rf /tmp/w /tmp/site /tmp/site_*; mkdir -p /tmp/w
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
for t in .abtrees/*/; do
  n=$(basename "$t")
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "/tmp/site_$n" "$t" \
    > "/tmp/w/install_$n.log" 2>&1 || { echo "install of $n failed"; tail -n 5 "/tmp/w/install_$n.log"; }
  for s in $(seq "$first" "$last"); do
    (cd "$t" && PYTHONPATH=/tmp/site_$n:/tmp/site HOTLOOP_COMMIT=$(cat COMMIT) timeout ${RUN_TIMEOUT:-300} \
       python3 -m hotloop.guards.cli train --preset cartpole-fast --device cuda --no-progress --seed "$s" \
       --out "/tmp/w/${n}_s$s" > "/tmp/w/${n}_s$s.log" 2>&1) &
  done
done
wait
rm -f /tmp/w/*/checkpoint.pt /tmp/w/*/best_policy.pt
PYTHONPATH=/tmp/site_$(basename "$(ls -d .abtrees/*/ | head -n 1)"):/tmp/site python3 results/h200/device/run_outcomes.py /tmp/w
(cd /tmp/w && tar czf "$out/results.tgz" .)
