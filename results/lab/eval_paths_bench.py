"""The greedy evaluation's paths side by side on one trained policy: the captured CUDA graph of eager kernels and the
one-launch Triton kernel (kernels/greedy_eval.py) at each of its tilings.

`PYTHONPATH=results python -m lab.eval_paths_bench RUN_DIR [--repeats R] [--seed S] [--csv OUT.csv]`

RUN_DIR is a `hotloop train` run folder of the hotloop learner on CartPole (its best.pt: the best epoch's greedy
policy, whose episodes run long, as an evaluation late in training does; trainer/best_policy.py). The bench builds
the run's trainer on CUDA from best.pt's config, loads the policy and times, in turn for R rounds after one warm-up
round, each path's `returns(seed)` for the config's `eval_episodes` envs: `graph` (GreedyEvaluator with the fused
path off: chunks of captured steps, the capture in the warm-up) and `fused <tiles>` (greedy_eval at each of
CANDIDATES, into the fused evaluator's buffers; a tiling the GPU has too little shared memory for gets a row whose
`note` says so and no times). Each call is timed with CUDA events on the current stream
(device time from the first launch to the last; the graph path's host loop between chunks included). Every path's
returns must equal the graph's bit for bit (`equal` column); the table gives the median and min ms per
evaluation, the mean return and the steps of the longest episode (the fused kernel's loop length).

Prints a table; with --csv appends rows (commit, date, gpu, path, tiles, repeats, median_ms, min_ms,
mean_return, max_return, equal, note). Raises SystemExit naming the folder when it holds no best.pt, the run is not the
hotloop learner on CartPole, or no GPU is present. Issue 37 item 2; the prediction and outcome go to
results/h200/notes/bench_notes.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import statistics
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from hotloop.kernels.greedy_eval import EVAL_TILES, greedy_eval
from hotloop.profiles.provenance import commit_id, device_name
from hotloop.trainer.best_policy import BEST_FILE, load_best, read_best
from hotloop.trainer.config import Config
from hotloop.trainer.evaluation import GreedyEvaluator
from hotloop.trainer.loop import Trainer

COLUMNS = [
    "commit",
    "date",
    "gpu",
    "path",
    "tiles",
    "repeats",
    "median_ms",
    "min_ms",
    "mean_return",
    "max_return",
    "equal",
    "note",
]

CANDIDATES = (
    (64, 32, 16, 3),
    (64, 32, 16, 1),
    (64, 64, 64, 1),
    (128, 64, 64, 1),
    EVAL_TILES,
    (128, 128, 128, 1),
    (256, 128, 64, 1),
    (128, 256, 64, 1),
)
"""The tilings timed, (BLOCK_R, BLOCK_K, HEADS_BLOCK_K, num_stages): the first default (64, 32, 16) at Triton's
default 3 stages, then one-stage tilings from its tiles to wider ones, the default EVAL_TILES among them
(kernels/greedy_eval.py). On the H100 at 821918f (2026-12-06) 128x128x64 took 93 ms at
2 stages and 39 ms at 1: the pipeline's prefetch only adds latency to a chain of dependent dots."""


def _timed(fn) -> tuple[float, torch.Tensor]:
    """(device milliseconds of fn(), its returns cloned), CUDA events around the call on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), out.clone()


def paths(trainer: Trainer, seed: int) -> dict[str, callable]:
    """{name: a call returning the (N,) float64 returns of one evaluation of `seed`} for the graph path and each
    tiling of the fused kernel, on the trainer's evaluation envs and policy."""
    fused = trainer.evaluator
    if fused is None or not fused.fused:
        raise SystemExit("the run's evaluator has no fused path (the hotloop learner on CartPole, float32, on CUDA)")
    graph = GreedyEvaluator(fused.env, trainer.learner.greedy, fused=False)
    steps = fused.horizon

    def one(tiles):
        return lambda: greedy_eval(
            fused.net, fused.flat[1], fused.env.reset(seed=seed), steps, fused.total, fused.scratch, tiles=tiles
        )

    out = {"graph": lambda: graph.returns(seed)}
    for tiles in CANDIDATES:
        out["fused " + "x".join(map(str, tiles))] = one(tiles)
    return out


def bench(run_dir: Path, repeats: int, seed: int) -> list[dict]:
    """The table's rows (module docstring) for the policy in run_dir/best.pt."""
    best = run_dir / BEST_FILE
    meta = read_best(best)
    if meta is None:
        raise SystemExit(f"{run_dir}: no {BEST_FILE} (a hotloop train run folder with evaluation on)")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: this bench times the GPU paths")
    cfg = Config.from_dict({**meta["config"], "device": "cuda"})
    trainer = Trainer(cfg)
    load_best(trainer, best)
    calls = paths(trainer, seed)
    times = {name: [] for name in calls}
    results, notes = {}, {}
    for r in range(repeats + 1):  # round 0: warm-up (compilation, the graph's capture)
        for name, fn in calls.items():
            if name in notes:
                continue
            try:
                ms, got = _timed(fn)
            except OutOfResources as exc:  # raised at the first launch, before any work: the tiling does not fit
                notes[name] = str(exc).split(".")[0]
                continue
            if r:
                times[name].append(ms)
            results[name] = got
    ref = results["graph"]
    stamp = dict(commit=commit_id(), date=dt.date.today().isoformat(), gpu=device_name(torch.device("cuda")))
    rows = []
    for name, t in times.items():
        row = {**stamp, "path": name.split()[0], "tiles": name.split()[1] if " " in name else "", "repeats": repeats}
        if name in notes:
            rows.append({**row, "equal": "", "note": notes[name]})
            continue
        rows.append(
            {
                **row,
                "median_ms": round(statistics.median(t), 3),
                "min_ms": round(min(t), 3),
                "mean_return": round(float(results[name].mean()), 2),
                "max_return": int(results[name].max()),
                "equal": bool(torch.equal(results[name], ref)),
                "note": "",
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--csv", type=Path)
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {a.repeats}")
    rows = bench(a.run_dir, a.repeats, a.seed)
    for row in rows:
        print("  ".join(f"{k}={row.get(k, '')}" for k in COLUMNS[3:]))
    if a.csv:
        new = not a.csv.exists()
        with a.csv.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
            if new:
                w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
