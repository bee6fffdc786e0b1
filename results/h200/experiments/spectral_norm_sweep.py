"""Last run at bcbf331 (2026-11-30); public API only; edited after the run (775daae, 3e5344f: timed through kernel_bench.time_graph, `committed` marks the current default), not re-run.

The fused spectral norm's slab split (hotloop.kernels.spectral_norm SpectralNormTable.from_shapes min_slabs, tile) at the
seed-scale weight shapes, isolated: one power iteration, the launch replayed 20 times in a CUDA graph, median of 7
replays; sigma checked against the first split's; `committed` marks the table's default split. Usage:
python spectral_norm_sweep.py OUT.csv (on a CUDA machine, hotloop importable)."""
import inspect
import itertools
import statistics
import sys

import pandas as pd
import torch

from lab.kernel_bench import time_graph
from hotloop.kernels.spectral_norm import SEED_SHAPES, SpectralNormTable, spectral_norm_

dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
numel = sum(r * c for r, c in SEED_SHAPES)
start = torch.randn(numel, generator=g).to(dev) * 0.05


defaults = inspect.signature(SpectralNormTable.from_shapes).parameters
committed = (defaults["min_slabs"].default, defaults["tile"].default)
rows, want = [], None
for min_slabs, tile in itertools.product((16, 33, 66, 132, 264), (2048, 4096, 8192)):
    table = SpectralNormTable.from_shapes(SEED_SHAPES, dev, min_slabs=min_slabs, tile=tile)
    u, v = table.new_vectors(torch.Generator().manual_seed(1))
    params = start.clone()
    sigma = spectral_norm_(params, table, u, v, 1).clone()
    want = sigma if want is None else want
    us = statistics.median(time_graph(lambda: spectral_norm_(params, table, u, v, 1), 20, 7))
    rows.append(dict(min_slabs=min_slabs, tile=tile, slabs=table.n_slabs, block_rows=table.block_rows,
                     block_cols=table.block_cols, us=us, sigma_max_rel_diff=float(((sigma - want) / want).abs().max()),
                     committed=(min_slabs, tile) == committed))
table = pd.DataFrame(rows).sort_values("us")
print(table.to_string(index=False))
table.to_csv(sys.argv[1], index=False)
