"""Drop-in launchers of the learner step's GEMMs in a chosen `tl.dot` precision: the mutants the precision probe
(hotloop.guards.probes.precision_probe) must tell apart from the step's kernels by their numbers, not their names.

- `variant_matmul(a, b, precision)`: C = A @ B, fp32 in and out, ONE `tl.dot(input_precision=precision)` per
  reduction step ("tf32": one TF32 tensor-core MMA, operands truncated to 10 mantissa bits by the hardware;
  "tf32x3": Triton's own split, FP32-accurate; "ieee": FP32 FMAs, no tensor cores). Its kernel is
  `_variant_tf32_gemm_kernel` whatever the precision: a kernel NAMED tf32 that may not be (the point of the probe:
  guards/step_metrics.py `gemm_precision` classifies kernels by name and would call every specialization TF32).
- `variant_linear_forward(precision)`: a function of `hotloop.kernels.linear.linear_forward`'s signature (one or two
  nets, gathered rows, ReLU, y^T split into TF32 parts), its product done by `variant_matmul`, the epilogue (gain,
  bias, ReLU, transposed split copy) in torch. precision="ieee" is the "IEEE forward" mutant.
- `variant_linear_backward_input(precision)`, `variant_linear_backward_weight(precision)`: the same for
  `linear_backward_input` (dZ = dY (gW) masked, dZ^T, bias gradient, the fused weight gradient of the layer below)
  and `linear_backward_weight` (dW += g dY^T X, dg). The B operand is the fp32 value hi + lo of the step's split
  copy (kernels/tf32_split.py), so precision="tf32" is the "backward cut down to one TF32 dot" mutant (the dY
  operand keeps its low bits, which the TF32 MMA drops: ~1e-4..1e-3 relative error instead of 3xTF32's ~1e-7).

Not used by the step. Tiles: 64 x 64 outputs, 32-wide reduction steps, 4 warps (no tuning: these are probes, not
fast paths; operands are read with whatever strides they have). Under TRITON_INTERPRET=1 every dot is a float32
numpy matmul whatever the precision (kernels/linear.py says so), unless a test patches the interpreter's dot
(tests/kernels/test_tf32_emulated.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor
from hotloop.kernels.tf32_split import split_tf32

PRECISIONS = ("tf32", "tf32x3", "ieee")
"""The `tl.dot` input precisions a variant can run with."""
_BLOCK_M, _BLOCK_N, _BLOCK_K = 64, 64, 32


@triton.jit
def _variant_tf32_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    sam,
    sak,
    sbk,
    sbn,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # c (M, N) row-major = a (M, K) @ b (K, N), any strides; one dot of PRECISION per reduction step
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(
            a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak, mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )
        b = tl.load(
            b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn, mask=mask_k[:, None] & mask_n[None, :], other=0.0
        )
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :])


def _check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def variant_matmul(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """C = a @ b as a new (M, N) float32 contiguous tensor, one `tl.dot(input_precision=precision)` per 32-wide
    reduction step of 64 x 64 output tiles (grid (ceil(M / 64), ceil(N / 64)), at least 2 programs).

    a: (M, K), b: (K, N) float32 on one device, any strides (views are fine). precision: one of PRECISIONS.
    Raises ValueError for a bad precision, dtype, shape or device."""
    _check_precision(precision)
    check_tensor("a", a, dtype=torch.float32, ndim=2, contiguous=False)
    check_tensor("b", b, dtype=torch.float32, ndim=2, device=a.device, contiguous=False)
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"a is (M, {k}), b must be ({k}, N), got {tuple(b.shape)}")
    c = torch.empty(m, n, dtype=torch.float32, device=a.device)
    grid_m, grid_n = triton.cdiv(m, _BLOCK_M), triton.cdiv(n, _BLOCK_N)
    _variant_tf32_gemm_kernel[(max(grid_m, 2 if grid_n == 1 else 1), grid_n)](
        a,
        b,
        c,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        PRECISION=precision,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N,
        BLOCK_K=_BLOCK_K,
        num_warps=4,
    )
    return c


def _scale(g: torch.Tensor, gain_group: int, rows: int) -> torch.Tensor:
    """(rows,) gain of each row: g[n // gain_group]."""
    return g.repeat_interleave(gain_group)[:rows]


def _net_view(t: torch.Tensor, z: int, zstride: int) -> torch.Tensor:
    """The view of `t` `z * zstride` floats further in its storage (net z's copy of a parameter view)."""
    return t.as_strided(t.shape, t.stride(), t.storage_offset() + z * zstride)


def variant_linear_forward(precision: str) -> Callable[..., torch.Tensor]:
    """A drop-in of `hotloop.kernels.linear.linear_forward` (same arguments, same outputs, y returned) whose product
    x W^T is `variant_matmul(..., precision)`; gain, bias, ReLU and the split y^T (yt) in torch (fp32). The
    TF32-rounding flags (x_tf32, w_tf32, out_tf32) are accepted and ignored: the variant's precision is its own.
    Raises ValueError for a bad precision (here) and from `variant_matmul`."""
    _check_precision(precision)

    def forward(
        x,
        w,
        b,
        g,
        y,
        gain_group,
        relu,
        *,
        rows=None,
        nets=1,
        p_zstride=0,
        x_zstride=0,
        ddqn=False,
        yt=None,
        x_tf32=False,
        w_tf32=False,
        out_tf32=False,
    ):
        n = w.shape[0]
        m = y.shape[-2]
        outs = y.view(nets, m, n)
        for z in range(nets):
            base = x.as_strided(
                (x.shape[0] - (z * x_zstride) // x.stride(0), x.shape[1]),
                x.stride(),
                x.storage_offset() + z * x_zstride,
            )
            inp = base.index_select(0, rows) if rows is not None else base[:m]
            wz, bz, gz = (_net_view(t, z, p_zstride) for t in (w, b, g))
            out = variant_matmul(inp, wz.t(), precision) * _scale(gz, gain_group, n) + bz
            outs[z].copy_(out.relu_() if relu else out)
        if yt is not None:
            yt.copy_(split_tf32(y.view(m, n).t()))
        return y

    forward.__qualname__ = f"variant_linear_forward[{precision}]"
    return forward


def variant_linear_backward_input(precision: str) -> Callable[..., torch.Tensor | None]:
    """A drop-in of `hotloop.kernels.linear.linear_backward_input` (same arguments; dz^T, dz, the bias gradient and
    the fused weight gradient of the layer below written / added as it does; dxt returned) whose products dY (gW)
    and, with weight_grad_below, dZ^T X0 are ONE `variant_matmul(..., precision)` each, on the fp32 values hi + lo
    of the split operands. Raises ValueError for a bad precision (here) and from `variant_matmul`."""
    _check_precision(precision)

    def input_grad(dy, wt, x, dxt, db, dx=None, *, weight_grad_below=None):
        dz = variant_matmul(dy, (wt[0] + wt[1]).t(), precision).mul_(x > 0)
        if dxt is not None:
            dxt.copy_(dz.t())
        if dx is not None:
            dx.copy_(dz)
        db.add_(dz.sum(0))
        if weight_grad_below is not None:
            x0t, w0, g0, dw0, dg0, gain0 = weight_grad_below
            part = variant_matmul(dz.t(), (x0t[0] + x0t[1]).t(), precision)  # (K, K0) = dz^T x0
            dw0.add_(part * _scale(g0, gain0, part.shape[0])[:, None])
            if dg0 is not None:  # None: fixed gains, no gain gradient (as linear_backward_input)
                dg0.add_(
                    torch.zeros_like(dg0).index_add_(
                        0, torch.arange(part.shape[0], device=part.device) // gain0, (w0 * part).sum(1)
                    )
                )
        return dxt

    input_grad.__qualname__ = f"variant_linear_backward_input[{precision}]"
    return input_grad


def variant_linear_backward_weight(precision: str) -> Callable[..., None]:
    """A drop-in of `hotloop.kernels.linear.linear_backward_weight` (same arguments; dw += g dY^T X and dg added as it
    does) whose product dY^T X is ONE `variant_matmul(..., precision)` on the fp32 value hi + lo of the split X^T.
    Raises ValueError for a bad precision (here) and from `variant_matmul`."""
    _check_precision(precision)

    def weight_grad(dyt, xt, w, g, dw, dg, gain_group):
        part = variant_matmul(dyt, (xt[0] + xt[1]).t(), precision)  # (N, K) = dY^T X
        n = part.shape[0]
        dw.add_(part * _scale(g, gain_group, n)[:, None])
        if dg is not None:  # None: fixed gains, no gain gradient (as linear_backward_weight)
            dg.add_(
                torch.zeros_like(dg).index_add_(0, torch.arange(n, device=part.device) // gain_group, (w * part).sum(1))
            )

    weight_grad.__qualname__ = f"variant_linear_backward_weight[{precision}]"
    return weight_grad
