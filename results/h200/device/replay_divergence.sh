# Graph vs eager vs eager divergence over 50 free-running steps, per tree (replaycheck.py, 2 trials each).
# Record: the copy that ran for branch wip/dw1-in-dx2 on 2026-11-30 (trees of 65a7a86..8a10f9a; output
# ab/dw1_in_dx2/replay_divergence.txt), as `bash bisect.sh main c1 c2 c3 c4`. It read the trees and
# replaycheck.py from the ignored .devscratch/ folder (replaycheck.py is now experiments/replay_divergence.py).
root=$PWD
for t in "$@"; do
  echo "== $t"; (cd $root/.devscratch/trees/$t && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 $root/.devscratch/replaycheck.py 2 2>&1 | grep -v Warn | tail -n 4)
done
