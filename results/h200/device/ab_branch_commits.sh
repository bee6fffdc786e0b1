#!/usr/bin/env bash
# A/B step time of the trees in .devscratch/trees (one bench process each, two rounds), then kgate + ktimes each
# Record: the copy that ran for branch wip/dw1-in-dx2 on 2026-11-30 (trees of 65a7a86..8a10f9a; results in
# ab/dw1_in_dx2/). It read the trees and ktimes.py from the ignored .devscratch/ folder (ktimes.py is now
# experiments/kernel_times.py); the part `ab` of device_run_hot.sh, with ab_trees.sh, does this job since.
out=$1; shift; root=$PWD
export PYTHONUNBUFFERED=1
for round in 1 2; do
  for t in "$@"; do
    (cd $root/.devscratch/trees/$t && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m hotloop.guards.cli bench --preset seed-scale \
      --variants hotloop --out /tmp/r/ab_${t}_$round > /tmp/r/ab_${t}_$round.log 2>&1; echo "$t round $round rc=$?"; tail -n 3 /tmp/r/ab_${t}_$round.log)
  done
done
for t in "$@"; do
  (cd $root/.devscratch/trees/$t && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m hotloop.guards.cli gate --preset seed-scale --device cuda \
    --epochs 1 --set learner_steps_per_epoch=100 --no-progress --no-baseline --out /tmp/r/kgate_$t > /tmp/r/kgate_$t.log 2>&1
   echo "kgate $t rc=$?"; grep -E "^FAIL|kernels" /tmp/r/kgate_$t.log | head -5
   PYTHONPATH=/tmp/site:$PWD python3 $root/.devscratch/ktimes.py /tmp/r/kgate_$t/trace.json.gz > /tmp/r/ktimes_$t.txt 2>&1; tail -n 32 /tmp/r/ktimes_$t.txt)
done
(cd /tmp/r && tar czf "$out/ab.tgz" --exclude='*.qdstrm' --exclude='checkpoint.pt' .)
