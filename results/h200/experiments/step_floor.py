"""Run at 579f4c1, 01e3c9d and after (2026-12-03); it reaches into private members (HotLearner._body, _sample,
_gather; rebinds hotloop.trainer.step's linear_backward_weight and tree_update): a record tied to those commits, not
kept working against later code.

The floor of the seed-scale step's design, measured inside the step (levers 2 and 4 of the 0.20 ms issue at their
ceilings, and all of them together). Each variant is the learner's own step body captured as its own CUDA graph over
the same buffers, timed interleaved (8 rounds x 60 replays, hotloop.guards.probes.bench.time_steps), then 10 replays
traced with Kineto for its per-kernel times:
  committed       the step as the trainer runs it
  no_tail         the tail gone: sum-tree update, grad-norm + clip + Adam + target update, spectral norm (lever 4's
                  ceiling: "fewer, fuller launches" cannot take more than the whole tail off the step)
  no_tail_sample  and the sampling gone too (tree sample, importance weights, gather: "sampling folded in")
  bare_bwd        every trunk GEMM of the backward (dX, dW, the fused dW1) replaced by a bare launch of the fastest
                  FP32-accurate GEMM measured with this toolchain (split_gemm_probe's `cat-tma`: one TF32 dot over
                  the pre-split operands, TMA loads) at the same shape, its best tile swept here in isolation, no
                  epilogue (no ReLU mask read, no dz^T or db written, split-K partials added with no memset): the
                  ceiling of lever 2, whose fused dX chain still has to write what the weight gradients read. The
                  heads' backward is kept as it is
  bare_fwd        the trunk GEMMs of both forwards replaced by bare one-dot TF32 GEMMs (probe mode `tf32`, best
                  tile swept here) of the same shapes, two nets stacked into one GEMM (lever 1's ceiling without the
                  fusion); heads kept
  bare_bwd_no_tail_sample   levers 2 and 4 at their ceilings, the forward as built
  floor           everything above at once: bare GEMMs, no tail, no sampling; heads, loss, the TF32 weight copy,
                  W^T and the gradient memset kept
  floor_no_fwd    the floor with all three forward passes gone (trunks and heads: HotLearner._forward a no-op;
                  added at the next commit, after the first run): 0.20 ms minus its time is what any forward, fused
                  or not, may take
  no_fwd, no_fwd_no_tail_sample, bare_bwd_no_fwd   the forward gone from the committed step, and with levers 4 or 2 at
                  their ceilings beside it (added for the third run): what a free forward leaves
Timings only: the bare launches read random operands and write scratch buffers, so the variants' parameters stop
learning (the first capture, `committed`, warms every real buffer first).
Usage (repo root on the H200, hotloop importable): python3 step_floor.py OUT_DIR  (writes step_floor.csv,
step_floor_kernels.csv, step_floor_gemms.csv; prints the tables)."""
import os
import sys

import pandas as pd
import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

import hotloop.trainer.step as S
from hotloop.guards.probes.bench import time_steps
from hotloop.profiles.kineto_reader import read_kineto
from lab.split_gemm_probe import CONFIGS, _probe_cat_tma_kernel, _run, _time_us
from hotloop.guards.probes.bench_variants import build_hotloop_variant
from hotloop.trainer.config import preset

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
dev = torch.device("cuda")
L = build_hotloop_variant(preset("seed-scale"), dev).step.__self__
real = dict(tree_update=S.tree_update, bwd_weight=S.linear_backward_weight, bwd_input=L.linear_backward_input,
            fwd=L.linear_forward, adam_step=L.adam.step, spectral_norm=L.spectral_norm, sample=L._sample,
            gather=L._gather, forward=L._forward)
gemm_rows, bare = [], {}


def _cat_tma(m, n, k, splits, cfg):
    """A bare cat-tma launch C (m, n) (+)= A (m, k) B (k, n) over random pre-split operands ([hi; lo] stacked,
    K-contiguous), split-K slices added atomically into C with no memset (timing only)."""
    bm, bn, bk, warps, stages = cfg
    a = torch.randn(2 * m, k, device=dev)
    b = torch.randn(2 * n, k, device=dev)
    c = torch.empty(m, n, device=dev)
    ad, bd = TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bn, bk])
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), splits)
    return lambda: _probe_cat_tma_kernel[grid](ad, bd, c, m, n, k, k // splits, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                               num_warps=warps, num_stages=stages)


def _tf32(m, n, k, cfg):
    """A bare one-dot TF32 launch C (m, n) = A (m, k) W^T, W (n, k) (the forward's operand layout), random."""
    a, w, c = torch.randn(m, k, device=dev), torch.randn(n, k, device=dev), torch.empty(m, n, device=dev)
    return _run("tf32", a, w.t(), c, m, n, k, 1, cfg)


def bare_gemm(kind, m, n, k):
    """The fastest tile of the bare GEMM (kind "cat-tma" or "tf32") at (m, n, k), swept in isolation once per shape
    (each tile's time goes to step_floor_gemms.csv); returns its launch."""
    key = (kind, m, n, k)
    if key not in bare:
        best = None
        for cfg in CONFIGS:
            if m % cfg[0] or n % cfg[1] or k % cfg[2]:
                continue
            tiles = (m // cfg[0]) * (n // cfg[1])
            split_options = [1] if kind == "tf32" else [s for s in (1, 2, 4, 8, 16, 32, 64)
                                                        if tiles * s >= 66 and k % (s * cfg[2]) == 0][:3]
            for splits in split_options:
                try:
                    fn = _tf32(m, n, k, cfg) if kind == "tf32" else _cat_tma(m, n, k, splits, cfg)
                    us = _time_us(fn)
                except Exception as e:  # noqa: BLE001 (a tile that does not compile: out of shared memory)
                    print(kind, m, n, k, cfg, splits, "failed:", type(e).__name__, flush=True)
                    continue
                gemm_rows.append(dict(kind=kind, m=m, n=n, k=k, config=str(cfg), splits=splits, us=us))
                if best is None or us < best[0]:
                    best = (us, fn)
        if best is None:
            raise RuntimeError(f"no tile of {kind} compiled for m={m} n={n} k={k}")
        bare[key] = best[1]
    return bare[key]


def bare_bwd_input(dy, wt, x, dxt, db, *, dx=None, weight_grad_below=None):
    m, n_out = dy.shape
    bare_gemm("cat-tma", m, x.shape[1], n_out)()  # dX = dY W: (M, K_in), reduction over N_out
    if weight_grad_below is not None:  # dW1 = dz1^T obs: (K_in of this layer, obs_dim), reduction over M
        obs_t = weight_grad_below[0]
        bare_gemm("cat-tma", x.shape[1], obs_t.shape[1], m)()


def bare_bwd_weight(dyt, xt, w, g, dw, dg, gain_group):
    n_out, m = dyt.shape
    bare_gemm("cat-tma", n_out, xt.shape[1], m)()  # dW = dY^T X: (N_out, K_in), reduction over M


def bare_fwd(x, w, b, g, y, gain_group, relu, *, nets=1, **_):
    n, k = w.shape
    bare_gemm("tf32", y.shape[-2] * nets, n, k)()
    return y


def setup(name):
    parts = set(name.split("+"))
    S.tree_update = (lambda *a, **k: None) if "no_tail" in parts else real["tree_update"]
    L.adam.step = (lambda *a, **k: None) if "no_tail" in parts else real["adam_step"]
    L.spectral_norm = (lambda: None) if "no_tail" in parts else real["spectral_norm"]
    L._sample = (lambda: None) if "no_sample" in parts else real["sample"]
    L._gather = (lambda: None) if "no_sample" in parts else real["gather"]
    S.linear_backward_weight = bare_bwd_weight if "bare_bwd" in parts else real["bwd_weight"]
    L.linear_backward_input = bare_bwd_input if "bare_bwd" in parts else real["bwd_input"]
    L.linear_forward = bare_fwd if "bare_fwd" in parts else real["fwd"]
    L._forward = (lambda *a, **k: None) if "no_fwd" in parts else real["forward"]


VARIANTS = {"committed": "committed", "no_tail": "no_tail", "no_tail_sample": "no_tail+no_sample",
            "bare_bwd": "bare_bwd", "bare_fwd": "bare_fwd", "bare_bwd_no_tail_sample": "bare_bwd+no_tail+no_sample",
            "floor": "bare_bwd+bare_fwd+no_tail+no_sample", "floor_no_fwd": "bare_bwd+no_fwd+no_tail+no_sample",
            "no_fwd": "no_fwd", "no_fwd_no_tail_sample": "no_fwd+no_tail+no_sample",
            "bare_bwd_no_fwd": "bare_bwd+no_fwd"}
graphs = {}
for name, parts in VARIANTS.items():
    setup(parts)
    if name == "bare_bwd":  # sweep every bare shape once, eagerly on the default stream, before any capture of them
        setup("bare_bwd+bare_fwd")
        L._body()
        torch.cuda.synchronize()
        setup(parts)
    L.capture()  # the learner's own warm-up steps and capture of the patched body (`committed` first: real buffers)
    graphs[name] = L.graph
setup("committed")
for g in graphs.values():
    for _ in range(20):
        g.replay()
torch.cuda.synchronize()
times = {k: [] for k in graphs}
for _ in range(8):
    for k, g in graphs.items():
        times[k] += time_steps(g.replay, 60, dev)
steps, kernels = [], []
for name, g in graphs.items():
    t = pd.Series(times[name])
    path = os.path.join("/tmp", f"step_floor_{name}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    k = read_kineto(path, kinds=("kernel",))
    per = k.groupby("name").dur_us.agg(["count", "median", "sum"]).reset_index()
    per = per.assign(variant=name, per_step=per["count"] / 10, us_per_step=per["sum"] / 10)
    kernels.append(per)
    steps.append(dict(variant=name, parts=VARIANTS[name], p20=t.quantile(0.2), p50=t.median(), p80=t.quantile(0.8),
                      kernels_per_step=int(round(per["per_step"].sum())),
                      kernel_us_per_step=float(per["us_per_step"].sum())))
step_table = pd.DataFrame(steps)
step_table["vs_committed_us"] = step_table["p50"] - float(step_table.loc[0, "p50"])
kernel_table = pd.concat(kernels)
kernel_table["name"] = kernel_table["name"].str.slice(0, 60)
gemm_table = pd.DataFrame(gemm_rows)
pd.set_option("display.width", 220)
print(step_table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
print(kernel_table.pivot_table(index="name", columns="variant", values="median").to_string(
    float_format=lambda v: f"{v:.1f}"))
print(gemm_table.sort_values("us").groupby(["kind", "m", "n", "k"]).head(1).to_string(index=False))
step_table.to_csv(os.path.join(out_dir, "step_floor.csv"), index=False)
kernel_table.to_csv(os.path.join(out_dir, "step_floor_kernels.csv"), index=False)
gemm_table.to_csv(os.path.join(out_dir, "step_floor_gemms.csv"), index=False)
