"""Last run on the trees of 65a7a86..8a10f9a (branch wip/dw1-in-dx2, 2026-11-30); public API only (a record of
that run: ab/dw1_in_dx2/ktimes_*.txt).

Per-kernel mean time of a Kineto trace (one step's worth per (name, grid, stream)), then one step's timeline.
Usage: python kernel_times.py TRACE.json.gz (the device run: ../device/ab_branch_commits.sh, as ktimes.py)."""
import sys
from hotloop.profiles.kineto_reader import read_kineto
import pandas as pd
df = read_kineto(sys.argv[1])
k = df[df.kind == 'kernel'].copy()
# one step's worth: per (name, grid) mean duration and count
g = k.groupby(['name','grid_x','grid_y','grid_z','stream']).dur_us.agg(['count','mean']).reset_index().sort_values('mean', ascending=False)
pd.set_option('display.width', 250); pd.set_option('display.max_colwidth', 60)
print(g.head(40).to_string())
# a timeline of one step: pick the middle step of kernels in graph
k = k.sort_values('start_us')
bw = k[k.name.str.startswith('_tree_update')]
if len(bw) > 3:
    t_end = bw.start_us.iloc[len(bw)//2] + bw.dur_us.iloc[len(bw)//2]
    prev = bw.start_us.iloc[len(bw)//2 - 1] + bw.dur_us.iloc[len(bw)//2 - 1]
    step = k[(k.start_us > prev) & (k.start_us < t_end)]
    t0 = step.start_us.min()
    for r in step.itertuples():
        print(f"{r.start_us - t0:8.1f} {r.start_us - t0 + r.dur_us:8.1f} {r.dur_us:7.1f} s{r.stream} {r.name[:42]:42s} ({r.grid_x},{r.grid_y},{r.grid_z})")
    print("step span", step.start_us.max() + step.dur_us.iloc[-1] - t0)
