"""Last run at 2bad784 (2026-11-30); it reaches into private members (HotLearner._body, _sample, _gather, _forward, _backward, _on_side, _join_side; private kernels and helpers of hotloop.kernels.segment_tree; it rewrites hotloop.kernels.linear.linear_forward's source): a record tied to that commit, not kept working against later code.

Step variants of HotLearner at 2bad784, each captured as its own graph over the same buffers, timed interleaved:
base; the forward's split transposed store at 4 warps (non-gathered layers / all layers); the IS weights after the
online forward; spectral norm at the start of the step beside the sampling (for the decision record).
Usage (repo root on the H200): python3 results/h200/experiments/yt_warps_weights_late_sn_first.py [OUT.csv]"""
import inspect
import sys

import pandas as pd
import torch

import hotloop.kernels.linear as KL
from hotloop.kernels.segment_tree import _block, _check_nodes, _grid, _tree_sample_kernel, _tree_weights_kernel
from hotloop.kernels.segment_tree import tree_update
from hotloop.kernels.td_loss import td_loss_forward
from hotloop.trainer.config import preset
from hotloop.guards.probes.bench_variants import build_hotloop_variant
from hotloop.trainer.step import HotLearner

cfg = preset("seed-scale")
dev = torch.device("cuda")
v = build_hotloop_variant(cfg, dev)
L: HotLearner = v.step.__self__
rp = L.replay
b, d, a = cfg.batch_size, L.layout.branches, L.layout.actions

# linear_forward with the yt warps chosen per variant (KL._WARPS_OF(rows) at capture time)
src = inspect.getsource(KL.linear_forward).replace("num_warps=8 if yt is not None else 4",
                                                    "num_warps=_WARPS_OF(rows) if yt is not None else 4")
assert "_WARPS_OF" in src
exec(src, KL.__dict__)
L.linear_forward = KL.linear_forward
KL._WARPS_OF = lambda rows: 8

# tree_sample's two launches, separately
_, depth = _check_nodes(rp.tree.nodes, rp.capacity)
blk = _block()
n_sample = _grid(b, blk)
partials = torch.empty(n_sample, dtype=torch.float32, device=dev)


def sample_only():
    from hotloop.kernels.replay_batch import batch_uniforms
    batch_uniforms(L.adam.step_count, L.uniforms, L.beta, cfg.seed, cfg.per_beta_start, cfg.per_beta_end,
                   max(1, cfg.epochs * cfg.learner_steps_per_epoch))
    _tree_sample_kernel[(n_sample,)](rp.tree.nodes, L.uniforms, L.idx, L.weights, partials, b, float(b),
                                     rp.capacity, rp.tree.nodes, rp.capacity, n_sample, DEPTH=depth, GLOBAL=False,
                                     SIZE_ON_DEVICE=False, BLOCK=blk, LEAF_BLOCK=1024, num_warps=1)


def weights_only():
    _tree_weights_kernel[(n_sample,)](L.weights, partials, n_sample, L.beta, b, BLOCK=blk, PBLOCK=256, num_warps=1)


def tail():
    td_loss_forward(L.q.view(b, d, a), L.q_next[0].view(b, d, a), L.q_next[1].view(b, d, a), L.action, L.reward,
                    L.terminated, L.weights, cfg.gamma, cfg.loss, cfg.huber_delta, cfg.cql_weight, cfg.per_eps,
                    cfg.per_alpha, out=L.td, workspace=L.td_ws)
    L._backward()
    with L._on_side():
        tree_update(rp.tree.nodes, L.idx, L.td.priorities, rp.capacity, rp.tree.max_value,
                    rp.tree.bad_priority_count)
    L.adam.step(L.params, L.grads, L.target, tau=cfg.tau, target_every=cfg.target_update_interval)


def body_weights_late():
    with L._on_side():
        L.weight_transpose(L.params, L.wt)
        L.grads.zero_()
    sample_only()
    with L._on_side():
        L._forward(rp.next_obs, L.ddqn_acts, L.q_next, nets=2)
    L._forward(rp.obs, L.acts, L.q, nets=1, acts_t=L.acts_t)
    L._gather()
    weights_only()
    L._join_side()
    tail()
    L.spectral_norm()
    L._join_side()


def body_sn_first():
    with L._on_side():
        L._sample()
    L.spectral_norm()
    L._join_side()  # the forwards need the sampled indices and the projected weights
    with L._on_side():
        L._forward(rp.next_obs, L.ddqn_acts, L.q_next, nets=2)
    L.weight_transpose(L.params, L.wt)
    L.grads.zero_()
    L._forward(rp.obs, L.acts, L.q, nets=1, acts_t=L.acts_t)
    L._gather()
    L._join_side()
    tail()
    L._join_side()


variants = {
    "base": (L._body, lambda rows: 8),
    "yt_w4_plain": (L._body, lambda rows: 8 if rows is not None else 4),
    "yt_w4_all": (L._body, lambda rows: 4),
    "weights_late": (body_weights_late, lambda rows: 8),
    "sn_first": (body_sn_first, lambda rows: 8),
}
graphs = {}
for name, (body, warps) in variants.items():
    KL._WARPS_OF = warps
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    graphs[name] = g
    print("captured", name, flush=True)
torch.cuda.synchronize()
for g in graphs.values():
    for _ in range(20):
        g.replay()
torch.cuda.synchronize()
times = {m: [] for m in graphs}
for rep in range(8):
    for m, g in graphs.items():
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(60)]
        for e0, e1 in ev:
            e0.record()
            g.replay()
            e1.record()
        torch.cuda.synchronize()
        times[m] += [e0.elapsed_time(e1) * 1000 for e0, e1 in ev]
# back to back, as the bench times them (a graph replay's launch overlaps the previous one)
b2b = {}
for m, g in graphs.items():
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(300):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    b2b[m] = e0.elapsed_time(e1) * 1000 / 300
rows = [dict(variant=m, p20=pd.Series(t).quantile(.2), p50=pd.Series(t).median(), p80=pd.Series(t).quantile(.8),
             back_to_back=b2b[m]) for m, t in times.items()]
table = pd.DataFrame(rows)
print(table.to_string(index=False))
if len(sys.argv) > 1:
    table.to_csv(sys.argv[1], index=False)
