"""The fused spectral norm's slab split (kernels.spectral_norm SpectralNormTable.from_shapes min_slabs, tile) at the
seed-scale weight shapes, isolated: one power iteration, the launch replayed 20 times in a CUDA graph, median of 7
replays; sigma checked against the committed split's. Usage: python spectral_norm_sweep.py OUT.csv (on a CUDA
machine, repo root on PYTHONPATH)."""
import itertools
import sys

import pandas as pd
import torch

from kernels.spectral_norm import SEED_SHAPES, SpectralNormTable, spectral_norm_

dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
numel = sum(r * c for r, c in SEED_SHAPES)
start = torch.randn(numel, generator=g).to(dev) * 0.05


def graph_us(launch, reps=20, rounds=7):
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            launch()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1000 / reps)
    return sorted(times)[len(times) // 2]


rows, want = [], None
for min_slabs, tile in itertools.product((16, 33, 66, 132, 264), (2048, 4096, 8192)):
    table = SpectralNormTable.from_shapes(SEED_SHAPES, dev, min_slabs=min_slabs, tile=tile)
    u, v = table.new_vectors(torch.Generator().manual_seed(1))
    params = start.clone()
    sigma = spectral_norm_(params, table, u, v, 1).clone()
    want = sigma if want is None else want
    us = graph_us(lambda: spectral_norm_(params, table, u, v, 1))
    rows.append(dict(min_slabs=min_slabs, tile=tile, slabs=table.n_slabs, block_rows=table.block_rows,
                     block_cols=table.block_cols, us=us, sigma_max_rel_diff=float(((sigma - want) / want).abs().max()),
                     committed=(min_slabs, tile) == (132, 4096)))
table = pd.DataFrame(rows).sort_values("us")
print(table.to_string(index=False))
table.to_csv(sys.argv[1], index=False)
