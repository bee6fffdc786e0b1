"""hotloop.guards: the harness that keeps the hot loop fast, and the `hotloop` command. Four layers, told apart by
folder and by one known set of modules (tests/test_layout.py checks them):

- guards/commands/ (hotloop.guards.commands) is the application layer: the `hotloop` command, one module per
  subcommand, each a thin parse -> call of a library function with a typed options object. It may import every
  hotloop package; nothing outside it imports it but cli, the command's stable name (the console script and
  `python -m hotloop.guards.cli`), which only re-exports its main.
- The composition modules — gate (`hotloop gate`), run (one training run under the watchdog), faults (the gate's
  injected faults), mutate (`hotloop mutate`'s suite), learning_report (`hotloop learning`'s runs) and
  data_parallel (`hotloop train --nproc N`'s torchrun launch and ranks) — are the layer between: they join the
  harness library with hotloop.trainer, hotloop.kernels and the probes, and may import every package but the
  commands.
- guards/probes/ (hotloop.guards.probes) holds the probes and benches: the precision probe (the gate's evidence for
  "TF32 forward only"), the learner-step variants and `hotloop bench`'s library. They may import the trainer, the
  kernels, hotloop.profiles and the harness library; nothing below them imports them.
- guards/*.py, the others, are the harness library: sync_hooks (host-sync hooks), criteria (the criteria table,
  docs/criteria.md), step_metrics and guard (per-step metrics from a profiler trace and their verdicts), baselines
  (noise-aware regression compare; the per-GPU baseline files of `hotloop gate` are package data,
  baseline_files/), loop_syncs and loop_structure (the censuses of the epochs' loop), watchdog (hang watchdog),
  pytest_plugin (`pytest -m perf`). They import hotloop.guards' library and hotloop.profiles only: no trainer, no
  kernels, no probes, no composition module, no command."""
