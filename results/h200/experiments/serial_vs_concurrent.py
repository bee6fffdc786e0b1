"""Last run at 6b5d9f3 (2026-11-30); it reaches into private members (HotLearner._body): a record tied to that commit, not kept working against later code.

The seed-scale step at 6b5d9f3 captured twice over the same buffers: as the trainer runs it (two streams) and
serial (the side stream dropped: every kernel alone on the GPU, so its time is its isolated time). Back-to-back
replay time of each, and each kernel's median time in both (Kineto, 10 replays).
Usage (repo root on the H200): python3 results/h200/experiments/serial_vs_concurrent.py OUT.csv"""
import sys

import pandas as pd
import torch

from hotloop.profiles.kineto_reader import read_kineto
from hotloop.trainer.config import preset
from hotloop.guards.probes.bench_variants import build_hotloop_variant
from hotloop.trainer.step import HotLearner

cfg = preset("seed-scale")
dev = torch.device("cuda")
v = build_hotloop_variant(cfg, dev)
L: HotLearner = v.step.__self__


def capture():
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            L._body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        L._body()
    return g


graphs = {"concurrent": capture()}
L.side = None
graphs["serial"] = capture()
per_step, kernels = {}, []
for name, g in graphs.items():
    for _ in range(20):
        g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(300):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    per_step[name] = e0.elapsed_time(e1) * 1000 / 300
    path = f"/tmp/trace_{name}.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    k = read_kineto(path)
    k = k[k.kind == "kernel"]
    k = k.assign(grid=k.grid_x.astype(str) + "," + k.grid_y.astype(str) + "," + k.grid_z.astype(str))
    t = k.groupby(["name", "grid"]).dur_us.agg(["count", "median"]).reset_index()
    t["variant"] = name
    kernels.append(t)
table = pd.concat(kernels).pivot_table(index=["name", "grid"], columns="variant", values="median").reset_index()
table["name"] = table["name"].str.slice(0, 40)
table = table.sort_values("serial", ascending=False)
pd.set_option("display.width", 200)
print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
print({k: round(v, 1) for k, v in per_step.items()}, "sum of serial kernel medians",
      round(float(table["serial"].sum()), 1))
table.to_csv(sys.argv[1], index=False)
