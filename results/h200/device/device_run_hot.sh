#!/usr/bin/env bash
# Batched H200 runs for the hotloop learner (device tool; the parts named run in order within one call).
# Usage (repo root on the H200, .whl carried; .nsyslibs too for `nsys`):
#   bash results/h200/device/device_run_hot.sh OUT_DIR COMMIT PART...
# PART: tests    pytest -m "not slow" on the GPU (incl. the fault tests of tests/guards/test_faults.py); ${TESTS_TIMEOUT:-300} s:
#                the whole suite needs more since 2026-12-03 (650 of 1376 tests in 300 s): give it a call of its own
#       baseline the clean gate x5 repeats (cartpole, ${GATE_EPOCHS:-12} epochs, the preset's: 11 steady ones, whose median
#                the epoch rows judge; one slow table write in 2 epochs moved it) writing guards/baseline_files/<gpu>.json, copied into
#                the installed package too (its lookup reads the installed package data); when it fails, the
#                call stops after it
#       gpusuite pytest -m "${GPUSUITE_MARKS:-gpu or perf}" ${GPUSUITE_PATHS}: the tests that need the GPU (${GPUSUITE_TIMEOUT:-330} s)
#       baseline_seed  the same for the seed-scale preset (<gpu>--seed-scale.json), then one clean gate against it
#       clean5   ${CLEAN_RUNS:-5} clean gates of the default preset (${GATE_EPOCHS:-12} epochs) against the installed baseline: the false alarms
#                (${CLEAN_ARGS}: optional extra gate arguments, shell words, e.g. --loop-census)
#       census   hotloop gate --census-overhead on cartpole (1 epoch) and a 100-step seed-scale run: the censuses' cost
#       ciclean  ci/gate.sh clean only (2 epochs)
#       precision python -m lab.precision_bounds on cartpole and seed-scale: the probe's errors per GEMM
#                product for the step, an IEEE forward and a one-TF32-dot backward (the bounds' evidence)
#       mutate   hotloop mutate --self-baseline --jobs ${MUTATE_JOBS:-4}: the gate's mutation score on ci/mutants/
#       gate     clean gate x5 repeats writing the H200 baseline, then one gate per injected fault (guards/faults.py)
#       marks    pytest -m perf, then pytest -m smoke (JUnit XML each)
#       ranges   python -m hotloop.profiles.ranges: the cost of one phase range
#       ci       ci/gate.sh clean, then with HOTLOOP_GATE_ARGS='--inject item' (must exit 1)
#       nsys     hotloop nsys around a short seed-scale training run, then the gate on the same configuration
#                (its Kineto trace.json.gz): the Kineto-vs-Nsight cross-check's two traces (needs .nsyslibs)
#       kgate    the gate on a 100-step seed-scale run, no baseline: its Kineto trace.json.gz (per-kernel times)
#       probe    python -m lab.split_gemm_probe: the backward GEMMs by precision, split placement and layout
#                (${PROBE_MODES}: a comma-separated subset of its modes, e.g. tf32x3,bf16x3,bf16x6,cat-tma,tf32;
#                ${PROBE_GEMMS}: only the GEMMs whose name holds that text)
#       floor    results/h200/experiments/step_floor.py: the step's design floor (bare GEMMs, no tail, no sampling),
#                eleven variants of the step body timed interleaved, per-kernel times from Kineto
#       cpsweep  results/h200/device/cartpole_sweep_hot.sh: the hotloop learner on CartPole, 10 settings x 6 seeds
#       bench1   hotloop bench: eager, graph-fp32, graph-tf32, compiled-split, hotloop
#       benchhot hotloop bench: hotloop only
#       levers   issue 38: hotloop bench at seed scale, the hotloop row and each lever variant (${LEVER_VARIANTS:-
#                hotloop:dependent_launch}, comma-separated) side by side, ${LEVER_STEPS:-500} steps each, twice, the
#                second run in reverse order (an order effect shows as a flipped ratio); kernel-gap tables per row
#       dwprobe  issue 38: python -m lab.dw_epilogue_probe: the weight-gradient GEMM's atomic epilogue against stored
#                split-K partials at 1x, 2x, 4x the 132-program floor (dw_epilogue.csv)
#       bench3   hotloop bench: eager, graph-fp32, graph-tf32, hotloop (no compiled rows: ~2 minutes)
#       bench2   hotloop bench: compiled-tf32, hotloop (the compile alone takes ~6 minutes)
#       learning hotloop learning --preset ${LEARN_PRESET:-cartpole-fast} --seeds ${LEARN_SEEDS:-1-10} --jobs 8: both
#                learners, the learning table (seed, steps and seconds to 475, best, last-3 mean, final eval)
#       learning_default  hotloop learning --preset cartpole --seeds 1-5 --learners hotloop: the default preset's
#                runs with the hotloop learner
#       learning_wide  the hotloop learner on cartpole-fast, seeds ${WIDE_SEEDS:-11-22}, all at once on the one GPU:
#                the outcomes (reached 475, last-3-epochs mean, final eval) and not the times (the loop is in step
#                with itself, so sharing the GPU changes the wall times only). WIDE_VARIANTS (optional, shell
#                words NAME or NAME:KEY=VALUE,KEY=VALUE, default "hot"): each variant's overrides (`--set`) on
#                every seed, all variants at once, run folders wide/<NAME>_s<seed>
#       cartpole_fast  the cartpole-fast preset: hotloop on the GPU, seeds 1-6 one after another, while the reference
#                learner runs the same seeds on CPU cores 8-13 (one core each, OMP_NUM_THREADS=1); wall time and
#                steps to a mean return of 475 from epochs.csv, and each process's wall time
#       wholerun cartpole-fast cold, warm kernel cache, and warm with a bytecode cache too; seed-scale 5 epochs: the
#                run timelines (issue 37)
#       evalfast cartpole-fast twice (cold, then warm kernel cache): the evaluation's time per epoch (evaluate_s) and the
#                run's summary lines; then python -m lab.eval_paths_bench on the warm run's best policy: the captured
#                graph and the fused kernel at each tiling side by side (issue 37 item 2)
#       dp1      issue 39 on one GPU: the default preset's gate in one process, then `hotloop gate --nproc 1` (NCCL, world
#                size 1: the all-reduce captured in the learner's graph); each one's step medians (guard.json: dur_us,
#                gpu_kernel_us, gpu_busy_us, NCCL kernels) side by side: the all-reduce's cost per learner step
#       dpscale  issue 39 on a multi-GPU machine (every GPU it has, e.g. the nvidia-h100-x4 kind): the default preset
#                trained ${DP_EPOCHS:-4} epochs in one process, then `hotloop train --nproc N` for N = 1, 2, 4, 8 up to the
#                GPU count, then `hotloop gate --nproc N` at each N > 1 (the per-rank table);
#                python -m lab.dp_scaling: iteration time and scaling efficiency per world size (dp_scaling.csv)
#       startup  where a run's start-up goes here: .pyc files of torch/matplotlib, import times, -X importtime
#       seedkill kill -9 during a seed-scale background checkpoint write, then --resume: every epoch once (issue 37)
#       seed3    hotloop train --preset seed-scale --epochs 3: the per-epoch wall time (learner steps/s) only
#       seed200  hotloop train --preset seed-scale --epochs 200 (run folder in /dev/shm when it has room: the
#                checkpoint is 0.6 GB per epoch)
#       seed200&  the same in the background (the parts after it share the GPU with it); waited for at the end
#       ab       the trees results/h200/device/ab_trees.sh made in .abtrees/ (carry it; trees of the hotloop.* layout
#                only, each installed into its own /tmp/site_<tree>), side by side: `hotloop bench
#                --variants hotloop` of each in its own process, two rounds in turn; then per tree a 100-step
#                seed-scale gate trace (per-kernel medians) and, with AB_PYTEST set (shell words: test paths), that
#                tree's own tests
# Everything goes to /tmp/r; OUT_DIR gets results.tgz after every part (the device tool returns at most 8 files).
set -u
out=$1; commit=$2; shift 2
rm -rf /tmp/r; mkdir -p /tmp/r  # a warm machine keeps the last call's files
# hotloop installs as the `hotloop.*` package (pyproject's package-dir mapping): the checkout itself is not
# importable from PYTHONPATH. Install it (no network: the image's setuptools, no build isolation) with the
# carried wheels (.whl: nvtx, gymnasium, ...) into /tmp/site.
install_tree() {  # install_tree SRC TARGET: the hotloop of SRC into TARGET
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$2" "$1" \
    > "/tmp/r/install_$(basename "$2").log" 2>&1 || { echo "install of $1 failed:"; tail -n 5 "/tmp/r/install_$(basename "$2").log"; }
}
rm -rf /tmp/site /tmp/site_*  # a warm machine keeps the last call's install, and pip --target does not replace it
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
install_tree . /tmp/site
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HOTLOOP_COMMIT=$commit
# The lab code (results/lab/: probes and benches not shipped in the wheel) imports from the checkout root: the parts that run
# it (precision, probe, floor) put the root after the installed hotloop; pytest finds it (pyproject's pythonpath).
LABPATH=/tmp/site:$PWD/results
echo "commit $commit date $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
HL="python3 -m hotloop.guards.cli"  # unquoted below: `timeout` needs a program, not a shell function
SEED_SMALL=(--preset seed-scale --device cuda --epochs 1 --set learner_steps_per_epoch=100 --no-progress)
for part in "$@"; do
  t0=$SECONDS
  case $part in
    tests)
      # PYTEST_SELECT (optional, shell words): test ids or paths instead of the whole suite
      timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m "not slow" -rs --junitxml=/tmp/r/junit.xml \
        ${PYTEST_SELECT:-} > /tmp/r/pytest.log 2>&1
      echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/r/pytest.log | tail -n 25 ;;
    gate)
      timeout 200 $HL gate --preset cartpole --device cuda --epochs 2 --repeats 5 --no-progress --out /tmp/r/gate_clean \
        --baseline-dir guards/baseline_files --update-baseline > /tmp/r/gate_clean.log 2>&1; echo "clean rc=$?"; tail -n 4 /tmp/r/gate_clean.log
      for f in item event_sync device_sync pageable_copy d2d_copy grid1 sn_split ddqn_serial fwd_fp32 bwd_tf32; do
        timeout 60 $HL gate --preset cartpole --device cuda --epochs 1 --guard-steps 5 --no-progress --inject $f \
          --out /tmp/r/gate_$f > /tmp/r/gate_$f.log 2>&1; rc=$?
        # only exit 1 with the fault's criterion FAIL is a caught fault: 70 is a crash, 2 a refused injection
        echo "$f rc=$rc$( ((rc == 70)) && echo ' (CRASH: not a kill)') $(grep -E '^FAIL' /tmp/r/gate_$f.log | tr '\n' ' ')"
      done
      cp guards/baseline_files/*.json /tmp/r/ 2>/dev/null ;;
    baseline)
      timeout 240 $HL gate --preset cartpole --device cuda --epochs ${GATE_EPOCHS:-12} --repeats 5 --no-progress --out /tmp/r/gate_clean \
        --baseline-dir guards/baseline_files --update-baseline > /tmp/r/gate_clean.log 2>&1; rc=$?; echo "clean rc=$rc"
      ((rc == 0)) || stop=1  # a clean gate that fails makes every later part's result meaningless
      tail -n 6 /tmp/r/gate_clean.log; cp guards/baseline_files/*.json /tmp/site/hotloop/guards/baseline_files/
      cp guards/baseline_files/*.json /tmp/r/ ;;
    baseline_seed)
      # the seed-scale baseline (guards/baseline_files/<gpu>--seed-scale.json), then one clean gate against it
      timeout 240 $HL gate --preset seed-scale --device cuda --epochs 2 --repeats 5 --no-progress --out /tmp/r/gate_seed \
        --baseline-dir guards/baseline_files --update-baseline > /tmp/r/gate_seed.log 2>&1; echo "seed-scale baseline rc=$?"
      tail -n 3 /tmp/r/gate_seed.log; cp guards/baseline_files/*.json /tmp/site/hotloop/guards/baseline_files/
      cp guards/baseline_files/*.json /tmp/r/
      timeout 200 $HL gate --preset seed-scale --device cuda --epochs 2 --no-progress --out /tmp/r/gate_seed_check \
        > /tmp/r/gate_seed_check.log 2>&1; echo "seed-scale clean gate rc=$?"; tail -n 2 /tmp/r/gate_seed_check.log ;;
    clean5)
      # the clean tree's false-alarm check: five gates of the default preset against the installed baseline
      for i in $(seq "${CLEAN_RUNS:-5}"); do
        timeout 120 $HL gate --preset cartpole --device cuda --epochs ${GATE_EPOCHS:-12} --no-progress ${CLEAN_ARGS:-} --out /tmp/r/clean5_$i \
          > /tmp/r/clean5_$i.log 2>&1; echo "clean run $i rc=$? $(tail -n 1 /tmp/r/clean5_$i.log)"
        grep -E "^ *.*(FAIL)" /tmp/r/clean5_$i.log | head -n 5
      done ;;
    census)
      # issue 36: the loop and structure censuses' cost per iteration (`hotloop gate --census-overhead`), the
      # default preset and a 100-step seed-scale run, no baseline (the overhead line is what this part is for)
      timeout 150 $HL gate --preset cartpole --device cuda --epochs 1 --no-progress --no-baseline --census-overhead \
        --out /tmp/r/census_cartpole > /tmp/r/census_cartpole.log 2>&1; echo "census cartpole rc=$?"
      timeout 200 $HL gate "${SEED_SMALL[@]}" --no-baseline --census-overhead --out /tmp/r/census_seed \
        > /tmp/r/census_seed.log 2>&1; echo "census seed-scale rc=$?"
      grep -h -i "census" /tmp/r/census_cartpole.log /tmp/r/census_seed.log | head -n 12 ;;
    ciclean)
      HOTLOOP_SKIP_INSTALL=1 HOTLOOP_EPOCHS=2 HOTLOOP_RUN_DIR=/tmp/r/ci_clean timeout 240 bash ci/gate.sh \
        > /tmp/r/ci_clean.log 2>&1; echo "ci clean rc=$?"; tail -n 12 /tmp/r/ci_clean.log ;;
    gpusuite)
      timeout ${GPUSUITE_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -m "${GPUSUITE_MARKS:-gpu or perf}" -rs \
        ${GPUSUITE_PATHS:-} --junitxml=/tmp/r/junit_gpusuite.xml > /tmp/r/pytest_gpusuite.log 2>&1
      echo "pytest gpu/perf/smoke rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/r/pytest_gpusuite.log | tail -n 25 ;;
    precision)
      for pre in cartpole seed-scale; do
        PYTHONPATH=$LABPATH timeout 240 python3 -m lab.precision_bounds --preset $pre --steps 20 \
          --csv /tmp/r/precision_$pre.csv > /tmp/r/precision_$pre.log 2>&1; echo "precision $pre rc=$?"; tail -n 30 /tmp/r/precision_$pre.log
      done ;;
    mutate)
      # the device copy's git index may predate files added since (hotloop mutate copies tracked files only)
      git add -A -- . ':!.whl' > /dev/null 2>&1
      timeout ${MUTATE_TIMEOUT:-540} $HL mutate --self-baseline --jobs ${MUTATE_JOBS:-4} --out /tmp/r/mutate \
        ${MUTATE_ONLY:+--only $MUTATE_ONLY} > /tmp/r/mutate.log 2>&1; echo "mutate rc=$?"; tail -n 40 /tmp/r/mutate.log ;;
    marks)
      for m in perf smoke; do
        timeout 240 python3 -m pytest -q -p no:cacheprovider -m $m -rs --junitxml=/tmp/r/junit_$m.xml \
          > /tmp/r/pytest_$m.log 2>&1; echo "pytest -m $m rc=$?"; tail -n 3 /tmp/r/pytest_$m.log
      done ;;
    ranges) timeout 60 python3 -m hotloop.profiles.ranges 2>&1 | tee /tmp/r/ranges.txt ;;
    ci)
      HOTLOOP_SKIP_INSTALL=1 HOTLOOP_EPOCHS=2 HOTLOOP_RUN_DIR=/tmp/r/ci_clean timeout 280 bash ci/gate.sh \
        > /tmp/r/ci_clean.log 2>&1; echo "ci clean rc=$?"; tail -n 8 /tmp/r/ci_clean.log
      # the failing run's pytest step is narrowed to the smoke tests of one file: the gate is what must fail
      HOTLOOP_SKIP_INSTALL=1 HOTLOOP_EPOCHS=1 HOTLOOP_RUN_DIR=/tmp/r/ci_item HOTLOOP_GATE_ARGS='--inject item' \
        HOTLOOP_PYTEST_ARGS='tests/trainer/test_gpu_paths.py' \
        timeout 280 bash ci/gate.sh > /tmp/r/ci_item.log 2>&1; echo "ci item rc=$?"; tail -n 8 /tmp/r/ci_item.log ;;
    nsys)
      timeout 300 $HL nsys --out /tmp/r/nsys -- python3 -m hotloop.guards.cli train "${SEED_SMALL[@]}" --out /tmp/r/nsys_run \
        > /tmp/r/nsys.log 2>&1; echo "nsys rc=$?"; tail -n 40 /tmp/r/nsys.log
      timeout 200 $HL gate "${SEED_SMALL[@]}" --no-baseline --out /tmp/r/kineto_gate > /tmp/r/kineto_gate.log 2>&1
      echo "kineto gate rc=$?"; tail -n 3 /tmp/r/kineto_gate.log ;;
    kgate)
      timeout 200 $HL gate "${SEED_SMALL[@]}" --no-baseline --out /tmp/r/kgate > /tmp/r/kgate.log 2>&1
      echo "kgate rc=$?"; grep -E "^(PASS|FAIL)|kernels" /tmp/r/kgate.log | head -n 30 ;;
    learning)
      # hotloop learning: the hotloop learner on the GPU, seeds one at a time, beside the reference learner on 8 CPU
      # cores (one thread each); the learning table and the summary per learner
      timeout 560 $HL learning --preset ${LEARN_PRESET:-cartpole-fast} --seeds ${LEARN_SEEDS:-1-10} --jobs 8 \
        --out /tmp/r/learning > /tmp/r/learning.log 2>&1; echo "learning rc=$?"; tail -n 30 /tmp/r/learning.log
      rm -f /tmp/r/learning/runs/*/checkpoint.pt ;;
    learning_default)
      timeout 300 $HL learning --preset cartpole --seeds 1-5 --learners hotloop --out /tmp/r/learning_default \
        > /tmp/r/learning_default.log 2>&1; echo "learning_default rc=$?"; tail -n 16 /tmp/r/learning_default.log
      rm -f /tmp/r/learning_default/runs/*/checkpoint.pt ;;
    learning_wide)
      wide=${WIDE_SEEDS:-11-22}
      for v in ${WIDE_VARIANTS:-hot}; do
        name=${v%%:*}; sets=(); kvs=()  # NAME or NAME:k=v,k=v
        # split at the commas that start a KEY=: a value may hold commas (trunk_hidden=(128,128))
        [[ $v == *:* ]] && mapfile -t kvs < <(sed 's/,\([A-Za-z_][A-Za-z_0-9]*=\)/\n\1/g' <<< "${v#*:}")
        for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
        for s in $(seq ${wide%-*} ${wide#*-}); do
          timeout ${WIDE_TIMEOUT:-170} $HL train --preset cartpole-fast --device cuda --no-progress --seed $s \
            "${sets[@]}" --out /tmp/r/wide/${name}_s$s > /tmp/r/wide_${name}_s$s.log 2>&1 &
        done
      done
      wait; rm -f /tmp/r/wide/*/checkpoint.pt /tmp/r/wide/*/best_policy.pt
      python3 results/h200/device/run_outcomes.py /tmp/r/wide
      ;;
    cartpole_fast)
      # the process wall time (start to exit, evaluations included) goes to each run's log's last line
      for s in 1 2 3 4 5 6; do
        ( p0=$EPOCHREALTIME; OMP_NUM_THREADS=1 taskset -c $((7 + s)) timeout 400 $HL train --preset cartpole-fast \
          --device cpu --set learner=reference --no-progress --seed $s --out /tmp/r/cpfast_ref_s$s \
          > /tmp/r/cpfast_ref_s$s.log 2>&1; echo "process_start_end $p0 $EPOCHREALTIME" >> /tmp/r/cpfast_ref_s$s.log ) &
      done
      for s in 1 2 3 4 5 6; do
        p0=$EPOCHREALTIME
        timeout 150 $HL train --preset cartpole-fast --device cuda --no-progress --seed $s --out /tmp/r/cpfast_hot_s$s \
          > /tmp/r/cpfast_hot_s$s.log 2>&1; echo "hotloop seed $s rc=$?"
        echo "process_start_end $p0 $EPOCHREALTIME" >> /tmp/r/cpfast_hot_s$s.log
      done
      wait
      python3 - <<'PY'
import glob, pandas as pd
from hotloop.profiles.epoch_table import solved_at
for f in sorted(glob.glob("/tmp/r/cpfast_*/epochs.csv")):
    t = pd.read_csv(f); k = solved_at(t)
    start, end = map(float, open(f.replace("/epochs.csv", ".log")).read().split("process_start_end")[-1].split())
    proc = f"{end - start:.1f}"
    print(f.split("/")[3], "epochs", len(t), "max", round(t.mean_return_100.max(), 1), "last",
          round(t.mean_return_100.iloc[-1], 1), "epoch1", round(t.wall_s[0], 2), "s process", proc, "s to475:",
          "never" if k is None else f"{k['learner_steps']} steps {k['env_steps']} env {k['wall_s']:.1f} s")
PY
      ;;
    probe) PYTHONPATH=$LABPATH timeout 300 python3 -m lab.split_gemm_probe --out /tmp/r ${PROBE_MODES:+--modes $PROBE_MODES} \
             ${PROBE_GEMMS:+--gemms "$PROBE_GEMMS"} 2>&1 | tee /tmp/r/split_gemm_probe.md ;;
    floor) PYTHONPATH=$LABPATH timeout 400 python3 results/h200/experiments/step_floor.py /tmp/r/floor > /tmp/r/step_floor.log 2>&1
           echo "floor rc=$?"; tail -n 60 /tmp/r/step_floor.log | cut -c1-200 ;;
    cpsweep) timeout 500 bash results/h200/device/cartpole_sweep_hot.sh /tmp/r/cpsweep 2>&1 | tee /tmp/r/cpsweep.txt ;;
    bench1) timeout 560 $HL bench --preset seed-scale --variants eager,graph,compiled-split,hotloop --out /tmp/r/bench1 \
              > /tmp/r/bench1.log 2>&1; echo "rc=$?"; tail -n 12 /tmp/r/bench1.log ;;
    benchhot) timeout 120 $HL bench --preset seed-scale --variants hotloop --out /tmp/r/benchhot \
                > /tmp/r/benchhot.log 2>&1; echo "rc=$?"; tail -n 4 /tmp/r/benchhot.log ;;
    levers)
      lv=${LEVER_VARIANTS:-hotloop:dependent_launch}
      rev=$(echo "$lv" | tr ',' '\n' | tac | paste -sd, -)
      for order in "hotloop,$lv" "$rev,hotloop"; do
        n=$((${n:-0} + 1))
        timeout 280 $HL bench --preset seed-scale --variants "$order" --steps ${LEVER_STEPS:-500} --out /tmp/r/levers$n \
          > /tmp/r/levers$n.log 2>&1; echo "levers run $n ($order) rc=$?"
        python3 -c "import pandas as pd; d=pd.read_csv('/tmp/r/levers$n/bench.csv'); print(d[['variant','us_per_step_p20','us_per_step_p50','us_per_step_p80','kernels_per_step','ratio_to_hotloop']].to_string(index=False))"
        grep "kernel gaps:" /tmp/r/levers$n.log
      done ;;
    dwprobe) PYTHONPATH=$LABPATH timeout 200 python3 -m lab.dw_epilogue_probe --scales 1,2,4 --csv /tmp/r/dw_epilogue.csv \
               > /tmp/r/dwprobe.log 2>&1; echo "dwprobe rc=$?"; tail -n 14 /tmp/r/dwprobe.log ;;
    bench3) timeout 300 $HL bench --preset seed-scale --variants eager,graph,hotloop --out /tmp/r/bench3 \
              > /tmp/r/bench3.log 2>&1; echo "rc=$?"; tail -n 8 /tmp/r/bench3.log ;;
    bench2) timeout 560 $HL bench --preset seed-scale --variants compiled-tf32,hotloop --out /tmp/r/bench2 \
              > /tmp/r/bench2.log 2>&1; echo "rc=$?"; tail -n 8 /tmp/r/bench2.log ;;
    seed3) timeout 200 $HL train --preset seed-scale --device cuda --epochs 3 --seed 1 --no-progress \
             --out /tmp/r/seed3 > /tmp/r/seed3.log 2>&1; echo "seed3 rc=$?"; rm -f /tmp/r/seed3/checkpoint.pt
           cut -d, -f1-6 /tmp/r/seed3/epochs.csv ;;
    seed200 | 'seed200&')
      shm=/dev/shm; (( $(df -Pk /dev/shm | awk 'NR==2 {print $4}') > 4000000 )) || shm=/tmp
      seed200() {
        timeout 570 $HL train --preset seed-scale --device cuda --epochs 200 --seed 1 --no-progress \
          --out $shm/seed200 > /tmp/r/seed200.log 2>&1; echo "seed200 rc=$? (run folder in $shm)"
        tail -n 3 /tmp/r/seed200.log
        mkdir -p /tmp/r/seed200 && cp $shm/seed200/*.{csv,md,json,png} /tmp/r/seed200/ 2>/dev/null
      }
      if [[ $part == seed200 ]]; then seed200; else seed200 & bg=$!; fi ;;
    ab)
      trees=(.abtrees/*/)
      [[ -d ${trees[0]} ]] || { echo "ab: no trees in .abtrees (make them with results/h200/device/ab_trees.sh, carry .abtrees)"; continue; }
      for t in "${trees[@]}"; do install_tree "$t" "/tmp/site_$(basename "$t")"; done
      for round in 1 2; do
        for t in "${trees[@]}"; do
          n=$(basename "$t")
          (cd "$t" && PYTHONPATH=/tmp/site_$n:/tmp/site HOTLOOP_COMMIT=$(cat COMMIT) timeout 150 $HL bench --preset seed-scale \
            --variants hotloop --out /tmp/r/ab_${n}_$round > /tmp/r/ab_${n}_$round.log 2>&1
           echo "ab $n ($(cat COMMIT)) round $round rc=$? us/step p20 p50 p80:" \
             "$(awk '$1 == "hotloop" {print $3, $4, $5}' /tmp/r/ab_${n}_$round.log)")
        done
      done
      for t in "${trees[@]}"; do
        n=$(basename "$t")
        (cd "$t" && export PYTHONPATH=/tmp/site_$n:/tmp/site HOTLOOP_COMMIT=$(cat COMMIT)
         timeout 200 $HL gate "${SEED_SMALL[@]}" --no-baseline --out /tmp/r/abgate_$n > /tmp/r/abgate_$n.log 2>&1
         echo "ab $n gate rc=$?"
         python3 -c "import sys; from hotloop.profiles.kineto_reader import read_kineto; k = read_kineto(sys.argv[1]);
k = k[k.kind == 'kernel']; g = k.groupby(['name', 'grid_x', 'grid_y', 'grid_z']).dur_us.agg(['count', 'median'])
print(g.sort_values('median', ascending=False).to_string())" /tmp/r/abgate_$n/trace.json.gz > /tmp/r/abkernels_$n.txt 2>&1
         head -n 12 /tmp/r/abkernels_$n.txt | cut -c1-150
         if [[ -n ${AB_PYTEST:-} ]]; then
           timeout 300 python3 -m pytest -q -p no:cacheprovider -m "not slow" $AB_PYTEST > /tmp/r/abpytest_$n.log 2>&1
           echo "ab $n pytest rc=$? $(tail -n 1 /tmp/r/abpytest_$n.log)"
         fi)
      done ;;
    wholerun)
      # issue 37: cartpole-fast twice (the first compiles: a cold kernel cache; the second: warm), then seed-scale
      # for 5 epochs; each run's printed timeline summary, its per-epoch *_s columns and timeline.csv
      # then twice with a writable bytecode cache (PYTHONPYCACHEPREFIX; the image's torch has no .pyc and sets
      # PYTHONDONTWRITEBYTECODE, where a pip install compiles them): pyc_fill writes it, warm_pyc is a user's warm run
      for i in cold warm pyc_fill warm_pyc; do
        pyc=(); [[ $i == *pyc* ]] && pyc=(env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc)
        timeout 150 "${pyc[@]}" $HL train --preset cartpole-fast --seed 1 --no-progress --out /tmp/r/fast_$i > /tmp/r/fast_$i.log 2>&1
        echo "cartpole-fast $i rc=$?"; grep -E "^(hotloop: (run|  the rest|  in the|checkpoints)|epoch 1:)" /tmp/r/fast_$i.log
        cp /tmp/r/fast_$i/timeline.csv /tmp/r/fast_$i/epochs.csv /tmp/r/ 2>/dev/null
        mv /tmp/r/timeline.csv /tmp/r/timeline_fast_$i.csv; mv /tmp/r/epochs.csv /tmp/r/epochs_fast_$i.csv
      done
      timeout 240 $HL train --preset seed-scale --epochs 5 --no-progress --out /tmp/r/seed5 > /tmp/r/seed5.log 2>&1
      echo "seed-scale 5 epochs rc=$?"; grep -E "^(hotloop: (run|  the rest|  in the|checkpoints)|epoch [0-9]+:)" /tmp/r/seed5.log
      cp /tmp/r/seed5/timeline.csv /tmp/r/timeline_seed5.csv; cp /tmp/r/seed5/epochs.csv /tmp/r/epochs_seed5.csv
      python3 -c "import pandas as pd; d=pd.read_csv('/tmp/r/epochs_seed5.csv'); c=['epoch','wall_s','warmup_s','evaluate_s','table_s','checkpoint_s','checkpoint_write_s','epoch_total_s']; d['outside_pct']=100*(d.epoch_total_s-d.wall_s)/d.epoch_total_s; print(d[c+['outside_pct']].to_string(index=False))" ;;
    evalfast)
      for i in cold warm; do
        timeout 150 $HL train --preset cartpole-fast --seed 1 --no-progress --out /tmp/r/ef_$i > /tmp/r/ef_$i.log 2>&1
        echo "cartpole-fast $i rc=$?"; grep -E "^hotloop: (run|  the rest)" /tmp/r/ef_$i.log
        python3 -c "import pandas as pd; d=pd.read_csv('/tmp/r/ef_$i/epochs.csv'); print('evaluate_s median', round(d.evaluate_s.median()*1e3, 2), 'ms, max', round(d.evaluate_s.max()*1e3, 2), 'ms; eval_return', d.eval_return.tolist()[-4:])"
        cp /tmp/r/ef_$i/epochs.csv /tmp/r/epochs_ef_$i.csv
      done
      PYTHONPATH=$LABPATH timeout 150 python3 -m lab.eval_paths_bench /tmp/r/ef_warm --csv /tmp/r/eval_paths.csv \
        2>&1 | tee /tmp/r/eval_paths.log ;;
    dp1)
      timeout 150 $HL gate --preset cartpole --device cuda --epochs 3 --no-progress --no-baseline --out /tmp/r/dp1_one \
        > /tmp/r/dp1_one.log 2>&1; echo "one process rc=$? $(tail -n 1 /tmp/r/dp1_one.log)"
      timeout 240 $HL gate --nproc 1 --preset cartpole --device cuda --epochs 3 --no-progress --out /tmp/r/dp1_nccl \
        > /tmp/r/dp1_nccl.log 2>&1; echo "nproc 1 (NCCL) rc=$?"; grep -A 12 "^== hotloop gate --nproc" /tmp/r/dp1_nccl.log
      python3 -c "
import json
for run in ('dp1_one', 'dp1_nccl'):
    m = json.load(open(f'/tmp/r/{run}/guard.json'))['medians']
    keep = {k: round(v, 2) for k, v in m.items() if k in ('dur_us', 'gpu_kernel_us', 'gpu_busy_us', 'kernels')
            or 'nccl' in k.lower() or 'allreduce' in k.lower()}
    print(run, keep)" ;;
    dpscale)
      G=$(nvidia-smi -L | wc -l); A=(--preset cartpole --device cuda --no-progress); runs=()
      timeout 200 $HL train "${A[@]}" --epochs ${DP_EPOCHS:-4} --out /tmp/r/dps_one > /tmp/r/dps_one.log 2>&1
      echo "one process rc=$?"
      for n in 1 2 4 8; do
        ((n <= G)) || continue
        timeout 300 $HL train --nproc $n "${A[@]}" --epochs ${DP_EPOCHS:-4} --out /tmp/r/dps_$n > /tmp/r/dps_$n.log 2>&1
        echo "train --nproc $n rc=$?"; runs+=("$n=/tmp/r/dps_$n")
        if ((n > 1)); then
          timeout 300 $HL gate --nproc $n "${A[@]}" --epochs 3 --out /tmp/r/dpg_$n > /tmp/r/dpg_$n.log 2>&1
          echo "gate --nproc $n rc=$? $(tail -n 1 /tmp/r/dpg_$n.log)"; grep -A $((n + 1)) "^Per-rank table" /tmp/r/dpg_$n.log
        fi
      done
      PYTHONPATH=$LABPATH python3 -m lab.dp_scaling /tmp/r/dps_one "${runs[@]}" --csv /tmp/r/dp_scaling.csv ;;
    seedkill)
      # issue 37: kill -9 during a background checkpoint write at seed scale, then --resume: each epoch once
      R=/tmp/r/ssk; rm -rf $R
      $HL train --preset seed-scale --epochs 8 --set checkpoint_interval=1 --no-progress --out $R > /tmp/r/ssk.log 2>&1 & P=$!
      for _ in $(seq 2400); do [ -f $R/checkpoint.pt ] && ls $R/.checkpoint.pt.*.tmp >/dev/null 2>&1 && break; sleep 0.05; done
      kill -9 $P; wait $P 2>/dev/null; echo "killed during a write: $(ls -a $R | tr '\n' ' ')"
      timeout 240 $HL train --resume $R --no-progress > /tmp/r/ssk_resume.log 2>&1; echo "resume rc=$?"
      grep -E "^hotloop: (removed|.*resumed)" /tmp/r/ssk_resume.log | head -n 3
      python3 -c "import pandas as pd; e=pd.read_csv('$R/epochs.csv').epoch.tolist(); print('epochs', e, 'OK' if e == list(range(1, 9)) else 'BAD')"
      rm -f $R/checkpoint.pt ;;
    startup)
      # issue 37: where a run's start-up goes on this machine: are torch's and matplotlib's .pyc files there and
      # writable (a read-only site-packages without them compiles every module at every start), the import of
      # torch / hotloop.guards.run timed twice (the second with the .pyc the first wrote), with and without a
      # writable PYTHONPYCACHEPREFIX, then -X importtime of a one-epoch cartpole-fast run (top entries)
      tp=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")
      echo "torch at $tp: $(ls $tp/__pycache__ 2>/dev/null | wc -l) pyc in torch/__pycache__; $(touch $tp/.w 2>&1 && echo writable && rm $tp/.w)"
      echo "python3 $(command -v python3); PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}"
      for pre in "" /tmp/pyc; do
        for i in 1 2; do
          env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$pre python3 -c "import time; t = time.perf_counter(); import torch; a = time.perf_counter()
import hotloop.guards.run; b = time.perf_counter(); import matplotlib.figure; c = time.perf_counter()
print(f'prefix=${pre:-none} run $i: import torch {a - t:.2f} s, hotloop.guards.run {b - a:.2f} s, matplotlib {c - b:.2f} s')"
        done
      done
      python3 -X importtime -m hotloop.guards.cli train --preset cartpole-fast --epochs 1 --seed 1 --no-progress \
        --out /tmp/r/imp_run > /tmp/r/imp_run.log 2> /tmp/r/importtime.txt
      grep "hotloop: *\(run\|  the rest\)" /tmp/r/importtime.txt; grep "^import time" /tmp/r/importtime.txt | sort -t'|' -k2 -n | tail -n 12 ;;
    *) echo "unknown part $part" ;;
  esac
  if [[ -n ${bg:-} && $part == "${!#}" ]]; then wait "$bg"; fi  # the last part: wait for a background seed200
  echo "== part $part took $((SECONDS - t0)) s"
  # after every part, so that a call stopped by its time limit still returns what the finished parts wrote
  (cd /tmp/r && tar czf "$out/results.tgz.tmp" --exclude='*.qdstrm' --exclude='checkpoint.pt' --exclude='mutate/runs' . \
     && mv "$out/results.tgz.tmp" "$out/results.tgz")
  if [[ -n ${stop:-} ]]; then echo "stopped after part $part: the clean gate failed"; break; fi
done
