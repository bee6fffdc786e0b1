"""Fused linear layers over a flat parameter buffer: TF32 forward GEMMs, FP32-accurate backward GEMMs.

y = act(g[n // GAIN_GROUP] * (x @ W^T)[:, n] + b[n]) for a weight W (N, K), bias b (N,) and per-row-group gain g
(a spectral-normalized matrix times a learned scalar gain: sigma-reparam, Zhai et al. 2023; several matrices of
the same input stacked row-wise form one layer, each with its own gain). W, b and g are views (offsets) of one flat
fp32 buffer, so the online and the target network (two such buffers, `z_stride` floats apart) run in ONE launch
with a third grid axis; `linear_forward_grouped` runs all three forwards of a learner step (online net on s, online
and target net on s') in one launch per layer, grid z = 3 (Config.grouped_forward).

Precision placement (issue "TF32 forward, FP32-accurate backward"): the forward kernels multiply on TF32 tensor
cores (`tl.dot(input_precision="tf32")`, ~5e-4 relative error) with both operands rounded to the nearest TF32 value
first (`tf32_rna`, as cuBLAS and CUTLASS convert). Left to the MMA, Hopper drops the low 13 mantissa bits: a bias
toward zero of ~1e-3 per product, which the TD fixed point amplifies by 1 / (1 - gamma) (100x at gamma 0.99): the
reference learner with truncated TF32 forwards diverged on 3 of 12 CartPole seeds, with rounded ones on 1, in
IEEE FP32 on none (results/cpu/learning_causes/README.md, H6). Where the rounding happens decides its cost
(H200: rounding both tiles in the GEMM's loop made the step 2.5x slower, the weight tile most of it, since the
MMA's B operand must then go back to shared memory; results/h200/ab/tf32_rounding/): a layer rounds its input
tile in registers only where nobody rounded it before (`x_tf32`), stores its output rounded for the next layer
(`out_tf32`), and the step reads its weights from a rounded copy (`tf32_round_copy`, kernels/tf32_split.py,
`w_tf32`). The backward kernels use split precision (three
TF32 MMAs per product: hi*hi + hi*lo + lo*hi, Ootomo & Yokota 2022, the scheme of Triton's "tf32x3"), which keeps
IEEE FP32 accuracy on tensor cores. They do the split by hand, with their B operand split ahead of time by its
producer (kernels/tf32_split.py: `WeightTranspose` writes W^T, the forward X^T, the gather obs^T as TF32 hi and lo
parts) and only A split in registers: Triton's tf32x3 splits both operands in registers at every reduction step
and must store the B parts back to shared memory (seen in its TTGIR for sm90), while the A operand of Hopper's MMA
may stay in registers. Kernel names carry the precision ("tf32" /
"fp32split") and the phase ("online", "ddqn", "bwd"), which is how the guards classify them
(guards/step_metrics.py `gemm_precision`, phase rules).
Under TRITON_INTERPRET=1 every dot is a float32 numpy matmul (precision ignored), and the forward's rounding is off
with it (`rounds_tf32_operands`, kernels/_common.py): the CPU tests check the algebra, the GPU tests and the CPU
tests that emulate Hopper's dot (tests/kernels/test_tf32_emulated.py) the precision.

Operand layouts. Hopper's TF32 tensor-core MMA (wgmma) reads fp32 operands from shared memory only K-major (the
reduction axis contiguous); an operand stored the other way is copied into shared memory 4 bytes at a time instead
of 16, and the GEMM runs 1.5-5x slower (results/h200/kernels/split_gemm_probe.csv). So the backward reads copies laid out
for it: W^T scaled by the gains (`WeightTranspose`, one launch for every layer but the first), and the
batch-contiguous transposes X^T and dY^T, written by the kernels that produce X and dY (the forward's `yt`, the
input gradient's `dxt`, the heads' backward, the replay gather's observations). The B operands, W^T and X^T, are
stored split into TF32 parts (kernels/tf32_split.py) by those producers.

Backward of one layer (dY: gradient w.r.t. its pre-activation, already masked by its ReLU):
- `linear_backward_input`: dZ = (dY @ (g W)) masked by (X > 0) (X is the previous ReLU's output, so dZ is the
  previous layer's pre-activation gradient), written as dZ^T (and dZ), with the previous layer's bias gradient
  sum_m dZ; grid over (M, K) tiles.
- `linear_backward_weight`: dW = g * dY^T X and dg = sum_{rows of the group} sum_k W * (dY^T X), split over M
  ("split-K") with fp32 atomic adds into the gradient buffer, which must be zeroed once per step before the
  backward (the step's one memset).
Plain-torch reference: `linear_reference` (autograd through it gives every gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_net_stride, check_tensor, rounds_tf32_operands
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs
from hotloop.kernels.tf32_split import tf32_hi_lo, tf32_rna

_MIN_PROGRAMS = 132  # one program per SM of a 132-SM H100/H200 at least, where the shape allows


@triton.jit
def _fwd_body(
    x_ptr,
    idx_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    y_ptr,
    yt_ptr,
    M,
    N,
    K,
    stride_xm,
    x_zstride,
    p_zstride,
    y_zstride,
    gain_group,
    GATHER: tl.constexpr,
    RELU: tl.constexpr,
    STORE_T: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    ROUND_Y: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr,
):
    # GROUPED: called by `_fwd_grouped_tf32_gemm_kernel`, which offset every pointer by its z (the z-strides are 0
    # here) and wants y^T of z = 0 alone
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    z = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    if GATHER:
        rows = tl.load(idx_ptr + offs_m, mask=mask_m, other=0)
    else:
        rows = offs_m.to(tl.int64)
    x_base = x_ptr + z * x_zstride + rows[:, None] * stride_xm
    w_base = w_ptr + z * p_zstride + offs_n[None, :] * K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_base + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_base + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if ROUND_X:  # to the nearest TF32 value, so that the MMA truncates nothing (see above); in registers:
            x = tf32_rna(x)  # the MMA's A operand may stay there
        if ROUND_W:  # B must go back to shared memory: 5x slower (the step reads a rounded copy instead)
            w = tf32_rna(w)
        acc = tl.dot(x, w, acc, input_precision="tf32")
    g = tl.load(g_ptr + z * p_zstride + offs_n // gain_group, mask=mask_n, other=0.0)
    b = tl.load(b_ptr + z * p_zstride + offs_n, mask=mask_n, other=0.0)
    y = acc * g[None, :] + b[None, :]
    if RELU:
        y = tl.maximum(y, 0.0)
    if ROUND_Y:  # stored as TF32 values: a next TF32 GEMM reads it as its A operand with nothing to round
        y = tf32_rna(y)
    mask = mask_m[:, None] & mask_n[None, :]
    tl.store(y_ptr + z * y_zstride + offs_m[:, None] * N + offs_n[None, :], y, mask=mask)
    if STORE_T:  # y^T (2, N, M) too, split into TF32 parts: the next layer's weight-gradient GEMM reads it K-major
        if GROUPED:  # (one net only: a grouped launch's z = 0, the online net on s)
            if z == 0:
                _store_split_t(yt_ptr, y, offs_m, offs_n, M, N, mask)
        else:
            _store_split_t(yt_ptr, y, offs_m, offs_n, M, N, mask)


@triton.jit
def _store_split_t(yt_ptr, y, offs_m, offs_n, M, N, mask):
    # y^T of a (BLOCK_M, BLOCK_N) tile into yt (2, N, M): its TF32 hi part, then the lo part
    hi, lo = tf32_hi_lo(y)
    tl.store(yt_ptr + offs_n[None, :] * M + offs_m[:, None], hi, mask=mask)
    tl.store(yt_ptr + N * M + offs_n[None, :] * M + offs_m[:, None], lo, mask=mask)


# Thin kernels over one body: the same code under two names, because a graph replay carries no ranges and the
# guards assign its kernels to the "forward" / "ddqn_forward" phases by name (trainer/step.py PHASE_RULES); and a
# third, `_fwd_grouped_tf32_gemm_kernel` ("forward"), that runs all three forwards of a step in one launch.
@triton.jit
def _fwd_online_tf32_gemm_kernel(
    x_ptr,
    idx_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    y_ptr,
    yt_ptr,
    M,
    N,
    K,
    stride_xm,
    x_zstride,
    p_zstride,
    y_zstride,
    gain_group,
    GATHER: tl.constexpr,
    RELU: tl.constexpr,
    STORE_T: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    ROUND_Y: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    _fwd_body(
        x_ptr,
        idx_ptr,
        w_ptr,
        b_ptr,
        g_ptr,
        y_ptr,
        yt_ptr,
        M,
        N,
        K,
        stride_xm,
        x_zstride,
        p_zstride,
        y_zstride,
        gain_group,
        GATHER,
        RELU,
        STORE_T,
        ROUND_X,
        ROUND_W,
        ROUND_Y,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        False,
    )


@triton.jit
def _fwd_ddqn_tf32_gemm_kernel(
    x_ptr,
    idx_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    y_ptr,
    yt_ptr,
    M,
    N,
    K,
    stride_xm,
    x_zstride,
    p_zstride,
    y_zstride,
    gain_group,
    GATHER: tl.constexpr,
    RELU: tl.constexpr,
    STORE_T: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    ROUND_Y: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    _fwd_body(
        x_ptr,
        idx_ptr,
        w_ptr,
        b_ptr,
        g_ptr,
        y_ptr,
        yt_ptr,
        M,
        N,
        K,
        stride_xm,
        x_zstride,
        p_zstride,
        y_zstride,
        gain_group,
        GATHER,
        RELU,
        STORE_T,
        ROUND_X,
        ROUND_W,
        ROUND_Y,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        False,
    )


@triton.jit
def grouped_pointers(z, x_ptr, xn_ptr, xn_zstride, y_ptr, yn_ptr, yn_zstride, p_zstride):
    """A grouped forward program's (input, output, parameter offset) for its net index z: z = 0 the online net on s
    (x, y, net 0), z = 1 the online net on s' (xn, yn, net 0), z = 2 the target net on s' (xn + xn_zstride,
    yn + yn_zstride, net 1: p_zstride floats after net 0). The one convention of `_fwd_grouped_tf32_gemm_kernel` and
    kernels/heads.py's `_heads_grouped_tf32_kernel`."""
    if z == 0:
        x_sel = x_ptr
        y_sel = y_ptr
    else:
        x_sel = xn_ptr + (z - 1) * xn_zstride
        y_sel = yn_ptr + (z - 1) * yn_zstride
    return x_sel, y_sel, (z // 2) * p_zstride


@triton.jit
def _fwd_grouped_tf32_gemm_kernel(
    x_ptr,
    xn_ptr,
    idx_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    y_ptr,
    yn_ptr,
    yt_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xnm,
    xn_zstride,
    p_zstride,
    gain_group,
    GATHER: tl.constexpr,
    RELU: tl.constexpr,
    STORE_T: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    ROUND_Y: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    # the step's three forwards in one launch (`linear_forward_grouped`): z = 0 the online net on s (x -> y, y^T),
    # z = 1 the online and z = 2 the target net on s' (xn + (z - 1) xn_zstride -> yn[z - 1]); the target's
    # parameters are p_zstride floats after the online ones. Each program picks its pointers, then runs the body
    # with z-strides 0.
    z = tl.program_id(2)
    x_sel, y_sel, p_off = grouped_pointers(z, x_ptr, xn_ptr, xn_zstride, y_ptr, yn_ptr, M * N, p_zstride)
    stride_sel = tl.where(z == 0, stride_xm, stride_xnm)
    _fwd_body(
        x_sel,
        idx_ptr,
        w_ptr + p_off,
        b_ptr + p_off,
        g_ptr + p_off,
        y_sel,
        yt_ptr,
        M,
        N,
        K,
        stride_sel,
        0,
        0,
        0,
        gain_group,
        GATHER,
        RELU,
        STORE_T,
        ROUND_X,
        ROUND_W,
        ROUND_Y,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        True,
    )


@triton.jit
def _dot_3xtf32(a, b_hi, b_lo, acc):
    # acc + a b in split precision: a split into TF32 parts here, in registers (the MMA's A operand may come from
    # registers), b given as its parts; acc += a_lo b_hi + a_hi b_lo + a_hi b_hi, each a plain TF32 MMA (3xTF32,
    # Ootomo & Yokota 2022; the dropped a_lo b_lo term is ~2^-22 relative)
    a_hi, a_lo = tf32_hi_lo(a)
    acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
    acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
    return tl.dot(a_hi, b_hi, acc, input_precision="tf32")


@triton.jit
def _bwd_dx_fp32split_gemm_kernel(
    dy_ptr,
    wt_ptr,
    x_ptr,
    dx_ptr,
    dxt_ptr,
    db_ptr,
    x0t_ptr,
    w0_ptr,
    g0_ptr,
    dw0_ptr,
    dg0_ptr,
    M,
    N,
    K,
    K0,
    gain0,
    STORE_DX: tl.constexpr,
    FUSE_DW: tl.constexpr,
    LEARN_GAIN0: tl.constexpr,
    GROUPS_PER_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_J: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    # both operands K-major (the reduction axis n contiguous): dy (M, N) rows, and W^T (2, K, N) rows read as (N, K)
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_k = offs_k < K
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    # split precision with B split ahead of time (WeightTranspose writes W^T as TF32 hi and lo parts): only dy is
    # split here, in registers; B tiles go straight from memory to shared memory
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        dy = tl.load(dy_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask_m[:, None] & mask_n[None, :], other=0.0)
        wmask = mask_n[:, None] & mask_k[None, :]
        wt_hi = tl.load(wt_ptr + offs_k[None, :] * N + offs_n[:, None], mask=wmask, other=0.0)
        wt_lo = tl.load(wt_ptr + K * N + offs_k[None, :] * N + offs_n[:, None], mask=wmask, other=0.0)
        acc = _dot_3xtf32(dy, wt_hi, wt_lo, acc)
    mask = mask_m[:, None] & mask_k[None, :]
    x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask, other=0.0)
    dz = tl.where(x > 0.0, acc, 0.0)  # zero outside the tile's valid rows and columns too (x is 0 there)
    if STORE_DX:
        tl.store(dx_ptr + offs_m[:, None] * K + offs_k[None, :], dz, mask=mask)
    tl.atomic_add(db_ptr + offs_k, tl.sum(dz, axis=0), mask=mask_k, sem="relaxed")
    if FUSE_DW:
        # the previous layer's weight gradient from this tile's rows: dW0[k, :] += g0 dz[:, k]^T x0[rows], with
        # x0 read K-major from x0^T (2, K0, M); dz^T is never written
        offs_j = tl.arange(0, BLOCK_J)
        mask_j = offs_j < K0
        x0mask = mask_m[:, None] & mask_j[None, :]
        x0_hi = tl.load(x0t_ptr + offs_j[None, :] * M + offs_m[:, None], mask=x0mask, other=0.0)
        x0_lo = tl.load(x0t_ptr + K0 * M + offs_j[None, :] * M + offs_m[:, None], mask=x0mask, other=0.0)
        part = _dot_3xtf32(tl.trans(dz), x0_hi, x0_lo, tl.zeros((BLOCK_K, BLOCK_J), dtype=tl.float32))
        wmask = mask_k[:, None] & mask_j[None, :]
        g0 = tl.load(g0_ptr + offs_k // gain0, mask=mask_k, other=0.0)
        tl.atomic_add(dw0_ptr + offs_k[:, None] * K0 + offs_j[None, :], part * g0[:, None], mask=wmask, sem="relaxed")
        if LEARN_GAIN0:
            w0 = tl.load(w0_ptr + offs_k[:, None] * K0 + offs_j[None, :], mask=wmask, other=0.0)
            _gain_grad(dg0_ptr, tl.sum(w0 * part, axis=1), offs_k, mask_k, pid_k * BLOCK_K, K, gain0, GROUPS_PER_TILE)
    else:
        tl.store(dxt_ptr + offs_k[None, :] * M + offs_m[:, None], dz, mask=mask)


@triton.jit
def _gain_grad(dg_ptr, r, offs, mask, first_row, rows, gain_group, GROUPS_PER_TILE: tl.constexpr):
    # dg[j] += sum of r over the tile's rows of gain group j: reduced inside the program, then one atomic per group
    # (not one per row: a group can span every row of the tile, and per-row atomics on one address serialize);
    # per row when the tile spans many small groups (GROUPS_PER_TILE = 0)
    grp = offs // gain_group
    if GROUPS_PER_TILE == 0:
        tl.atomic_add(dg_ptr + grp, r, mask=mask, sem="relaxed")
    else:
        first = first_row // gain_group
        last = (rows - 1) // gain_group
        for j in tl.static_range(GROUPS_PER_TILE):
            tl.atomic_add(
                dg_ptr + first + j, tl.sum(tl.where(grp == first + j, r, 0.0)), mask=first + j <= last, sem="relaxed"
            )


@triton.jit
def _bwd_dw_fp32split_gemm_kernel(
    dyt_ptr,
    xt_ptr,
    w_ptr,
    g_ptr,
    dw_ptr,
    dg_ptr,
    M,
    N,
    K,
    gain_group,
    rows_per_split,
    LEARN_GAIN: tl.constexpr,
    GROUPS_PER_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    # both operands K-major (the reduction axis m contiguous): dY^T (N, M) rows and X^T (2, K, M) rows read as (M, K)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_k = offs_k < K
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    m_start = split * rows_per_split
    for m0 in range(m_start, m_start + rows_per_split, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        dyt = tl.load(
            dyt_ptr + offs_n[:, None] * M + offs_m[None, :], mask=mask_n[:, None] & mask_m[None, :], other=0.0
        )
        xmask = mask_m[:, None] & mask_k[None, :]
        x_hi = tl.load(xt_ptr + offs_k[None, :] * M + offs_m[:, None], mask=xmask, other=0.0)
        x_lo = tl.load(xt_ptr + K * M + offs_k[None, :] * M + offs_m[:, None], mask=xmask, other=0.0)
        acc = _dot_3xtf32(dyt, x_hi, x_lo, acc)  # X^T comes split (2, K, M); dY^T is split in registers
    mask = mask_n[:, None] & mask_k[None, :]
    g = tl.load(g_ptr + offs_n // gain_group, mask=mask_n, other=0.0)
    tl.atomic_add(dw_ptr + offs_n[:, None] * K + offs_k[None, :], acc * g[:, None], mask=mask, sem="relaxed")
    if LEARN_GAIN:
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=mask, other=0.0)
        _gain_grad(dg_ptr, tl.sum(w * acc, axis=1), offs_n, mask_n, pid_n * BLOCK_N, N, gain_group, GROUPS_PER_TILE)


@triton.jit
def _bwd_weight_transpose_kernel(
    src_ptr, dst_ptr, table_ptr, ENTRIES: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr
):
    gdc_prologue(GDC)
    # table row e: (w_offset, g_offset, rows N, cols K, gain_group, dst_offset, first_tile); tiles of entry e are
    # numbered from first_tile, row-major over (ceil(N / BLOCK), ceil(K / BLOCK))
    pid = tl.program_id(0)
    e = 0
    for i in tl.static_range(1, ENTRIES):
        e = tl.where(pid >= tl.load(table_ptr + i * 7 + 6), i, e)
    row = table_ptr + e * 7
    w_off, g_off, n, k = tl.load(row), tl.load(row + 1), tl.load(row + 2), tl.load(row + 3)
    gain_group, dst_off, first = tl.load(row + 4), tl.load(row + 5), tl.load(row + 6)
    t = pid - first
    tiles_k = (k + BLOCK - 1) // BLOCK
    offs_n = (t // tiles_k) * BLOCK + tl.arange(0, BLOCK)
    offs_k = (t % tiles_k) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs_n < n)[:, None] & (offs_k < k)[None, :]
    w = tl.load(src_ptr + w_off + offs_n[:, None] * k + offs_k[None, :], mask=mask, other=0.0)
    g = tl.load(src_ptr + g_off + offs_n // gain_group, mask=offs_n < n, other=0.0)
    v = w * g[:, None]
    hi, lo = tf32_hi_lo(v)  # lo = v - hi: the GPU compiler contracts it with the product into one FMA (exact remainder)
    out = dst_ptr + dst_off + offs_k[None, :] * n + offs_n[:, None]
    tl.store(out, hi, mask=mask)
    tl.store(out + n * k, lo, mask=mask)


def _block(n: int, cap: int) -> int:
    """Smallest power of two >= n, clamped to [16, cap] (tl.dot needs every tile dimension >= 16)."""
    return max(16, min(cap, triton.next_power_of_2(n)))


def _fwd_tiles(m: int, n: int, nets: int) -> tuple[tuple[int, int, int], int, int]:
    """(grid, BLOCK_M, BLOCK_N) of a forward launch of `nets` grid slices of an (m, n) output.
    Tiles from the H200 sweep at seed-scale shapes (results/h200/kernels/linear_sweep.csv): 128 x 128 x 32, 4 warps,
    3 stages; 64 columns where they pad N less than 128 do (N = 320: two nets 28.2 -> 23.2 us); BLOCK_N halves
    while there are fewer than 132 programs (one wave) and it can; never a single program (an idle second one)."""
    block_m, block_n = 128, _block(n, 128)
    if block_n == 128 and triton.cdiv(n, 64) * 64 < triton.cdiv(n, 128) * 128:
        block_n = 64
    grid_m = triton.cdiv(m, block_m)
    while block_n > 16 and grid_m * triton.cdiv(n, block_n) * nets < _MIN_PROGRAMS:
        block_n //= 2
    grid = (max(grid_m, 1 if triton.cdiv(n, block_n) * nets > 1 else 2), triton.cdiv(n, block_n), nets)
    return grid, block_m, block_n


def linear_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor,
    y: torch.Tensor,
    gain_group: int,
    relu: bool,
    *,
    rows: torch.Tensor | None = None,
    nets: int = 1,
    p_zstride: int = 0,
    x_zstride: int = 0,
    ddqn: bool = False,
    yt: torch.Tensor | None = None,
    x_tf32: bool = False,
    w_tf32: bool = False,
    out_tf32: bool = False,
) -> torch.Tensor:
    """y[z] = act(g[z][n // gain_group] * (x[z] @ w[z]^T) + b[z]) for z < nets, in one launch (TF32 tensor cores).

    Args:
        x: (R, K) float32 input rows (row stride may exceed K); with `rows`, row m of the product is x[rows[m]]
            (e.g. gathered straight from replay storage), else rows 0..M-1 (M = y.shape[-2]).
        w: (N, K) float32 contiguous view of the flat buffer of net 0; b: (N,), g: (ceil(N / gain_group),) views
            of the same buffer. Net z reads them `z * p_zstride` floats further (the target net's buffer).
        y: (nets, M, N) or (M, N) float32 contiguous output, fully overwritten.
        gain_group: rows of w sharing one gain (the row count of each stacked matrix); must be >= 1.
        relu: apply ReLU after the bias. rows: optional (M,) int64 row indices into x (not bounds-checked).
        nets: 1 or 2 networks in one launch; x_zstride: floats between the nets' inputs (0: shared input).
        ddqn: name the launch as the Double-DQN forward (`_fwd_ddqn_tf32_gemm_kernel`) instead of the online one.
        yt: optional (2, N, M) float32 contiguous output, fully overwritten with y^T split into TF32 parts [hi, lo]
            (kernels/tf32_split.py; nets = 1 only): the operand the next layer's weight-gradient GEMM reads
            (`linear_backward_weight`).
        x_tf32, w_tf32: the caller's word that x, w already hold TF32 values (low 13 mantissa bits zero: a
            previous launch's `out_tf32` output, a `tf32_round_copy`), so the kernel does not round them to TF32
            before the dot (module doc: rounded, not truncated by the MMA). Rounding x costs little (in registers,
            the MMA's A operand); rounding w 5x the GEMM (it goes back to shared memory: H200, 2026-12-02,
            results/h200/ab/tf32_rounding/): a step reads a rounded copy of its weights.
        out_tf32: store y rounded to TF32 (to nearest; so that a next layer reads it with x_tf32=True).
        On the interpreter the three are moot unless it emulates Hopper's dot (`rounds_tf32_operands`).
    Returns y. Grid (ceil(M / 128), ceil(N / BLOCK_N), nets), BLOCK_N <= 128 (64 where that pads N less)
    lowered until there are >= 132 programs or BLOCK_N = 16; never a single program (an idle second program is added
    for tiny shapes).
    Raises ValueError for wrong dtype, shape, device or contiguity, bad nets / gain_group, and with nets = 2 for a
    p_zstride that puts net 1's parameters past their storage (`check_net_stride`).
    """
    check_tensor("w", w, dtype=torch.float32, ndim=2)
    n, k = w.shape
    dev = w.device
    check_tensor("x", x, dtype=torch.float32, ndim=2, device=dev, contiguous=False)
    if x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x must be (R, {k}) with unit column stride, got shape {tuple(x.shape)} stride {x.stride()}")
    check_tensor("b", b, dtype=torch.float32, shape=(n,), device=dev)
    if gain_group < 1:
        raise ValueError(f"gain_group must be >= 1, got {gain_group}")
    check_tensor("g", g, dtype=torch.float32, shape=(-(-n // gain_group),), device=dev)
    if nets not in (1, 2):
        raise ValueError(f"nets must be 1 or 2, got {nets}")
    check_tensor("y", y, dtype=torch.float32, device=dev)
    m = y.shape[-2] if y.ndim >= 2 else -1
    if tuple(y.shape) not in ((m, n), (nets, m, n)) or (nets == 2 and y.ndim != 3) or m < 1:
        raise ValueError(f"y must be (M, {n}) or ({nets}, M, {n}), got {tuple(y.shape)}")
    if rows is not None:
        check_tensor("rows", rows, dtype=torch.int64, shape=(m,), device=dev)
    elif x.shape[0] < m:
        raise ValueError(f"x has {x.shape[0]} rows, y needs {m}")
    if nets == 2:
        check_net_stride(p_zstride, ("w", w), ("b", b), ("g", g))
    if yt is not None:
        if nets != 1:
            raise ValueError("yt (the transposed output) is for one net only (nets = 1)")
        check_tensor("yt", yt, dtype=torch.float32, shape=(2, n, m), device=dev)
    # With yt, 8 warps: the split transposed store spills at 4 (108 bytes per thread at 128 x 64 with a gathered
    # input, compiled for sm90 here; the sweep had 8 warps within 10% of 4 at these shapes).
    grid, block_m, block_n = _fwd_tiles(m, n, nets)
    kernel = _fwd_ddqn_tf32_gemm_kernel if ddqn else _fwd_online_tf32_gemm_kernel
    rnd = rounds_tf32_operands()
    kernel[grid](
        x,
        rows if rows is not None else x,
        w,
        b,
        g,
        y,
        yt if yt is not None else y,
        m,
        n,
        k,
        x.stride(0),
        x_zstride,
        p_zstride,
        m * n,
        gain_group,
        GATHER=rows is not None,
        RELU=relu,
        STORE_T=yt is not None,
        ROUND_X=rnd and not x_tf32,
        ROUND_W=rnd and not w_tf32,
        ROUND_Y=rnd and out_tf32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=_block(k, 32),
        num_warps=8 if yt is not None else 4,
        num_stages=3,
        **pdl_kwargs(),
    )
    return y


def linear_forward_grouped(
    x: torch.Tensor,
    x_next: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor,
    y: torch.Tensor,
    y_next: torch.Tensor,
    gain_group: int,
    relu: bool,
    *,
    p_zstride: int,
    rows: torch.Tensor | None = None,
    yt: torch.Tensor | None = None,
    x_tf32: bool = False,
    w_tf32: bool = False,
    out_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The three forwards of a learner step through one layer in ONE launch (`_fwd_grouped_tf32_gemm_kernel`, grid
    z = 3): z = 0 the online net on s, y = act(g * (x @ w^T) + b) (and y^T, with `yt`); z = 1 the online net and
    z = 2 the target net on s', y_next[z - 1] from x_next with net z - 1's parameters (`p_zstride` floats after
    net 0's). The same body and arithmetic as `linear_forward` (each output equals what `linear_forward` writes
    with nets = 1 for z = 0 and nets = 2, ddqn = True for z = 1, 2), in one launch of ~1.5x the programs of the
    larger of those two instead of two launches. Source: issue 38, lever 2 ("fewer, fuller launches").

    Args:
        x: (R, K) float32 input rows of the online net on s (row stride may exceed K, unit column stride); with
            `rows`, row m of the product is x[rows[m]], else rows 0..M-1 (M = y.shape[0]).
        x_next: the input on s': (R', K) rows shared by both nets (e.g. replay storage, gathered by `rows` too),
            or (2, R', K) one per net (the previous layer's y_next); unit column stride, any row stride.
        w: (N, K) float32 contiguous view of net 0's flat buffer; b: (N,), g: (ceil(N / gain_group),) views of the
            same buffer; the target net reads them `p_zstride` floats further.
        y: (M, N) and y_next: (2, M, N) float32 contiguous outputs, fully overwritten (y_next[0]: online, [1]:
            target).
        gain_group: rows of w sharing one gain; must be >= 1. relu: apply ReLU after the bias.
        p_zstride: floats from net 0's parameters to net 1's (an int >= 0). rows: optional (M,) int64 row indices
            into x and x_next (not bounds-checked).
        yt: optional (2, N, M) float32 contiguous output, fully overwritten with y^T split into TF32 parts (z = 0
            only; `linear_forward`'s yt).
        x_tf32, w_tf32, out_tf32: as `linear_forward`'s (for all three forwards).
    All tensors on one device (CUDA, or the CPU under TRITON_INTERPRET=1). Returns (y, y_next).
    Grid (ceil(M / 128), ceil(N / BLOCK_N), 3), tiles chosen as `linear_forward` chooses them for 3 nets; 8 warps
    with yt, else 4 (`linear_forward`'s rule).
    Raises ValueError, naming the input, for a wrong dtype, shape, device, stride or contiguity, gain_group < 1 or
    a p_zstride that is not an int >= 0 or puts net 1's parameters past their storage (`check_net_stride`); all
    checked before the launch.
    """
    check_tensor("w", w, dtype=torch.float32, ndim=2)
    n, k = w.shape
    dev = w.device
    check_tensor("x", x, dtype=torch.float32, ndim=2, device=dev, contiguous=False)
    if x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x must be (R, {k}) with unit column stride, got shape {tuple(x.shape)} stride {x.stride()}")
    check_tensor("x_next", x_next, dtype=torch.float32, device=dev, contiguous=False)
    if x_next.ndim not in (2, 3) or (x_next.ndim == 3 and x_next.shape[0] != 2):
        raise ValueError(f"x_next must be (R, {k}) or (2, R, {k}), got shape {tuple(x_next.shape)}")
    if x_next.shape[-1] != k or x_next.stride(-1) != 1:
        raise ValueError(
            f"x_next must be (R, {k}) or (2, R, {k}) with unit column stride, got shape {tuple(x_next.shape)} "
            f"stride {x_next.stride()}"
        )
    check_tensor("b", b, dtype=torch.float32, shape=(n,), device=dev)
    if isinstance(gain_group, bool) or not isinstance(gain_group, int) or gain_group < 1:
        raise ValueError(f"gain_group must be an int >= 1, got {gain_group!r}")
    check_tensor("g", g, dtype=torch.float32, shape=(-(-n // gain_group),), device=dev)
    check_tensor("y", y, dtype=torch.float32, ndim=2, device=dev)
    m = y.shape[0]
    if y.shape[1] != n or m < 1:
        raise ValueError(f"y must be (M, {n}) with M >= 1, got {tuple(y.shape)}")
    check_tensor("y_next", y_next, dtype=torch.float32, shape=(2, m, n), device=dev)
    if rows is not None:
        check_tensor("rows", rows, dtype=torch.int64, shape=(m,), device=dev)
    elif x.shape[0] < m or x_next.shape[-2] < m:
        raise ValueError(f"x has {x.shape[0]} rows and x_next {x_next.shape[-2]}, y needs {m}")
    if yt is not None:
        check_tensor("yt", yt, dtype=torch.float32, shape=(2, n, m), device=dev)
    check_net_stride(p_zstride, ("w", w), ("b", b), ("g", g))
    grid, block_m, block_n = _fwd_tiles(m, n, 3)
    rnd = rounds_tf32_operands()
    _fwd_grouped_tf32_gemm_kernel[grid](
        x,
        x_next,
        rows if rows is not None else x,
        w,
        b,
        g,
        y,
        y_next,
        yt if yt is not None else y,
        m,
        n,
        k,
        x.stride(0),
        x_next.stride(-2),
        x_next.stride(0) if x_next.ndim == 3 else 0,
        p_zstride,
        gain_group,
        GATHER=rows is not None,
        RELU=relu,
        STORE_T=yt is not None,
        ROUND_X=rnd and not x_tf32,
        ROUND_W=rnd and not w_tf32,
        ROUND_Y=rnd and out_tf32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=_block(k, 32),
        num_warps=8 if yt is not None else 4,
        num_stages=3,
        **pdl_kwargs(),
    )
    return y, y_next


MAX_FUSED_K0 = 128
"""Widest input of the layer below whose weight gradient `linear_backward_input` can fuse (one tile of it)."""


def linear_backward_input(
    dy: torch.Tensor,
    wt: torch.Tensor,
    x: torch.Tensor,
    dxt: torch.Tensor | None,
    db: torch.Tensor,
    dx: torch.Tensor | None = None,
    *,
    weight_grad_below: tuple | None = None,
) -> torch.Tensor | None:
    """The previous layer's pre-activation gradient dz = (dy @ wt^T) masked to where x > 0, written as dz^T (and dz),
    and its bias gradient db += sum_m dz (split-precision FP32 tensor-core GEMM, both operands K-major).

    dy: (M, N) gradient w.r.t. this layer's pre-activation; wt: (2, K, N) this layer's weight transposed, scaled by
    its gains and split into TF32 parts [hi, lo] (kernels/tf32_split.py) of g[n // gain_group] W[n, k], as
    `WeightTranspose` writes it (the kernel splits dy in registers and multiplies the parts on TF32 tensor cores:
    3xTF32, FP32-accurate);
    x: (M, K) the layer's input, the previous
    layer's ReLU output; dxt: (K, M) output dz^T, fully overwritten (the previous layer's `linear_backward_weight`
    reads it), None with `weight_grad_below`; db: (K,) the previous layer's bias gradient, a view of the zeroed
    gradient buffer (fp32 atomic adds, max(2, ceil(M / 128)) per element); dx: optional (M, K) output dz (for the
    previous layer's own input gradient).
    weight_grad_below: optional (x0t, w0, g0, dw0, dg0, gain_group0): also the previous layer's weight gradient,
        as `linear_backward_weight(dz^T, x0t, w0, g0, dw0, dg0, gain_group0)` would add it, from each dz tile in
        registers (dz^T is then not written: dxt must be None): x0t (2, K0, M) that layer's input transposed and
        split into TF32 parts, K0 <= 128; w0 (K, K0), g0 (ceil(K / gain_group0),); dw0, dg0 views of the zeroed
        gradient buffer (atomic adds: each dw0 entry gets max(2, ceil(M / 128)) of them); dg0 None: that layer's
        gains are fixed (not learned), no gain gradient is computed or written.
    All float32, contiguous, on one device. Returns dxt.
    Raises ValueError for wrong dtype, shape, device or contiguity, or a weight_grad_below that does not fit.
    """
    check_tensor("wt", wt, dtype=torch.float32, ndim=3)
    if wt.shape[0] != 2:
        raise ValueError(f"wt must be (2, K, N): the hi and lo TF32 parts, got {tuple(wt.shape)}")
    _, k, n = wt.shape
    dev = wt.device
    check_tensor("dy", dy, dtype=torch.float32, ndim=2, device=dev)
    m = dy.shape[0]
    check_tensor("dy", dy, shape=(m, n))
    check_tensor("x", x, dtype=torch.float32, shape=(m, k), device=dev)
    if weight_grad_below is not None and dxt is not None:
        raise ValueError("dxt must be None with weight_grad_below: the fused kernel does not write dz^T")
    if weight_grad_below is None:
        check_tensor("dxt", dxt, dtype=torch.float32, shape=(k, m), device=dev)
    check_tensor("db", db, dtype=torch.float32, shape=(k,), device=dev)
    if dx is not None:
        check_tensor("dx", dx, dtype=torch.float32, shape=(m, k), device=dev)
    # the split-GEMM probe's best tf32x3 tiles with K-major operands (results/h200/kernels/split_gemm_probe.csv):
    # 128 x 128 outputs, 32-wide reduction steps, 8 warps, 3 stages
    block_m, block_k = 128, _block(k, 128)
    fused = _fused_weight_args(weight_grad_below, k, m, block_k, dev, db)
    grid = (max(triton.cdiv(m, block_m), 2), triton.cdiv(k, block_k))
    out = dxt if dxt is not None else x  # placeholder pointer when nothing of dz^T is stored
    _bwd_dx_fp32split_gemm_kernel[grid](
        dy,
        wt,
        x,
        dx if dx is not None else out,
        out,
        db,
        *fused["ptrs"],
        m,
        n,
        k,
        fused["k0"],
        fused["gain"],
        STORE_DX=dx is not None,
        FUSE_DW=weight_grad_below is not None,
        LEARN_GAIN0=fused["learn_gain"],
        GROUPS_PER_TILE=fused["groups"],
        BLOCK_M=block_m,
        BLOCK_N=_block(n, 32),
        BLOCK_K=block_k,
        BLOCK_J=fused["block_j"],
        num_warps=8,
        num_stages=3,
        **pdl_kwargs(),
    )
    return dxt


def _fused_weight_args(
    below: tuple | None, k: int, m: int, block_k: int, dev: torch.device, placeholder: torch.Tensor
) -> dict:
    """Checked kernel arguments of `linear_backward_input`'s weight_grad_below (placeholders when None)."""
    if below is None:  # never dereferenced (FUSE_DW = False): any float32 tensor
        return dict(ptrs=(placeholder,) * 5, k0=1, gain=1, groups=0, block_j=16, learn_gain=False)
    if len(below) != 6:
        raise ValueError(f"weight_grad_below must be (x0t, w0, g0, dw0, dg0, gain_group0), got {len(below)} items")
    x0t, w0, g0, dw0, dg0, gain0 = below
    check_tensor("w0", w0, dtype=torch.float32, ndim=2, device=dev)
    if w0.shape[0] != k or w0.shape[1] > MAX_FUSED_K0:
        raise ValueError(f"w0 must be ({k}, K0) with K0 <= {MAX_FUSED_K0}, got {tuple(w0.shape)}")
    k0 = w0.shape[1]
    if isinstance(gain0, bool) or not isinstance(gain0, int) or gain0 < 1:
        raise ValueError(f"gain_group0 must be an int >= 1, got {gain0!r}")
    groups = -(-k // gain0)
    for name, t, shape in (("x0t", x0t, (2, k0, m)), ("g0", g0, (groups,)), ("dw0", dw0, (k, k0))):
        check_tensor(name, t, dtype=torch.float32, shape=shape, device=dev)
    if dg0 is not None:
        check_tensor("dg0", dg0, dtype=torch.float32, shape=(groups,), device=dev)
    return dict(
        ptrs=(x0t, w0, g0, dw0, dg0 if dg0 is not None else dw0),
        k0=k0,
        gain=gain0,
        groups=_groups_per_tile(block_k, gain0),
        block_j=_block(k0, MAX_FUSED_K0),
        learn_gain=dg0 is not None,
    )


def _groups_per_tile(block: int, gain_group: int) -> int:
    """`_gain_grad`'s GROUPS_PER_TILE: how many gain groups a tile of `block` rows can touch, or 0 (one atomic per
    row) when that is more than 8."""
    per_tile = triton.cdiv(block - 1, gain_group) + 1
    return per_tile if per_tile <= 8 else 0


def linear_backward_weight(
    dyt: torch.Tensor,
    xt: torch.Tensor,
    w: torch.Tensor,
    g: torch.Tensor,
    dw: torch.Tensor,
    dg: torch.Tensor | None,
    gain_group: int,
) -> None:
    """Accumulate (atomic adds) dw += g * dy^T x and dg[j] += sum over group j's rows of sum(w * dy^T x), from
    dY^T and X^T (both operands K-major: the batch axis contiguous).

    dyt: (N, M) this layer's pre-activation gradient, transposed; xt: (2, K, M) its input, transposed and split into
    TF32 parts [hi, lo] (kernels/tf32_split.py; the kernel splits dyt in registers: 3xTF32); w: (N, K) and
    g: (ceil(N / gain_group),) the layer's parameters; dw (N, K), dg like g: views of the gradient buffer, which
    the caller zeroes once before the backward; dg None: the gains are fixed (not learned: spectral norm off for
    this layer), no gain gradient is computed or written (w is then not read). The bias gradient comes from whoever
    wrote dyt (`linear_backward_input`, `hotloop.kernels.heads.heads_backward`). Split over M into enough parts for
    >= 132 programs; fp32 atomic adds make the summation order (and the last bits) vary run to run; dg gets one
    atomic per program for each gain group its tile can touch (at most 8; with smaller groups, one per row).
    Raises ValueError for wrong dtype, shape, device or contiguity, or gain_group < 1.
    """
    check_tensor("w", w, dtype=torch.float32, ndim=2)
    n, k = w.shape
    dev = w.device
    check_tensor("dyt", dyt, dtype=torch.float32, ndim=2, device=dev)
    m = dyt.shape[1]
    check_tensor("dyt", dyt, shape=(n, m))
    check_tensor("xt", xt, dtype=torch.float32, shape=(2, k, m), device=dev)
    if gain_group < 1:
        raise ValueError(f"gain_group must be >= 1, got {gain_group}")
    groups = -(-n // gain_group)
    for name, t, shape in (("g", g, (groups,)), ("dw", dw, (n, k))):
        check_tensor(name, t, dtype=torch.float32, shape=shape, device=dev)
    if dg is not None:
        check_tensor("dg", dg, dtype=torch.float32, shape=(groups,), device=dev)
    # probe's best K-major tf32x3 tiles: 128 x 128 outputs, 32 rows per reduction step, 8 warps, 3 stages
    block_n, block_k, block_m = _block(n, 128), _block(k, 128), 32
    tiles = triton.cdiv(n, block_n) * triton.cdiv(k, block_k)
    splits = max(1, min(triton.cdiv(m, block_m), triton.cdiv(_MIN_PROGRAMS, tiles)))
    rows_per_split = triton.cdiv(triton.cdiv(m, splits), block_m) * block_m
    splits = max(triton.cdiv(m, rows_per_split), 2 if tiles == 1 else 1)  # an idle split rather than one program
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k), splits)
    _bwd_dw_fp32split_gemm_kernel[grid](
        dyt,
        xt,
        w,
        g,
        dw,
        dg if dg is not None else dw,
        m,
        n,
        k,
        gain_group,
        rows_per_split,
        LEARN_GAIN=dg is not None,
        GROUPS_PER_TILE=_groups_per_tile(block_n, gain_group),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=8,
        num_stages=3,
        **pdl_kwargs(),
    )


class WeightTranspose:
    """Writes g-scaled transposed copies of weight matrices of a flat parameter buffer, split into TF32 parts, all
    in one launch: with v = g[n // gain_group] * W[n, k], dst[dst_offset + k * N + n] = hi = tf32(v) and
    dst[dst_offset + N * K + k * N + n] = tf32(v - hi) (tf32: round to nearest, ties away, as cvt.rna.tf32.f32;
    kernels/tf32_split.py) for every entry: the operand `linear_backward_input` reads, K-major for Hopper's TF32
    tensor cores and split ahead of time for its 3xTF32 product.

    Args:
        entries: per matrix (w_offset, g_offset, rows N, cols K, gain_group) into the source buffer; the copies are
            packed in `dst` in this order (offsets in `dst_offsets`, sizes 2 * N * K: hi, then lo).
        device: where the table lives.
    Attributes: dst_offsets (list of int), numel (floats of dst), tiles (tiles of BLOCK x BLOCK; the launch has
    max(2, tiles) programs), src_numel (floats the table reads from the source buffer).
    Raises ValueError for an empty list, non-int entries, negative offsets or non-positive sizes.
    """

    BLOCK = 64

    def __init__(self, entries: list[tuple[int, int, int, int, int]], device: torch.device) -> None:
        if not entries:
            raise ValueError("WeightTranspose needs at least one matrix")
        rows, self.dst_offsets, pos, tiles, self.src_numel = [], [], 0, 0, 0
        for entry in entries:
            w_off, g_off, n, k, gain_group = entry
            if (
                any(isinstance(v, bool) or not isinstance(v, int) for v in entry)
                or min(n, k, gain_group) < 1
                or min(w_off, g_off) < 0
            ):
                raise ValueError(f"WeightTranspose: bad entry {tuple(entry)} (ints; offsets >= 0, sizes >= 1)")
            rows.append((w_off, g_off, n, k, gain_group, pos, tiles))
            self.src_numel = max(self.src_numel, w_off + n * k, g_off + -(-n // gain_group))
            self.dst_offsets.append(pos)
            pos += 2 * n * k
            tiles += triton.cdiv(n, self.BLOCK) * triton.cdiv(k, self.BLOCK)
        self.numel, self.tiles, self.shapes = pos, tiles, [(n, k) for _, _, n, k, _ in entries]
        self.table = torch.tensor(rows, dtype=torch.int64, device=device)

    def views(self, dst: torch.Tensor) -> list[torch.Tensor]:
        """The (2, K, N) split transposed matrices inside `dst` (numel floats; [0] hi, [1] lo), in entry order."""
        return [dst[o : o + 2 * n * k].view(2, k, n) for o, (n, k) in zip(self.dst_offsets, self.shapes)]

    def __call__(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """One launch of max(2, tiles) programs; src: the (P,) float32 parameter buffer, dst: (numel,) float32.
        Raises ValueError for wrong dtype, shape or device."""
        check_tensor("src", src, dtype=torch.float32, ndim=1, device=self.table.device)
        if src.shape[0] < self.src_numel:
            raise ValueError(f"src has {src.shape[0]} floats, the table reads up to {self.src_numel}")
        check_tensor("dst", dst, dtype=torch.float32, shape=(self.numel,), device=self.table.device)
        _bwd_weight_transpose_kernel[(max(2, self.tiles),)](
            src,
            dst,
            self.table,
            ENTRIES=len(self.dst_offsets),
            BLOCK=self.BLOCK,
            **pdl_kwargs(),
        )


def linear_reference(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor, gain_group: int, relu: bool
) -> torch.Tensor:
    """Plain-torch y = act(g[n // gain_group] * (x @ w^T) + b) in x's dtype (use float64 for a reference)."""
    scale = g.repeat_interleave(gain_group)[: w.shape[0]]
    y = (x @ w.T) * scale + b
    return torch.relu(y) if relu else y
