"""Last run at ae17f01 (2026-11-30); it reaches into private members (HotLearner._sample, _forward, _on_side, _join_side; FusedAdam._betas64, _scalars; private kernels of hotloop.kernels.fused_adam): a record tied to that commit, not kept working against later code.

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


from hotloop.kernels.heads import heads_backward
from hotloop.kernels.linear import linear_backward_weight


def backward(hook_before_last):
    lay, params, grads = L.layout, L.params, L.grads
    grads.zero_()
    w_out, _, g_out = lay.out_views(params)
    dw_out, db_out, dg_out = lay.out_views(grads)
    db_hidden = lay.layers[-1].views(grads)[1]
    heads_backward(L.acts[-1], L.td.grad.view(cfg.batch_size, -1), w_out, g_out, L.dz[-1], L.dz_t[-1], db_hidden,
                   dw_out, db_out, dg_out, lay.branches)
    for i in reversed(range(len(lay.layers))):
        slots = lay.layers[i]
        w, _, g = slots.views(params)
        dw, _, dg = slots.views(grads)
        if i == 0:
            hook_before_last()
        linear_backward_weight(L.dz_t[i], L.obs_t if i == 0 else L.acts_t[i - 1], w, g, dw, dg, slots.gain_group)
        if i > 0:
            L.linear_backward_input(L.dz[i], L.wts[i], L.acts[i - 1], L.dz_t[i - 1],
                                    lay.layers[i - 1].views(grads)[1], dx=L.dz[i - 1])


def side_tree():
    with L._on_side():
        tree()


def body(mode):
    b, d, a = cfg.batch_size, L.layout.branches, L.layout.actions
    L._sample()
    with L._on_side():
        L._forward(rp.next_obs, L.ddqn_acts, L.q_next, nets=2)
    L._forward(rp.obs, L.acts, L.q, nets=1, acts_t=L.acts_t)
    L.weight_transpose(L.params, L.wt)
    L._join_side()
    from hotloop.kernels.td_loss import td_loss_forward
    td_loss_forward(L.q.view(b, d, a), L.q_next[0].view(b, d, a), L.q_next[1].view(b, d, a), L.action, L.reward,
                    L.terminated, L.weights, cfg.gamma, cfg.loss, cfg.huber_delta, cfg.cql_weight, cfg.per_eps,
                    cfg.per_alpha, out=L.td, workspace=L.td_ws)
    if mode == "after_loss":
        side_tree()
    backward(side_tree if mode == "before_dw1" else (lambda: None))
    if mode == "base":
        side_tree()
    adam_split(side_tree if mode == "after_norm" else (lambda: None))
    L.spectral_norm()
    L._join_side()


modes = ["base", "after_norm", "before_dw1", "after_loss"]
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


