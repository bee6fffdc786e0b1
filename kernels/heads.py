"""Dueling, branching output heads in one launch each way: Q_d(s, a) = V(s) + A_d(s, a) - mean_a' A_d(s, a').

Architecture: Wang et al. 2016 (dueling) with the action branches of Tavakoli et al. 2018 (BDQ), as the reference
network trainer/network.py. The input h (M, (1 + D) * H) is the stacked ReLU output of the value head's hidden
layer (columns [0, H)) and of each branch's hidden layer (columns [(1 + d) H, (2 + d) H)). The output layer is
block-diagonal: row 0 of W_out (J, H), J = 1 + D * A, maps the value block to V; row 1 + d * A + a maps branch
d's block to A_d(., a). Gains g_out (1 + D,) (one per matrix: value, then each branch) and biases b_out (J,).

- `heads_forward`: one launch for one or two networks (online and target on s'), TF32 dots on operands rounded
  to TF32 first (forward placement, kernels/linear.py),
  Q written as (M, D * A) (= (M, D, A) contiguous); `heads_forward_grouped`: the step's three (online on s,
  online and target on s') in one launch.
- `heads_backward`: from dQ (M, D * A): dh (masked by h > 0, i.e. the hidden layers' pre-activation gradient)
  in IEEE FP32 on CUDA cores (each block's products have 1 or A terms: no tensor-core MMA, no split), written as
  dh and dh^T (kernels/linear.py says why both layouts), and
  the hidden layers' bias gradient, dW_out, db_out, dg_out accumulated by fp32 atomic adds into the zeroed
  gradient buffer.
Reference: `heads_reference` (plain torch; autograd gives every gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_net_stride, check_tensor, rounds_tf32_operands
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs
from hotloop.kernels.linear import grouped_pointers
from hotloop.kernels.tf32_split import tf32_rna

# forward tiles from the H200 sweep at seed scale (results/h200/kernels/heads_fwd_sweep.csv): 64 rows, 16-wide reduction
# steps, 4 warps: 6.6 us for one net and 7.5 us for two, against 10.0 / 10.3 us with 128 rows and 64-wide steps
_BLOCK_M = 64
_BLOCK_K = 16
# backward launch: programs in all (a target: row groups x (1 + D) input blocks, rounded to whole row blocks),
# rows per iteration, warps. From the H200 sweep at seed scale (results/h200/kernels/heads_bwd_sweep.csv, isolated):
# target 264 x 64 rows x 4 warps (256 programs of 128 rows launched) 17.4 us; target 132 x 32 x 8 (128 programs,
# one per SM) 60.3 us; 8 warps were 2-3.5x slower than 4 at every size
BWD_PROGRAMS, BWD_BLOCK_M, BWD_WARPS = 264, 64, 4


@triton.jit
def _heads_fwd_body(
    h_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    q_ptr,
    M,
    H,
    h_zstride,
    p_zstride,
    q_zstride,
    D: tl.constexpr,
    A: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    z = tl.program_id(1)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    j = tl.arange(0, BLOCK_J)
    mask_j = j < 1 + D * A
    grp = tl.where(j == 0, 0, (j - 1) // A + 1)
    width = (1 + D) * H
    acc = tl.zeros((BLOCK_M, BLOCK_J), dtype=tl.float32)
    for blk in tl.static_range(1 + D):
        for k0 in range(0, H, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < H
            x = tl.load(
                h_ptr + z * h_zstride + offs_m[:, None] * width + blk * H + offs_k[None, :],
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            w = tl.load(
                w_ptr + z * p_zstride + j[None, :] * H + offs_k[:, None],
                mask=mask_k[:, None] & (mask_j & (grp == blk))[None, :],
                other=0.0,
            )
            if ROUND_X:  # to the nearest TF32 value first, where nobody did before (kernels/linear.py's forward)
                x = tf32_rna(x)
            if ROUND_W:
                w = tf32_rna(w)
            acc = tl.dot(x, w, acc, input_precision="tf32")
    g = tl.load(g_ptr + z * p_zstride + grp, mask=mask_j, other=0.0)
    b = tl.load(b_ptr + z * p_zstride + j, mask=mask_j, other=0.0)
    out = acc * g[None, :] + b[None, :]
    value = tl.sum(tl.where((j == 0)[None, :], out, 0.0), axis=1)
    mean = tl.zeros((BLOCK_M, BLOCK_J), dtype=tl.float32)
    for d in tl.static_range(D):
        sel = (grp == d + 1) & mask_j
        mean_d = tl.sum(tl.where(sel[None, :], out, 0.0), axis=1) / A
        mean += tl.where(sel[None, :], mean_d[:, None], 0.0)
    q = value[:, None] + out - mean
    tl.store(
        q_ptr + z * q_zstride + offs_m[:, None] * (D * A) + (j - 1)[None, :],
        q,
        mask=mask_m[:, None] & (mask_j & (j >= 1))[None, :],
    )


# the same body under two names, for phase attribution by kernel name (see kernels/linear.py); a third name,
# `_heads_grouped_tf32_kernel` ("forward"), runs the step's three heads forwards in one launch
@triton.jit
def _heads_online_tf32_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    q_ptr,
    M,
    H,
    h_zstride,
    p_zstride,
    q_zstride,
    D: tl.constexpr,
    A: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    _heads_fwd_body(
        h_ptr,
        w_ptr,
        b_ptr,
        g_ptr,
        q_ptr,
        M,
        H,
        h_zstride,
        p_zstride,
        q_zstride,
        D,
        A,
        ROUND_X,
        ROUND_W,
        BLOCK_M,
        BLOCK_J,
        BLOCK_K,
    )


@triton.jit
def _heads_ddqn_tf32_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    q_ptr,
    M,
    H,
    h_zstride,
    p_zstride,
    q_zstride,
    D: tl.constexpr,
    A: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    _heads_fwd_body(
        h_ptr,
        w_ptr,
        b_ptr,
        g_ptr,
        q_ptr,
        M,
        H,
        h_zstride,
        p_zstride,
        q_zstride,
        D,
        A,
        ROUND_X,
        ROUND_W,
        BLOCK_M,
        BLOCK_J,
        BLOCK_K,
    )


@triton.jit
def _heads_grouped_tf32_kernel(
    h_ptr,
    hn_ptr,
    w_ptr,
    b_ptr,
    g_ptr,
    q_ptr,
    qn_ptr,
    M,
    H,
    p_zstride,
    D: tl.constexpr,
    A: tl.constexpr,
    ROUND_X: tl.constexpr,
    ROUND_W: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    # the step's three heads forwards in one launch (`heads_forward_grouped`): z = 0 the online net on s (h -> q),
    # z = 1, 2 the online and the target net on s' (hn[z - 1] -> qn[z - 1]); the target's parameters are
    # p_zstride floats after the online ones. Each program picks its pointers, then runs the body with z-strides 0.
    z = tl.program_id(1)
    h_sel, q_sel, p_off = grouped_pointers(z, h_ptr, hn_ptr, M * ((1 + D) * H), q_ptr, qn_ptr, M * (D * A), p_zstride)
    _heads_fwd_body(
        h_sel,
        w_ptr + p_off,
        b_ptr + p_off,
        g_ptr + p_off,
        q_sel,
        M,
        H,
        0,
        0,
        0,
        D,
        A,
        ROUND_X,
        ROUND_W,
        BLOCK_M,
        BLOCK_J,
        BLOCK_K,
    )


@triton.jit
def _heads_bwd_fp32_kernel(
    h_ptr,
    dq_ptr,
    w_ptr,
    g_ptr,
    dh_ptr,
    dht_ptr,
    dbh_ptr,
    dw_ptr,
    db_ptr,
    dg_ptr,
    M,
    H,
    rows_per_program,
    D: tl.constexpr,
    A: tl.constexpr,
    LEARN_GAIN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    # program (pid, blk): rows [pid * rows_per_program, +rows_per_program) of input block blk (0: value, 1 + d:
    # branch d). The block feeds R output rows of W_out (1 for the value, A for a branch): its products have R
    # terms, done as IEEE FP32 FMAs on CUDA cores (no MMA, no split). Its weight-gradient rows stay in registers
    # over the rows and are added to the buffer once (few atomics).
    pid = tl.program_id(0)
    blk = tl.program_id(1)
    r = tl.arange(0, BLOCK_R)
    live_r = r < tl.where(blk == 0, 1, A)  # the block's rows of W_out: 1 (value) or A (a branch)
    j = tl.where(blk == 0, 0, 1 + (blk - 1) * A + r)  # the block's rows of W_out
    q = tl.arange(0, BLOCK_Q)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < H
    width = (1 + D) * H
    w = tl.load(w_ptr + j[:, None] * H + offs_k[None, :], mask=live_r[:, None] & mask_k[None, :], other=0.0)
    g = tl.load(g_ptr + blk)
    gw = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_R,), dtype=tl.float32)
    dbh = tl.zeros((BLOCK_K,), dtype=tl.float32)
    start = pid * rows_per_program
    for m0 in range(start, start + rows_per_program, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        # dQ -> d(block output): V gets the sum over every branch's Q; A_d(a) gets dQ_d(a) - mean_a' dQ_d(a')
        dq_all = tl.load(
            dq_ptr + offs_m[:, None] * (D * A) + q[None, :], mask=mask_m[:, None] & (q < D * A)[None, :], other=0.0
        )
        dq_blk = tl.load(
            dq_ptr + offs_m[:, None] * (D * A) + (j - 1)[None, :],
            mask=mask_m[:, None] & (live_r & (j >= 1))[None, :],
            other=0.0,
        )
        dvalue = tl.where((r == 0)[None, :], tl.sum(dq_all, axis=1)[:, None], 0.0)
        dadv = dq_blk - tl.sum(dq_blk, axis=1)[:, None] / A
        dout = tl.where(mask_m[:, None] & live_r[None, :], tl.where(blk == 0, dvalue, dadv), 0.0)
        xmask = mask_m[:, None] & mask_k[None, :]
        x = tl.load(h_ptr + offs_m[:, None] * width + blk * H + offs_k[None, :], mask=xmask, other=0.0)
        dh = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for rr in tl.static_range(A):  # R FMAs per entry, one output row at a time: written out rather than as
            # sum(a[:, :, None] * b[None, :, :]), which Triton 3.6 turns into a TF32 tensor-core dot on sm90
            dout_r = tl.sum(tl.where((r == rr)[None, :], dout, 0.0), axis=1)
            w_r = tl.sum(tl.where((r == rr)[:, None], w, 0.0), axis=0)
            dh += dout_r[:, None] * (g * w_r)[None, :]
            gw += tl.where((r == rr)[:, None], tl.sum(dout_r[:, None] * x, axis=0)[None, :], 0.0)
        dh = tl.where(x > 0.0, dh, 0.0)
        tl.store(dh_ptr + offs_m[:, None] * width + blk * H + offs_k[None, :], dh, mask=xmask)
        tl.store(dht_ptr + (blk * H + offs_k)[None, :] * M + offs_m[:, None], dh, mask=xmask)
        dbh += tl.sum(dh, axis=0)
        dbias += tl.sum(dout, axis=0)
    tl.atomic_add(
        dw_ptr + j[:, None] * H + offs_k[None, :], gw * g, mask=live_r[:, None] & mask_k[None, :], sem="relaxed"
    )
    if LEARN_GAIN:
        tl.atomic_add(dg_ptr + blk, tl.sum(tl.sum(w * gw, axis=1), axis=0), sem="relaxed")
    tl.atomic_add(db_ptr + j, dbias, mask=live_r, sem="relaxed")
    tl.atomic_add(dbh_ptr + blk * H + offs_k, dbh, mask=mask_k, sem="relaxed")


def _sizes(w_out: torch.Tensor, branches: int) -> tuple[int, int, int]:
    j, hidden = w_out.shape
    if branches < 1 or (j - 1) % branches or j < 2:
        raise ValueError(f"w_out must be (1 + D * A, H) for D = {branches} branches, got {tuple(w_out.shape)}")
    return j, hidden, (j - 1) // branches


def heads_forward(
    h: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
    g_out: torch.Tensor,
    q: torch.Tensor,
    branches: int,
    *,
    nets: int = 1,
    p_zstride: int = 0,
    ddqn: bool = False,
    x_tf32: bool = False,
    w_tf32: bool = False,
) -> torch.Tensor:
    """Q of every branch from the stacked hidden features, in one launch (TF32 dots).

    h: (M, (1 + D) H) or (nets, M, (1 + D) H) float32 contiguous; w_out (1 + D A, H), b_out (1 + D A,),
    g_out (1 + D,): views of net 0's flat buffer (net z reads them z * p_zstride floats further); q: (M, D * A) or
    (nets, M, D * A) float32 contiguous, fully overwritten. branches: D. nets: 1 or 2. ddqn: launch under the
    Double-DQN kernel name. x_tf32, w_tf32: h, w_out already hold TF32 values (as kernels/linear.py's
    `linear_forward` says): the kernel does not round them before the dot. Returns q. Grid (max(2, ceil(M / 64)), nets).
    Raises ValueError for wrong dtype, shape, device or contiguity, and with nets = 2 for a p_zstride that puts
    net 1's parameters past their storage (`check_net_stride`).
    """
    j, hidden, actions = _sizes(check_tensor("w_out", w_out, dtype=torch.float32, ndim=2), branches)
    dev = w_out.device
    if nets not in (1, 2):
        raise ValueError(f"nets must be 1 or 2, got {nets}")
    check_tensor("h", h, dtype=torch.float32, device=dev)
    m = h.shape[-2] if h.ndim >= 2 else 0
    lead = (nets,) if h.ndim == 3 else ()
    if h.ndim not in (2, 3) or (nets == 2 and h.ndim != 3) or tuple(h.shape) != (*lead, m, (1 + branches) * hidden):
        raise ValueError(f"h must be (M, {(1 + branches) * hidden}) or ({nets}, M, ...), got {tuple(h.shape)}")
    check_tensor("b_out", b_out, dtype=torch.float32, shape=(j,), device=dev)
    check_tensor("g_out", g_out, dtype=torch.float32, shape=(1 + branches,), device=dev)
    check_tensor("q", q, dtype=torch.float32, shape=(*lead, m, branches * actions), device=dev)
    if nets == 2:
        check_net_stride(p_zstride, ("w_out", w_out), ("b_out", b_out), ("g_out", g_out))
    kernel = _heads_ddqn_tf32_kernel if ddqn else _heads_online_tf32_kernel
    kernel[(max(2, triton.cdiv(m, _BLOCK_M)), nets)](
        h,
        w_out,
        b_out,
        g_out,
        q,
        m,
        hidden,
        m * (1 + branches) * hidden,
        p_zstride,
        m * branches * actions,
        D=branches,
        A=actions,
        ROUND_X=rounds_tf32_operands() and not x_tf32,
        ROUND_W=rounds_tf32_operands() and not w_tf32,
        BLOCK_M=_BLOCK_M,
        BLOCK_J=max(16, triton.next_power_of_2(j)),
        BLOCK_K=_BLOCK_K,
        num_warps=4,
        **pdl_kwargs(),
    )
    return q


def heads_forward_grouped(
    h: torch.Tensor,
    h_next: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor,
    g_out: torch.Tensor,
    q: torch.Tensor,
    q_next: torch.Tensor,
    branches: int,
    *,
    p_zstride: int,
    x_tf32: bool = False,
    w_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The three heads forwards of a learner step in ONE launch (`_heads_grouped_tf32_kernel`, grid z = 3): z = 0
    the online net on s (h -> q), z = 1 the online and z = 2 the target net on s' (h_next[z - 1] -> q_next[z - 1]),
    net 1's parameters `p_zstride` floats after net 0's. The same body and arithmetic as `heads_forward` (q as
    its nets = 1 launch writes it, q_next as its nets = 2, ddqn = True one). Source: issue 38, lever 2 ("fewer,
    fuller launches").

    h: (M, (1 + D) H) and h_next: (2, M, (1 + D) H) float32 contiguous; w_out (1 + D A, H), b_out (1 + D A,),
    g_out (1 + D,): views of net 0's flat buffer; q: (M, D * A) and q_next: (2, M, D * A) float32 contiguous,
    fully overwritten. branches: D. p_zstride: an int >= 0. x_tf32, w_tf32: as `heads_forward`'s. All on one
    device (CUDA, or the CPU under TRITON_INTERPRET=1). Returns (q, q_next). Grid (ceil(M / 64), 3).
    Raises ValueError, naming the input, for a wrong dtype, shape, device or contiguity, or a bad p_zstride; all
    checked before the launch.
    """
    j, hidden, actions = _sizes(check_tensor("w_out", w_out, dtype=torch.float32, ndim=2), branches)
    dev = w_out.device
    width = (1 + branches) * hidden
    check_tensor("h", h, dtype=torch.float32, ndim=2, device=dev)
    m = h.shape[0]
    if h.shape[1] != width or m < 1:
        raise ValueError(f"h must be (M, {width}) with M >= 1, got {tuple(h.shape)}")
    check_tensor("h_next", h_next, dtype=torch.float32, shape=(2, m, width), device=dev)
    check_tensor("b_out", b_out, dtype=torch.float32, shape=(j,), device=dev)
    check_tensor("g_out", g_out, dtype=torch.float32, shape=(1 + branches,), device=dev)
    check_tensor("q", q, dtype=torch.float32, shape=(m, branches * actions), device=dev)
    check_tensor("q_next", q_next, dtype=torch.float32, shape=(2, m, branches * actions), device=dev)
    check_net_stride(p_zstride, ("w_out", w_out), ("b_out", b_out), ("g_out", g_out))
    _heads_grouped_tf32_kernel[(triton.cdiv(m, _BLOCK_M), 3)](
        h,
        h_next,
        w_out,
        b_out,
        g_out,
        q,
        q_next,
        m,
        hidden,
        p_zstride,
        D=branches,
        A=actions,
        ROUND_X=rounds_tf32_operands() and not x_tf32,
        ROUND_W=rounds_tf32_operands() and not w_tf32,
        BLOCK_M=_BLOCK_M,
        BLOCK_J=max(16, triton.next_power_of_2(j)),
        BLOCK_K=_BLOCK_K,
        num_warps=4,
        **pdl_kwargs(),
    )
    return q, q_next


def heads_backward(
    h: torch.Tensor,
    dq: torch.Tensor,
    w_out: torch.Tensor,
    g_out: torch.Tensor,
    dh: torch.Tensor,
    dht: torch.Tensor,
    db_h: torch.Tensor,
    dw_out: torch.Tensor,
    db_out: torch.Tensor,
    dg_out: torch.Tensor | None,
    branches: int,
) -> torch.Tensor:
    """Backward of `heads_forward` for one net: dh and dh^T (overwritten) and atomic accumulation of the hidden
    layers' bias gradient db_h and of dw_out, db_out, dg_out.

    h: (M, (1 + D) H) the saved forward input (ReLU outputs); dq: (M, D * A) dObjective/dQ; w_out, g_out: the
    parameters; dh: (M, (1 + D) H) output, the gradient w.r.t. the hidden layers' pre-activations (zero where
    h == 0); dht: ((1 + D) H, M) the same transposed (what the hidden layer's `linear_backward_weight` reads);
    db_h ((1 + D) H,) += sum_m dh, the hidden layers' bias gradient; dw_out (1 + D A, H), db_out (1 + D A,),
    dg_out (1 + D,): db_h and these are views of the zeroed gradient buffer; dg_out None: the output layer's gains
    are fixed (not learned: spectral norm off for it), no gain gradient is computed or written.
    All float32 contiguous on one device. Returns dh. Grid (row groups, 1 + D), at most about BWD_PROGRAMS
    programs, each over a run of BWD_BLOCK_M-row blocks; each keeps its block's weight-gradient rows (BLOCK_R x
    next_pow2(H) floats, so H up to a few hundred) in registers over its rows.
    Raises ValueError for wrong dtype, shape or device, or an h with no rows.
    """
    j, hidden, actions = _sizes(check_tensor("w_out", w_out, dtype=torch.float32, ndim=2), branches)
    dev = w_out.device
    check_tensor("h", h, dtype=torch.float32, ndim=2, device=dev)
    m = h.shape[0]
    if m < 1:
        raise ValueError(f"h must have at least one row, got shape {tuple(h.shape)}")
    for name, t, shape in (
        ("h", h, (m, (1 + branches) * hidden)),
        ("dq", dq, (m, branches * actions)),
        ("g_out", g_out, (1 + branches,)),
        ("dh", dh, (m, (1 + branches) * hidden)),
        ("dht", dht, ((1 + branches) * hidden, m)),
        ("db_h", db_h, ((1 + branches) * hidden,)),
        ("dw_out", dw_out, (j, hidden)),
        ("db_out", db_out, (j,)),
    ):
        check_tensor(name, t, dtype=torch.float32, shape=shape, device=dev)
    if dg_out is not None:
        check_tensor("dg_out", dg_out, dtype=torch.float32, shape=(1 + branches,), device=dev)
    block_q, block_k = triton.next_power_of_2(branches * actions), max(16, triton.next_power_of_2(hidden))
    # about BWD_PROGRAMS programs in all: row groups x (1 + D) input blocks
    groups = max(1, min(triton.cdiv(m, BWD_BLOCK_M), triton.cdiv(BWD_PROGRAMS, 1 + branches)))
    rows = triton.cdiv(triton.cdiv(m, groups), BWD_BLOCK_M) * BWD_BLOCK_M
    groups = max(triton.cdiv(m, rows), 2 if branches == 0 else 1)
    _heads_bwd_fp32_kernel[(groups, 1 + branches)](
        h,
        dq,
        w_out,
        g_out,
        dh,
        dht,
        db_h,
        dw_out,
        db_out,
        dg_out if dg_out is not None else db_out,
        m,
        hidden,
        rows,
        D=branches,
        A=actions,
        LEARN_GAIN=dg_out is not None,
        BLOCK_M=BWD_BLOCK_M,
        BLOCK_Q=block_q,
        BLOCK_R=max(2, triton.next_power_of_2(actions)),
        BLOCK_K=block_k,
        num_warps=BWD_WARPS,
        **pdl_kwargs(),
    )
    return dh


def heads_reference(
    h: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor, g_out: torch.Tensor, branches: int
) -> torch.Tensor:
    """Plain-torch Q (M, D, A) in h's dtype: V = g_0 (h_0 @ w_v) + b_v, A_d = g_d (h_d @ W_d^T) + b_d, Q_d = V +
    A_d - mean_a A_d (h split into 1 + D blocks of H columns)."""
    j, hidden, actions = _sizes(w_out, branches)
    blocks = h.split(hidden, dim=1)
    value = g_out[0] * (blocks[0] @ w_out[0]) + b_out[0]
    qs = []
    for d in range(branches):
        rows = slice(1 + d * actions, 1 + (d + 1) * actions)
        adv = g_out[1 + d] * (blocks[1 + d] @ w_out[rows].T) + b_out[rows]
        qs.append(value[:, None] + adv - adv.mean(dim=1, keepdim=True))
    return torch.stack(qs, dim=1)
