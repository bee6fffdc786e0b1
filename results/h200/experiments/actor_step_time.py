"""Experiment (H200): the actor's env step, fused vs reference, beside the learner step and the whole iteration.

For each preset: a Trainer on CUDA, prefilled and warmed up (both graphs captured), then, interleaved in rounds,
the median wall time per call (CUDA events around ROUNDS x REPS calls) of
  - `actor_fused`: `Trainer.env_step()` with the fused actor (kernels/actor_step.py; its graph replayed);
  - `actor_reference`: the same on a second trainer whose actor runs `reference_step` (stock torch ops, captured);
  - `learner`: `HotLearner.step()` (its graph);
  - `iteration`: `Trainer.iterate(1)` (actor + learner + periodic work), fused actor; the same with the reference
    actor (`iteration_reference_actor`) and with the fused actor inside the learner's graph
    (`iteration_actor_in_step`, Config.actor_in_step);
and the kernels and grid-(1,1,1) kernels one actor step launches (torch.profiler over 10 replays).
Usage: python3 results/h200/experiments/actor_step_time.py [OUT_CSV]
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer

ROUNDS, REPS = 5, 100


def _timed(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _kernels(fn, calls: int = 10) -> tuple[float, float]:
    """(kernels, grid-(1,1,1) kernels) per call, from the Kineto trace of `calls` calls."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    grid1 = [e for e in kernels if e.get("args", {}).get("grid") == [1, 1, 1]]
    return len(kernels) / calls, len(grid1) / calls


def _trainer(name: str, fused: bool, in_step: bool = False) -> Trainer:
    tr = Trainer(preset(name, device="cuda", eval_episodes=0, actor_in_step=in_step))
    if not fused:
        tr.actor.fused = None
    tr.prefill()
    tr.iterate(3)
    torch.cuda.synchronize()
    return tr


def main(out: str | None) -> None:
    rows = []
    for name in ("cartpole", "seed-scale"):
        fused, ref, inside = _trainer(name, True), _trainer(name, False), _trainer(name, True, True)
        fns = {"actor_fused": fused.env_step, "actor_reference": ref.env_step, "learner": fused.learner.step,
               "iteration": lambda: fused.iterate(1), "iteration_reference_actor": lambda: ref.iterate(1),
               "iteration_actor_in_step": lambda: inside.iterate(1)}
        times = {k: [] for k in fns}
        for _ in range(ROUNDS):
            for k, fn in fns.items():
                times[k].append(_timed(fn, REPS))
        for k, fn in fns.items():
            ts = sorted(times[k])
            kernels, grid1 = _kernels(fn)
            rows.append(dict(preset=name, what=k, us_p50=ts[len(ts) // 2], us_min=ts[0], us_max=ts[-1],
                             kernels_per_call=kernels, grid1_per_call=grid1))
        del fused, ref, inside
        torch.cuda.empty_cache()
    import pandas as pd

    df = pd.DataFrame(rows)
    print(df.to_string(index=False))
    if out:
        df.to_csv(out, index=False)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
