"""Fused linear layers over a flat parameter buffer: TF32 forward GEMMs, FP32-accurate backward GEMMs.

y = act(g[n // GAIN_GROUP] * (x @ W^T)[:, n] + b[n]) for a weight W (N, K), bias b (N,) and per-row-group gain g
(a spectral-normalized matrix times a learned scalar gain: sigma-reparam, Zhai et al. 2023; several matrices of
the same input stacked row-wise form one layer, each with its own gain). W, b and g are views (offsets) of one flat
fp32 buffer, so the online and the target network (two such buffers, `z_stride` floats apart) run in ONE launch
with a third grid axis.

Precision placement (issue "TF32 forward, FP32-accurate backward"): the forward kernels multiply on TF32 tensor
cores (`tl.dot(input_precision="tf32")`, ~1e-3 relative error); the backward kernels use Triton's "tf32x3"
split precision (three TF32 MMAs per product: hi*hi + hi*lo + lo*hi, Ootomo & Yokota 2022), which keeps IEEE FP32
accuracy on tensor cores. Kernel names carry the precision ("tf32" / "fp32split") and the phase ("online",
"ddqn", "bwd"), which is how the guards classify them (guards/step_metrics.py `gemm_precision`, phase rules).
Under TRITON_INTERPRET=1 every dot is a float32 numpy matmul (precision ignored): the CPU tests check the algebra,
the GPU tests the precision.

Backward of one layer (dY: gradient w.r.t. its pre-activation, already masked by its ReLU):
- `linear_backward_input`: dX = (dY * g) @ W, masked by (X > 0) (X is the previous ReLU's output, so this is the
  previous layer's pre-activation gradient); grid over (M, K) tiles.
- `linear_backward_weight`: dW = g * dY^T X, db = sum_m dY, dg = sum_{rows of the group} sum_k W * (dY^T X),
  split over M ("split-K") with fp32 atomic adds into the gradient buffer, which must be zeroed once per step
  before the backward (the step's one memset).
Plain-torch reference: `linear_reference` (autograd through it gives every gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_tensor

_MIN_PROGRAMS = 132  # one program per SM of a 132-SM H100/H200 at least, where the shape allows


@triton.jit
def _fwd_body(x_ptr, idx_ptr, w_ptr, b_ptr, g_ptr, y_ptr, M, N, K, stride_xm, x_zstride, p_zstride, y_zstride,
              gain_group, GATHER: tl.constexpr, RELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
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
        acc = tl.dot(x, w, acc, input_precision="tf32")
    g = tl.load(g_ptr + z * p_zstride + offs_n // gain_group, mask=mask_n, other=0.0)
    b = tl.load(b_ptr + z * p_zstride + offs_n, mask=mask_n, other=0.0)
    y = acc * g[None, :] + b[None, :]
    if RELU:
        y = tl.maximum(y, 0.0)
    tl.store(y_ptr + z * y_zstride + offs_m[:, None] * N + offs_n[None, :], y, mask=mask_m[:, None] & mask_n[None, :])


# Two thin kernels over one body: the same code under two names, because a graph replay carries no ranges and the
# guards assign its kernels to the "forward" / "ddqn_forward" phases by name (trainer/step.py PHASE_RULES).
@triton.jit
def _fwd_online_tf32_gemm_kernel(x_ptr, idx_ptr, w_ptr, b_ptr, g_ptr, y_ptr, M, N, K, stride_xm, x_zstride,
                                 p_zstride, y_zstride, gain_group, GATHER: tl.constexpr, RELU: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    _fwd_body(x_ptr, idx_ptr, w_ptr, b_ptr, g_ptr, y_ptr, M, N, K, stride_xm, x_zstride, p_zstride, y_zstride,
              gain_group, GATHER, RELU, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _fwd_ddqn_tf32_gemm_kernel(x_ptr, idx_ptr, w_ptr, b_ptr, g_ptr, y_ptr, M, N, K, stride_xm, x_zstride,
                               p_zstride, y_zstride, gain_group, GATHER: tl.constexpr, RELU: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    _fwd_body(x_ptr, idx_ptr, w_ptr, b_ptr, g_ptr, y_ptr, M, N, K, stride_xm, x_zstride, p_zstride, y_zstride,
              gain_group, GATHER, RELU, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _bwd_dx_fp32split_gemm_kernel(dy_ptr, w_ptr, g_ptr, x_ptr, dx_ptr, M, N, K, gain_group,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_k = offs_k < K
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        dy = tl.load(dy_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask_m[:, None] & mask_n[None, :],
                     other=0.0)
        g = tl.load(g_ptr + offs_n // gain_group, mask=mask_n, other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc = tl.dot(dy * g[None, :], w, acc, input_precision="tf32x3")
    mask = mask_m[:, None] & mask_k[None, :]
    x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask, other=0.0)
    tl.store(dx_ptr + offs_m[:, None] * K + offs_k[None, :], tl.where(x > 0.0, acc, 0.0), mask=mask)


@triton.jit
def _bwd_dw_fp32split_gemm_kernel(dy_ptr, x_ptr, idx_ptr, w_ptr, g_ptr, dw_ptr, db_ptr, dg_ptr, M, N, K, stride_xm,
                                  gain_group, rows_per_split, GATHER: tl.constexpr, BLOCK_M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    split = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_k = offs_k < K
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    m_start = split * rows_per_split
    for m0 in range(m_start, m_start + rows_per_split, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        if GATHER:
            rows = tl.load(idx_ptr + offs_m, mask=mask_m, other=0)
        else:
            rows = offs_m.to(tl.int64)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)
        dyt = tl.load(dy_ptr + offs_n[:, None] + offs_m[None, :] * N, mask=mask_n[:, None] & mask_m[None, :],
                      other=0.0)
        acc = tl.dot(dyt, x, acc, input_precision="tf32x3")
        dbias += tl.sum(dyt, axis=1)
    mask = mask_n[:, None] & mask_k[None, :]
    g = tl.load(g_ptr + offs_n // gain_group, mask=mask_n, other=0.0)
    w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=mask, other=0.0)
    tl.atomic_add(dw_ptr + offs_n[:, None] * K + offs_k[None, :], acc * g[:, None], mask=mask, sem="relaxed")
    tl.atomic_add(dg_ptr + offs_n // gain_group, tl.sum(w * acc, axis=1), mask=mask_n, sem="relaxed")
    if pid_k == 0:
        tl.atomic_add(db_ptr + offs_n, dbias, mask=mask_n, sem="relaxed")


def _block(n: int, cap: int) -> int:
    """Smallest power of two >= n, clamped to [16, cap] (tl.dot needs every tile dimension >= 16)."""
    return max(16, min(cap, triton.next_power_of_2(n)))


def linear_forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor, y: torch.Tensor,
                   gain_group: int, relu: bool, *, rows: torch.Tensor | None = None, nets: int = 1,
                   p_zstride: int = 0, x_zstride: int = 0, ddqn: bool = False) -> torch.Tensor:
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
    Returns y. Grid (ceil(M / 128), ceil(N / BLOCK_N), nets), BLOCK_N <= 128 lowered until there are >= 132 programs
    or BLOCK_N = 16; never a single program (an idle second program is added for tiny shapes).
    Raises ValueError for wrong dtype, shape, device or contiguity, or bad nets / gain_group.
    """
    check_tensor("w", w, dtype=torch.float32, ndim=2)
    n, k = w.shape
    dev = w.device
    check_tensor("x", x, dtype=torch.float32, ndim=2, device=dev, contiguous=False)
    if x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x must be (R, {k}) with unit column stride, got shape {tuple(x.shape)} "
                         f"stride {x.stride()}")
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
    # Tiles from the H200 sweep at seed-scale shapes (profiles/h200/linear_sweep.md): 128 x 128 x 32, 4 warps,
    # 3 stages; BLOCK_N halves while there are fewer than 132 programs (one wave) and it can.
    block_m, block_n = 128, _block(n, 128)
    grid_m = triton.cdiv(m, block_m)
    while block_n > 16 and grid_m * triton.cdiv(n, block_n) * nets < _MIN_PROGRAMS:
        block_n //= 2
    grid = (max(grid_m, 1 if triton.cdiv(n, block_n) * nets > 1 else 2), triton.cdiv(n, block_n), nets)
    kernel = _fwd_ddqn_tf32_gemm_kernel if ddqn else _fwd_online_tf32_gemm_kernel
    kernel[grid](x, rows if rows is not None else x, w, b, g, y, m, n, k, x.stride(0), x_zstride, p_zstride,
                 m * n, gain_group, GATHER=rows is not None, RELU=relu, BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_K=_block(k, 32), num_warps=4, num_stages=3)
    return y


def linear_backward_input(dy: torch.Tensor, w: torch.Tensor, g: torch.Tensor, x: torch.Tensor, dx: torch.Tensor,
                          gain_group: int) -> torch.Tensor:
    """dx = ((dy * g[n // gain_group]) @ w) masked to where x > 0 (split-precision FP32 tensor-core GEMM).

    dy: (M, N) gradient w.r.t. this layer's pre-activation; w: (N, K); g: (ceil(N / gain_group),); x: (M, K) the
    layer's input, the previous layer's ReLU output; dx: (M, K) output (the previous layer's pre-activation
    gradient), fully overwritten. All float32, contiguous, on one device. Returns dx.
    Raises ValueError for wrong dtype, shape, device or contiguity.
    """
    check_tensor("w", w, dtype=torch.float32, ndim=2)
    n, k = w.shape
    dev = w.device
    check_tensor("dy", dy, dtype=torch.float32, ndim=2, device=dev)
    m = dy.shape[0]
    check_tensor("dy", dy, shape=(m, n))
    check_tensor("g", g, dtype=torch.float32, shape=(-(-n // max(gain_group, 1)),), device=dev)
    check_tensor("x", x, dtype=torch.float32, shape=(m, k), device=dev)
    check_tensor("dx", dx, dtype=torch.float32, shape=(m, k), device=dev)
    block_m, block_k = 128, _block(k, 64)  # H200 sweep: 128 x 32 x 64, 4 warps, 3 stages
    grid = (max(triton.cdiv(m, block_m), 2), triton.cdiv(k, block_k))
    _bwd_dx_fp32split_gemm_kernel[grid](dy, w, g, x, dx, m, n, k, gain_group, BLOCK_M=block_m,
                                        BLOCK_N=_block(n, 32), BLOCK_K=block_k, num_warps=4, num_stages=3)
    return dx


def linear_backward_weight(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, dw: torch.Tensor,
                           db: torch.Tensor, dg: torch.Tensor, gain_group: int, *,
                           rows: torch.Tensor | None = None) -> None:
    """Accumulate (atomic adds) dw += g * dy^T x, db += sum_m dy, dg[j] += sum over group j's rows of sum(w * dy^T x).

    dy: (M, N); x: (R, K) (row stride may exceed K; with `rows` (M,) int64, row m of the product is x[rows[m]]);
    w: (N, K) and g: (ceil(N / gain_group),) the layer's parameters; dw (N, K), db (N,), dg like g: views of the
    gradient buffer, which the caller zeroes once before the backward. Split over M into >= 8 parts (more while
    there are fewer than 132 programs); fp32 atomic adds make the summation order (and the last bits) vary run to run.
    Raises ValueError for wrong dtype, shape, device or contiguity.
    """
    check_tensor("w", w, dtype=torch.float32, ndim=2)
    n, k = w.shape
    dev = w.device
    check_tensor("dy", dy, dtype=torch.float32, ndim=2, device=dev)
    m = dy.shape[0]
    check_tensor("dy", dy, shape=(m, n))
    check_tensor("x", x, dtype=torch.float32, ndim=2, device=dev, contiguous=False)
    if x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x must be (R, {k}) with unit column stride, got {tuple(x.shape)} stride {x.stride()}")
    if rows is not None:
        check_tensor("rows", rows, dtype=torch.int64, shape=(m,), device=dev)
    elif x.shape[0] < m:
        raise ValueError(f"x has {x.shape[0]} rows, dy has {m}")
    groups = -(-n // max(gain_group, 1))
    for name, t, shape in (("g", g, (groups,)), ("dw", dw, (n, k)), ("db", db, (n,)), ("dg", dg, (groups,))):
        check_tensor(name, t, dtype=torch.float32, shape=shape, device=dev)
    # H200 sweep: N x K tiles 128 x 64, 64 rows per iteration, 8 warps, 3 stages, ~8 splits of M
    block_n, block_k, block_m = _block(n, 128), _block(k, 64), 64
    tiles = triton.cdiv(n, block_n) * triton.cdiv(k, block_k)
    splits = max(1, min(triton.cdiv(m, block_m), max(8, triton.cdiv(_MIN_PROGRAMS, tiles))))
    rows_per_split = triton.cdiv(triton.cdiv(m, splits), block_m) * block_m
    splits = max(triton.cdiv(m, rows_per_split), 2 if tiles == 1 else 1)  # an idle split rather than one program
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k), splits)
    _bwd_dw_fp32split_gemm_kernel[grid](dy, x, rows if rows is not None else x, w, g, dw, db, dg, m, n, k,
                                        x.stride(0), gain_group, rows_per_split, GATHER=rows is not None,
                                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=8,
                                        num_stages=3)


def linear_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor, gain_group: int,
                     relu: bool) -> torch.Tensor:
    """Plain-torch y = act(g[n // gain_group] * (x @ w^T) + b) in x's dtype (use float64 for a reference)."""
    scale = g.repeat_interleave(gain_group)[: w.shape[0]]
    y = (x @ w.T) * scale + b
    return torch.relu(y) if relu else y
