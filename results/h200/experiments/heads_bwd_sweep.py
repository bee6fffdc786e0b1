"""Last run at 28d1c2a (2026-11-30); public names only (it sets hotloop.kernels.heads' launch constants); edited after the run (775daae: timed through kernel_bench.time_graph), not re-run.

The heads' backward launch (hotloop.kernels.heads BWD_PROGRAMS, BWD_BLOCK_M, BWD_WARPS) swept at the seed-scale shape,
isolated: each config's launch replayed 20 times in a CUDA graph, median of 7 replays; dh checked against the
committed config's. Usage: python heads_bwd_sweep.py OUT.csv (on a CUDA machine, hotloop importable)."""
import itertools
import statistics
import sys

import pandas as pd
import torch

from lab.kernel_bench import time_graph
import hotloop.kernels.heads as H

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
m, d, a, hid = 8192, 3, 4, 80
h = torch.relu(torch.randn(m, (1 + d) * hid, device=dev, generator=g))
dq = torch.randn(m, d * a, device=dev, generator=g) / m
w = torch.randn(1 + d * a, hid, device=dev, generator=g) / hid ** 0.5
gain = torch.rand(1 + d, device=dev, generator=g) + 0.5
dh, dht = torch.empty_like(h), torch.empty(h.shape[1], m, device=dev)
grads = [torch.zeros(n, device=dev) for n in ((1 + d) * hid, (1 + d * a) * hid, 1 + d * a, 1 + d)]


def launch():
    H.heads_backward(h, dq, w, gain, dh, dht, grads[0], grads[1].view(1 + d * a, hid), grads[2], grads[3], d)


committed = (H.BWD_PROGRAMS, H.BWD_BLOCK_M, H.BWD_WARPS)
launch()
want = dh.clone()
rows = []
for programs, block_m, warps in itertools.product((132, 264, 528, 1056), (32, 64), (4, 8)):
    H.BWD_PROGRAMS, H.BWD_BLOCK_M, H.BWD_WARPS = programs, block_m, warps
    dh.fill_(float("nan"))
    try:
        launch()
        torch.cuda.synchronize()
        err = float((dh - want).abs().max())
        us = statistics.median(time_graph(launch, 20, 7))
    except Exception as e:  # noqa: BLE001  (a config that does not compile is a row, not an abort)
        err, us = float("nan"), float("nan")
        print(f"{programs} {block_m} {warps}: {type(e).__name__}: {e}"[:200])
    rows.append(dict(programs=programs, block_m=block_m, warps=warps, us=us, max_abs_diff=err,
                     committed=(programs, block_m, warps) == committed))
table = pd.DataFrame(rows).sort_values("us")
print(table.to_string(index=False))
table.to_csv(sys.argv[1], index=False)
