root=$PWD
for t in "$@"; do
  echo "== $t"; (cd $root/.devscratch/trees/$t && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 $root/.devscratch/replaycheck.py 2 2>&1 | grep -v Warn | tail -n 4)
done
