"""Last run at e316bb9 (2026-11-30); it reaches into private members (HotLearner._sample, _forward, _backward, _on_side, _join_side; FusedAdam._betas64, _scalars; private kernels and helpers of hotloop.kernels.fused_adam, heads, segment_tree): a record tied to that commit, not kept working against later code.

Step-schedule variants of HotLearner, each captured as its own graph, timed interleaved, one trace each."""
import os, sys, time, torch, triton
from contextlib import nullcontext
import pandas as pd
from hotloop.trainer.config import preset
from hotloop.guards.probes.bench_variants import build_hotloop_variant
from hotloop.trainer.step import HotLearner
from hotloop.kernels.fused_adam import _grad_sumsq_kernel, _clip_adam_kernel, _BLOCK_ADAM, _MIN_GRID
from hotloop.kernels.segment_tree import tree_update
from hotloop.profiles.kineto_reader import read_kineto

out = sys.argv[1]
cfg = preset("seed-scale")
dev = torch.device("cuda")
v = build_hotloop_variant(cfg, dev)
L: HotLearner = v.step.__self__
rp = L.replay
hi_side = torch.cuda.Stream(dev, priority=-1)
lo_side = L.side


def adam_split(mid):
    a = L.adam
    n = a.partials.numel()
    _grad_sumsq_kernel[(n,)](L.grads, a.partials, a.step_count, a.lr, a._betas64, a._scalars, a.num_params,
                             BLOCK=1024)
    mid()
    b1, b2 = a.betas
    tau = cfg.tau
    _clip_adam_kernel[(max(triton.cdiv(a.num_params, _BLOCK_ADAM), _MIN_GRID),)](
        L.params, L.grads, a.exp_avg, a.exp_avg_sq, L.target, a.partials, a._scalars, a.grad_norm, a.step_count,
        int(cfg.target_update_interval), a.num_params, n, b2, 1.0 - b1, 1.0 - b2, a.eps, a.weight_decay,
        a.max_grad_norm, tau, HAS_WD=a.weight_decay != 0.0, BETA1_SMALL=1.0 - b1 < 0.5, HAS_TARGET=True,
        TAU_SMALL=tau < 0.5, BLOCK=_BLOCK_ADAM, PBLOCK=triton.next_power_of_2(n))


def tree():
    tree_update(rp.tree.nodes, L.idx, L.td.priorities, rp.capacity, rp.tree.max_value, rp.tree.bad_priority_count)


def body(mode):
    b, d, a = cfg.batch_size, L.layout.branches, L.layout.actions
    L.side = hi_side if mode == "side_hi" else lo_side
    L._sample()
    if mode == "ddqn_serial":
        L._forward(rp.next_obs, L.ddqn_acts, L.q_next, nets=2)
        L._forward(rp.obs, L.acts, L.q, nets=1, acts_t=L.acts_t)
        L.weight_transpose(L.params, L.wt)
        with L._on_side():
            pass
    elif mode == "online_first":
        L._forward(rp.obs, L.acts, L.q, nets=1, acts_t=L.acts_t)  # launched before the fork... still main
        with L._on_side():
            L._forward(rp.next_obs, L.ddqn_acts, L.q_next, nets=2)
        L.weight_transpose(L.params, L.wt)
    else:
        with L._on_side():
            L._forward(rp.next_obs, L.ddqn_acts, L.q_next, nets=2)
        L._forward(rp.obs, L.acts, L.q, nets=1, acts_t=L.acts_t)
        L.weight_transpose(L.params, L.wt)
    L._join_side()
    from hotloop.kernels.td_loss import td_loss_forward
    td_loss_forward(L.q.view(b, d, a), L.q_next[0].view(b, d, a), L.q_next[1].view(b, d, a), L.action, L.reward,
                    L.terminated, L.weights, cfg.gamma, cfg.loss, cfg.huber_delta, cfg.cql_weight, cfg.per_eps,
                    cfg.per_alpha, out=L.td, workspace=L.td_ws)
    L._backward()
    if mode == "tree_mid":
        def mid():
            with L._on_side():
                tree()
        adam_split(mid)
    elif mode == "tree_serial":
        adam_split(lambda: None)
    else:
        with L._on_side():
            tree()
        adam_split(lambda: None)
    L.spectral_norm()
    if mode == "tree_serial":
        tree()
    L._join_side()


modes = ["base", "tree_mid", "tree_serial", "ddqn_serial", "online_first", "side_hi"]
graphs = {}
for m in modes:
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body(m)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body(m)
    graphs[m] = g
torch.cuda.synchronize()
for m in modes:
    for _ in range(20):
        graphs[m].replay()
torch.cuda.synchronize()
times = {m: [] for m in modes}
for rep in range(6):
    for m in modes:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(60)]
        for e0, e1 in ev:
            e0.record(); graphs[m].replay(); e1.record()
        torch.cuda.synchronize()
        times[m] += [e0.elapsed_time(e1) * 1000 for e0, e1 in ev]
rows = []
for m in modes:
    t = pd.Series(times[m])
    rows.append(dict(mode=m, p20=t.quantile(.2), p50=t.median(), p80=t.quantile(.8)))
print(pd.DataFrame(rows).to_string())

# one trace per mode: the timeline of the 3rd of 5 replays
for m in modes:
    path = f"/tmp/r/trace_{m}.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graphs[m].replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    k = read_kineto(path)
    k = k[k.kind == "kernel"].sort_values("start_us")
    starts = k[k.name.str.startswith("_batch_uniforms")].start_us.tolist()
    step = k[(k.start_us >= starts[2]) & (k.start_us < starts[3])]
    t0 = step.start_us.min()
    print(f"\n== {m}: span {step.start_us.max() - t0 + step.dur_us.iloc[-1]:.1f} us (to next step start "
          f"{starts[3] - t0:.1f})")
    for r in step.itertuples():
        print(f"{r.start_us - t0:8.1f} {r.start_us - t0 + r.dur_us:8.1f} {r.dur_us:7.1f} s{r.stream} "
              f"{r.name[:40]:40s} ({r.grid_x},{r.grid_y},{r.grid_z})")


def graph_time(fn, reps=20, rounds=5):
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


# heads forward sweep at the step's shapes
import hotloop.kernels.heads as H
lay = L.layout
w_out, b_out, g_out = lay.out_views(L.params)
h1, h2 = L.acts[-1], L.ddqn_acts[-1]
j, hidden, actions = H._sizes(w_out, lay.branches)
bj = max(16, triton.next_power_of_2(j))
rows = []
for nets, h, q in ((1, h1, L.q), (2, h2, L.q_next)):
    m = h.shape[-2]
    for bm in (32, 64, 128):
        for bk in (16, 32, 64):
            for w in (2, 4):
                for st in (1, 3):
                    def f():
                        H._heads_online_tf32_kernel[(triton.cdiv(m, bm), nets)](
                            h, w_out, b_out, g_out, q, m, hidden, m * (1 + lay.branches) * hidden,
                            L.nets.stride(0), m * lay.branches * actions, D=lay.branches, A=actions, BLOCK_M=bm,
                            BLOCK_J=bj, BLOCK_K=bk, num_warps=w, num_stages=st)
                    try:
                        rows.append(dict(nets=nets, bm=bm, bk=bk, warps=w, stages=st, us=graph_time(f)))
                    except Exception as e:
                        rows.append(dict(nets=nets, bm=bm, bk=bk, warps=w, stages=st, us=float("nan")))
hs = pd.DataFrame(rows)
hs.to_csv(f"/tmp/r/heads_sweep.csv", index=False)
print("\nheads forward sweep, best 8 per nets")
for nets, grp in hs.groupby("nets"):
    print(grp.sort_values("us").head(8).to_string())
    print("current (128, 64, 4 warps, default stages 3):", grp[(grp.bm == 128) & (grp.bk == 64) & (grp.warps == 4) & (grp.stages == 3)].us.tolist())

# tree update sweep
import hotloop.kernels.segment_tree as S
nodes = rp.tree.nodes
cap = rp.capacity
_, depth = S._check_nodes(nodes, cap)
idx = L.idx
vals = [L.td.priorities.clone(), L.td.priorities.clone() * 1.5 + 0.01]
rows = []
for top in (4, 5, 6, 7, 8):
    for blk in (32, 64, 128):
        for w in (1, 2, 4):
            if blk < 32 * w:
                continue
            state = [0]
            def f():
                state[0] ^= 1
                val = vals[state[0]]
                S._tree_update_kernel[(triton.cdiv(idx.numel(), blk),)](
                    nodes, idx, val, idx.numel(), cap, nodes, 0, 0, rp.tree.max_value, rp.tree.bad_priority_count,
                    DEPTH=depth, INSERT=False, START_ON_DEVICE=False, TOP=top, BLOCK=blk, num_warps=w)
            try:
                rows.append(dict(top=top, block=blk, warps=w, us=graph_time(f)))
            except Exception as e:
                print("tree", top, blk, w, e)
ts = pd.DataFrame(rows)
ts.to_csv("/tmp/r/tree_sweep.csv", index=False)
print("\ntree update sweep")
print(ts.sort_values("us").to_string())
