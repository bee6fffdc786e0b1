"""Kernel benchmark: each hotloop kernel vs its plain-torch reference at seed scale, timed with CUDA events.

Usage (from the checkout root; lab code, not shipped): `PYTHONPATH=results python -m lab.kernel_bench [--out
results/h200/kernels/kernel_bench.csv] [--reps 20] [--calls 50]`. results/lab/kernel_bench_inputs.py's `PAIRS` give, per
kernel module, (name, kernel, reference) zero-argument closures. Every closure is timed two ways:
`eager` (`calls` back-to-back launches between two CUDA events: includes launch overhead) and `graph` (the same
`calls` captured once in a CUDA graph and replayed: GPU time as the hot loop will see it; NaN when the closure
cannot be captured). Each way is repeated `reps` times; the table reports p20/p50/p80 of microseconds per call.
Output: long-format CSV (kernel, provider, mode, metric, unit, p20, p50, p80, gpu, commit, date), as
in Triton's `python/tutorials/05-layer-norm.py` and Liger-Kernel's `benchmark/scripts/utils.py`, and the same
table printed.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from hotloop.profiles.provenance import commit_id
from lab.kernel_bench_inputs import PAIRS


def _time_eager(fn, calls: int, reps: int) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / calls)
    return out


def time_graph(fn, calls: int, reps: int) -> list[float]:
    """Microseconds per call of `fn` (a launch of CUDA work, no host sync) replayed from one CUDA graph that holds
    `calls` calls: one value per replay, `reps` replays timed with CUDA events on the current device. `fn` runs once
    on a side stream first (warm-up, as graph capture requires) and the graph is replayed once untimed; a function
    that cannot be captured gives `reps` NaNs. Used by this module's kernel bench and by the isolated sweeps in
    results/h200/experiments/."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up on a side stream, as graph capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return [float("nan")] * reps
    graph.replay()  # untimed: the first replay also uploads the graph
    return [t / calls for t in _time_eager(graph.replay, 1, reps)]


def run(reps: int, calls: int) -> pd.DataFrame:
    """Time every (kernel, reference) pair on the current CUDA device; returns the long-format table."""
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name(device)
    commit = commit_id()
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    rows = []
    for pairs in PAIRS.values():
        for name, kernel, reference in pairs(device):
            for provider, fn in (("hotloop", kernel), ("reference", reference)):
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                for mode, timer in (("eager", _time_eager), ("graph", time_graph)):
                    q = pd.Series(timer(fn, calls, reps)).quantile([0.2, 0.5, 0.8]).tolist()
                    rows.append(
                        dict(
                            kernel=name,
                            provider=provider,
                            mode=mode,
                            metric="time_per_call",
                            unit="us",
                            p20=q[0],
                            p50=q[1],
                            p80=q[2],
                            gpu=gpu,
                            commit=commit or "unknown",
                            date=date,
                        )
                    )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="PYTHONPATH=results python -m lab.kernel_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, help="CSV path (a .md beside it gets the same table)")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per provider and mode")
    parser.add_argument("--calls", type=int, default=50, help="calls per timed repetition")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("lab.kernel_bench: needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    df = run(args.reps, args.calls)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out, index=False)
        args.out.with_suffix(".md").write_text(df.to_markdown(index=False, floatfmt=".2f") + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
