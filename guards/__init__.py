"""hotloop.guards: the harness that keeps the hot loop fast. sync_hooks (host-sync hooks), criteria (the criteria
table, docs/criteria.md), step_metrics and guard (per-step metrics from a profiler trace and their verdicts),
baselines (noise-aware regression compare; the per-GPU baseline files of `hotloop gate` are package data,
baseline_files/), watchdog (hang watchdog), pytest_plugin (`pytest -m perf`).

Layer: these import hotloop.profiles only. The composition modules — gate (`hotloop gate`), run (one training
run under the watchdog), bench (`hotloop bench`), faults (the gate's injected faults), mutate (`hotloop mutate`), learning_report (`hotloop
learning`) and cli (the `hotloop` command) — join the guards with hotloop.trainer and hotloop.kernels; no other module of the package imports the
trainer (tests/test_layout.py)."""
