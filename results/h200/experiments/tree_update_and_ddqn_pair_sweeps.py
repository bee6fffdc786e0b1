"""Last run at 3c25af2 (2026-11-30); it reaches into private members (private kernels of hotloop.kernels.segment_tree and of hotloop.kernels.linear_pair, a module dropped in ae17f01): a record tied to that commit, not kept working against later code.

Sweeps: the tree update's TOP levels (hierarchical top sums), the fused DDQN L1+L2 kernel vs two launches."""
import sys, torch, triton
import pandas as pd
from hotloop.trainer.config import preset
from hotloop.guards.probes.bench_variants import build_hotloop_variant
import hotloop.kernels.segment_tree as S
import hotloop.kernels.linear_pair as P
from hotloop.kernels.linear import linear_forward

cfg = preset("seed-scale")
dev = torch.device("cuda")
v = build_hotloop_variant(cfg, dev)
L = v.step.__self__
rp = L.replay
for _ in range(5):
    v.step()
torch.cuda.synchronize()


def graph_time(fn, reps=20, rounds=7):
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000 / reps)
    return sorted(ts)[len(ts) // 2]


nodes, cap, idx = rp.tree.nodes, rp.capacity, L.idx
_, depth = S._check_nodes(nodes, cap)
vals = [L.td.priorities.clone(), L.td.priorities.clone() * 1.5 + 0.01]
rows = []
for top in (4, 5, 6, 7, 8):
    for blk, w in ((32, 1), (64, 2), (128, 4), (64, 1)):
        state = [0]
        def f():
            state[0] ^= 1
            S._tree_update_kernel[(triton.cdiv(idx.numel(), blk),)](
                nodes, idx, vals[state[0]], idx.numel(), cap, nodes, 0, 0, rp.tree.max_value,
                rp.tree.bad_priority_count, DEPTH=depth, INSERT=False, START_ON_DEVICE=False, TOP=top, BLOCK=blk,
                num_warps=w)
        rows.append(dict(top=top, block=blk, warps=w, us=graph_time(f)))
ts = pd.DataFrame(rows)
ts.to_csv("/tmp/r/tree_sweep2.csv", index=False)
print("tree update sweep (hierarchical top sums)")
print(ts.sort_values("us").to_string())
# exactness after all those updates: every internal node vs the sum of its children
torch.cuda.synchronize()
n = nodes.double()
P2 = nodes.numel() // 2
err = ((n[1:P2] - (n[2:2 * P2:2] + n[3:2 * P2:2])).abs().max() / n[1]).item()
print("max |node - children| / root after the sweep:", err)

# fused DDQN L1+L2 vs two launches
lay = L.layout
l0, l1 = lay.layers[0], lay.layers[1]
w1, b1, g1 = l0.views(L.params)
w2, b2, g2 = l1.views(L.params)
y2 = torch.empty(2, cfg.batch_size, l1.rows, device=dev)
y1 = torch.empty(2, cfg.batch_size, l0.rows, device=dev)
pz = L.nets.stride(0)
def two():
    linear_forward(rp.next_obs, w1, b1, g1, y1, l0.gain_group, True, rows=idx, nets=2, p_zstride=pz, ddqn=True)
    linear_forward(y1.view(-1, l0.rows), w2, b2, g2, y2, l1.gain_group, True, nets=2, p_zstride=pz,
                   x_zstride=cfg.batch_size * l0.rows, ddqn=True)
base = graph_time(two)
ref = y2.clone()
rows = [dict(cfg="two launches", us=base, max_rel=0.0)]
m = cfg.batch_size
for bm, bh, w, st in ((64, 32, 8, 2), (64, 32, 8, 3), (128, 16, 8, 3), (128, 32, 8, 2), (128, 32, 8, 3),
                      (64, 16, 4, 2), (64, 16, 4, 3), (64, 16, 8, 3), (64, 64, 8, 2)):
    def f():
        P._fwd_ddqn_tf32_gemm2_kernel[(triton.cdiv(m, bm), 2)](
            rp.next_obs, idx, w1, b1, g1, w2, b2, g2, y2, m, l0.cols, l0.rows, l1.rows, rp.next_obs.stride(0), pz,
            m * l1.rows, l0.gain_group, l1.gain_group, GATHER=True, RELU2=True, BLOCK_M=bm, BLOCK_K=64, BLOCK_H=bh,
            BLOCK_N=256, num_warps=w, num_stages=st)
    try:
        y2.fill_(float("nan"))
        us = graph_time(f)
        rel = ((y2 - ref).abs().max() / ref.abs().max()).item()
    except Exception as e:
        print("pair", bm, bh, w, st, type(e).__name__, str(e)[:200])
        us, rel = float("nan"), float("nan")
    rows.append(dict(cfg=f"bm{bm} bh{bh} w{w} s{st}", us=us, max_rel=rel))
ps = pd.DataFrame(rows)
ps.to_csv("/tmp/r/pair_sweep.csv", index=False)
print("\nDDQN layers 1+2, two nets, seed scale")
print(ps.to_string())
