#!/usr/bin/env bash
# ci/gate.sh -- the one command a self-hosted GPU runner runs for hotloop's CI gate (see ci/README.md).
#
#   bash ci/gate.sh                              # on an H100/H200 runner
#   HOTLOOP_DEVICE=cpu bash ci/gate.sh           # a dry run on a machine without a GPU
#
# Steps (each later step runs even when an earlier one failed, except that nothing runs after a failed setup):
#   1. setup   $HOTLOOP_PYTHON -m pip install -e ".[dev,gym]" with a constraints file pinning torch to the
#              version already installed, so the runner's CUDA build of torch is never replaced  (setup.log)
#   2. pytest  $HOTLOOP_PYTHON -m pytest -m "smoke or perf" -ra --junitxml=<run>/junit.xml  (pytest.log)
#   3. gate    hotloop gate --preset P [--epochs N] --device D --out <run>/gate --no-progress
#              [--baseline guards/baseline_files/<gpu-name-slug>[--<preset>].json]              (gate.log)
#              (the cartpole preset's file has no --<preset> part: hotloop.guards.baselines.baseline_path)
#              A missing baseline file stops the gate with exit 2 (bad input; ci/README.md: add one). The slug
#              is the first line of `nvidia-smi --query-gpu=name --format=csv,noheader`, lowercased, each run
#              of non-alphanumerics turned into one '-' ("NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3);
#              "cpu" when HOTLOOP_DEVICE=cpu, and then no --baseline unless HOTLOOP_BASELINE is set.
#              `hotloop gate` exits 0 pass, 1 a criterion or regression failed, 2 bad usage or input, 3 hang,
#              70 internal error (an unexpected exception: one line in gate.log, the traceback in
#              <run>/gate/error.log); any other code (a signal: 137 OOM-killed, 139 segfault) is a crash too.
#   4. report  ci/report.py writes <run>/summary.md (status, steps, failing rows, the criteria table from
#              criteria.md, the per-epoch table from epochs.md), appends it to $GITHUB_STEP_SUMMARY when that is
#              set, and prints the failing rows LAST: pytest's FAILED/ERROR lines, the gate's error, crash or
#              hang line, then the criteria.csv rows whose verdict is FAIL.
# The run folder keeps everything for upload: summary.md, junit.xml, setup.log, pytest.log, gate.log, and gate/,
# the gate's own run folder (config.json, epochs.csv/.md, criteria.csv/.md/.json, error.log after a crash, ...).
#
# Environment (all optional):
#   HOTLOOP_PRESET=cartpole   the gate's preset
#   HOTLOOP_EPOCHS=           the gate's epochs (default: the preset's)
#   HOTLOOP_DEVICE=cuda       cuda, cuda:N or cpu (cpu: dry run without a GPU)
#   HOTLOOP_RUN_DIR=          run folder, new or empty (default runs/ci-<UTC timestamp> in the checkout; a
#                             relative path is taken from the directory the script was started in)
#   HOTLOOP_SKIP_INSTALL=1    skip step 1 (the environment is set up already)
#   HOTLOOP_PYTHON=python3    the interpreter (e.g. a venv's python where the system one is externally managed)
#   HOTLOOP_PYTEST_ARGS=      more pytest arguments, shell-quoted, after -m "smoke or perf" (a later -m wins,
#                             paths narrow the run), e.g. '-m smoke tests/trainer/test_config.py'
#   HOTLOOP_GATE_ARGS=        more `hotloop gate` arguments, shell-quoted, e.g. '--epoch-timeout 600 --set seed=2'
#   HOTLOOP_BASELINE=         the baseline path (default guards/baseline_files/<gpu-name-slug>[--<preset>].json)
#   HOTLOOP_COMMIT=           the commit named in the summary when GITHUB_SHA is not set (default: git rev-parse
#                             HEAD; set it where the checkout's .git is not the tested tree's)
#   HOTLOOP_CLI=              the command that runs the hotloop CLI, shell-quoted (default:
#                             "$HOTLOOP_PYTHON -m hotloop.guards.cli", i.e. `hotloop` from this checkout; tests use a stub)
#
# Exit code, decided at the end from every step's exit code (the highest applies):
#   0  setup ok or skipped, every selected test passed, the gate passed, no FAIL row anywhere
#   1  a test failed (pytest 1/2/3), a criterion or regression failed (gate 1), or a FAIL row was found
#      although the gate exited 0
#   2  bad usage or input: gate 2, pytest 4 (usage) or 5 (no test selected), a bad HOTLOOP_* value, or a run
#      folder that is not empty
#   3  hang: the gate's watchdog stopped an epoch (gate 3)
#   4  setup failed (pip, or no importable torch); pytest and the gate are not run
#   5  the gate crashed: an internal error (gate 70: "the gate crashed: internal error, see <run>/gate/error.log")
#      or any other gate exit code (killed by a signal, ...); never reported as a criterion or regression failure
set -euo pipefail

invoke_dir=$PWD
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

PY=${HOTLOOP_PYTHON:-python3}
preset=${HOTLOOP_PRESET:-cartpole}
epochs=${HOTLOOP_EPOCHS:-}
device=${HOTLOOP_DEVICE:-cuda}

say() { printf 'ci/gate.sh: %s\n' "$*"; }
usage_error() { printf 'ci/gate.sh: error: %s\n' "$*" >&2; exit 2; }

# Split a shell-quoted string into the array named $1 (python's shlex: quotes work, nothing is evaluated).
split_args() {
  local -n _dest=$1
  local tmp
  tmp=$(mktemp)
  if ! "$PY" -c 'import shlex, sys
words = shlex.split(sys.argv[1])
sys.stdout.write("".join(w + "\0" for w in words))' "$2" >"$tmp"; then
    rm -f "$tmp"
    usage_error "cannot split $3=$2 into arguments (unbalanced quotes?)"
  fi
  mapfile -d '' -t _dest <"$tmp"
  rm -f "$tmp"
}

command -v "$PY" >/dev/null 2>&1 || usage_error "HOTLOOP_PYTHON=$PY: no such command"
pytest_extra=() gate_extra=() cli=()
split_args pytest_extra "${HOTLOOP_PYTEST_ARGS:-}" HOTLOOP_PYTEST_ARGS
split_args gate_extra "${HOTLOOP_GATE_ARGS:-}" HOTLOOP_GATE_ARGS
if [[ -n ${HOTLOOP_CLI:-} ]]; then
  split_args cli "$HOTLOOP_CLI" HOTLOOP_CLI
else
  cli=("$PY" -m hotloop.guards.cli)
fi
hotloop() { "${cli[@]}" "$@"; }

# --- the run folder: new or empty, never reused (stale criteria.csv or junit.xml would be misread) ---------------
if [[ -n ${HOTLOOP_RUN_DIR:-} ]]; then
  run=$HOTLOOP_RUN_DIR
  [[ $run = /* ]] || run=$invoke_dir/$run
  if [[ -e $run && ! -d $run ]]; then usage_error "HOTLOOP_RUN_DIR=$run exists and is not a folder"; fi
  if [[ -d $run && -n $(ls -A "$run") ]]; then
    usage_error "HOTLOOP_RUN_DIR=$run is not empty; give each run a new folder"
  fi
  mkdir -p "$run"
else
  mkdir -p runs
  base=runs/ci-$(date -u +%Y%m%dT%H%M%SZ)
  run=$base n=1
  until mkdir "$run" 2>/dev/null; do
    n=$((n + 1)) run=$base-$n
    ((n < 100)) || usage_error "cannot create a run folder $base-N under runs"
  done
fi
run=$(cd "$run" && pwd)

# --- from here on every exit goes through finish(), which writes the summary ------------------------------------
setup_rc=skipped pytest_rc="not run" gate_rc="not run"
info=()
finished=0 current_step=""

finish() {
  local code=$1
  finished=1
  set +e
  local step_summary=()
  [[ -n ${GITHUB_STEP_SUMMARY:-} ]] && step_summary=(--step-summary "$GITHUB_STEP_SUMMARY")
  local info_args=() item
  for item in "${info[@]}"; do info_args+=(--info "$item"); done
  "$PY" "$repo/ci/report.py" --run-dir "$run" --exit-code "$code" "${step_summary[@]}" "${info_args[@]}" \
    --step "setup=$setup_rc" --step "pytest=$pytest_rc" --step "gate=$gate_rc"
  local report_rc=$?
  if [[ $report_rc -eq 3 ]]; then
    code=1  # the report found a failing row that no exit code showed
  elif [[ $report_rc -ne 0 ]]; then
    say "ci/report.py failed (exit $report_rc): no summary; raw failing rows follow"
    grep -hE '^(FAILED|ERROR) ' "$run/pytest.log" 2>/dev/null
    grep -hE '(^|,)FAIL(,|$)' "$run/gate/criteria.csv" 2>/dev/null
    [[ $code -ne 0 ]] || code=1
  fi
  exit "$code"
}
# An unexpected error (set -e) or a signal still leaves a summary behind.
# shellcheck disable=SC2317  # invoked by the EXIT trap
on_exit() {
  local rc=$?
  if [[ $finished -eq 0 ]]; then
    info+=("stopped early=ci/gate.sh stopped before its end (exit $rc)")
    case $current_step in
      setup) setup_rc=interrupted ;;
      pytest) pytest_rc=interrupted ;;
      gate) gate_rc=interrupted ;;
    esac
    [[ $rc -ne 0 ]] || rc=1
    finish "$rc"
  fi
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Run "$@" with stdout+stderr to the console and to $run/$1.log; sets step_rc (never trips set -e).
step_rc=0
run_logged() {
  local log=$run/$1.log
  current_step=$1
  shift
  { printf '+'; printf ' %q' "$@"; printf '\n'; } | tee "$log"
  set +e
  "$@" 2>&1 | tee -a "$log"
  step_rc=${PIPESTATUS[0]}
  current_step=""
  set -e
}

# --- what ran, where ---------------------------------------------------------------------------------------------
commit=${GITHUB_SHA:-${HOTLOOP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}}
info+=("commit=${commit:0:12}")
gpu_name=""
if [[ $device == cpu ]]; then
  gpu_name=cpu
else
  if command -v nvidia-smi >/dev/null 2>&1; then
    smi_id=()
    if [[ $device =~ ^cuda:([0-9]+)$ ]]; then smi_id=("--id=${BASH_REMATCH[1]}"); fi
    # The first line, taken in bash: `nvidia-smi | head -n 1` can kill nvidia-smi with SIGPIPE on a machine with
    # several GPUs, and under pipefail that lost the name (a race: the baseline became unknown-gpu.json).
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader "${smi_id[@]}" 2>/dev/null) || gpu_name=""
    gpu_name=${gpu_name%%$'\n'*}
    gpu_info=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader "${smi_id[@]}" \
               2>/dev/null) || gpu_info=""
    gpu_info=${gpu_info%%$'\n'*}
    info+=("GPU=${gpu_info:-$gpu_name}")
  fi
  if [[ -z $gpu_name ]]; then
    gpu_name=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null) || gpu_name=""
    say "warning: nvidia-smi gave no GPU name; torch says '${gpu_name:-nothing}'"
    info+=("GPU=${gpu_name:-unknown}")
  fi
fi
slug=$(printf '%s' "$gpu_name" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')
slug=${slug:-unknown-gpu}
# one baseline per preset, named as hotloop.guards.baselines.baseline_path names it
suffix=""
[[ $preset == cartpole ]] || suffix=--$preset
baseline=${HOTLOOP_BASELINE:-guards/baseline_files/$slug$suffix.json}
torch_info=$("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda or "none")' 2>/dev/null) \
  || torch_info="not importable"
info+=("torch=$torch_info" "python=$("$PY" -c 'import sys; print(sys.version.split()[0])')")
info+=("preset / epochs / device=$preset / ${epochs:-preset default} / $device" "run folder=$run")
say "run folder $run; device $device; GPU slug $slug; torch $torch_info"

# --- 1. setup ----------------------------------------------------------------------------------------------------
if [[ ${HOTLOOP_SKIP_INSTALL:-0} == 1 ]]; then
  say "setup skipped (HOTLOOP_SKIP_INSTALL=1)"
else
  torch_version=$("$PY" -c 'import torch; print(torch.__version__)' 2>"$run/setup.log") || torch_version=""
  if [[ -z $torch_version ]]; then
    { echo "no importable torch in $PY: install the CUDA build of torch (>= 2.11) first; ci/gate.sh never"
      echo "installs torch, so that a runner's CUDA build is not replaced"; } | tee -a "$run/setup.log"
    setup_rc=4
    finish 4
  fi
  printf 'torch==%s\n' "$torch_version" >"$run/constraints.txt"
  run_logged setup "$PY" -m pip install --progress-bar off -e ".[dev,gym]" -c "$run/constraints.txt"
  setup_rc=$step_rc
  if [[ $setup_rc -ne 0 ]]; then
    finish 4
  fi
fi

# --- 2. pytest ---------------------------------------------------------------------------------------------------
# COLUMNS: pytest cuts its short-summary lines to the terminal width (80 off a terminal, unless CI is set).
run_logged pytest env COLUMNS="${COLUMNS:-200}" "$PY" -m pytest -m "smoke or perf" -ra --junitxml="$run/junit.xml" \
  "${pytest_extra[@]}"
pytest_rc=$step_rc

# --- 3. hotloop gate ---------------------------------------------------------------------------------------------
gate_args=(gate --preset "$preset" --device "$device" --out "$run/gate" --no-progress)
[[ -z $epochs ]] || gate_args+=(--epochs "$epochs")
if [[ $device == cpu && -z ${HOTLOOP_BASELINE:-} ]]; then
  info+=("baseline=none (a CPU dry run compares against no baseline unless HOTLOOP_BASELINE names one)")
else
  [[ -f $baseline ]] || say "warning: baseline $baseline does not exist: the gate stops with exit 2 (ci/README.md)"
  gate_args+=(--baseline "$baseline")
  info+=("baseline=$baseline")
fi
run_logged gate hotloop "${gate_args[@]}" "${gate_extra[@]}"
gate_rc=$step_rc

# --- 4. decide, report, exit -------------------------------------------------------------------------------------
code=0
case $pytest_rc in
  0) ;;
  4 | 5) code=2 ;;
  *) code=1 ;;
esac
case $gate_rc in
  0) ;;
  1) if ((code < 1)); then code=1; fi ;;
  2 | 3) if ((gate_rc > code)); then code=$gate_rc; fi ;;
  70)
    say "the gate crashed: internal error, see $run/gate/error.log"
    code=5 ;;
  *)
    say "the gate crashed: exit $gate_rc (killed by a signal or an unexpected exit), see $run/gate.log"
    code=5 ;;
esac
finish "$code"
