"""Two linear layers in one launch, the hidden activations kept on chip (TF32 forward, no intermediate in memory).

y = act2(g2 * (relu(g1 * (x @ W1^T) + b1) @ W2^T) + b2), with W1 (H, K), W2 (N, H) and the per-row-group gains of
kernels/linear.py (sigma-reparam). Each program owns BLOCK_M rows and all N outputs: it walks the H hidden units in
chunks, computes a chunk of the first layer's ReLU output (BLOCK_M x BLOCK_H, registers) and multiplies it at once
into the second layer's accumulator (BLOCK_M x N), the back-to-back GEMM of flash attention's S -> P -> O loop
(Dao et al. 2022). So the (M, H) hidden activations are never written to or read from memory: for the Double-DQN
forward (online and target net on s', which the backward does not need) at seed scale that is 2 x 16 MB written
and read back per step, and one launch fewer.

Limits: K <= 128 (the input tile is loaded once) and N <= 256 (one accumulator tile per program); `pair_fits`
says whether a shape qualifies, else use two `kernels.linear.linear_forward` launches.
Precision: TF32 tensor cores for both products (the forward placement; kernel name carries "tf32" and the
Double-DQN phase prefix, see kernels/linear.py). Plain-torch reference: two `linear_reference` calls.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check_tensor

MAX_K = 128
MAX_N = 256


@triton.jit
def _fwd_ddqn_tf32_gemm2_kernel(x_ptr, idx_ptr, w1_ptr, b1_ptr, g1_ptr, w2_ptr, b2_ptr, g2_ptr, y_ptr, M, K, H, N,
                                stride_xm, p_zstride, y_zstride, gain1, gain2, GATHER: tl.constexpr,
                                RELU2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    z = tl.program_id(1)
    p = z * p_zstride
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    if GATHER:
        rows = tl.load(idx_ptr + offs_m, mask=mask_m, other=0)
    else:
        rows = offs_m.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    x = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask_h = offs_h < H
        w1 = tl.load(w1_ptr + p + offs_h[None, :] * K + offs_k[:, None], mask=mask_k[:, None] & mask_h[None, :],
                     other=0.0)
        g1 = tl.load(g1_ptr + p + offs_h // gain1, mask=mask_h, other=0.0)
        b1 = tl.load(b1_ptr + p + offs_h, mask=mask_h, other=0.0)
        hid = tl.maximum(tl.dot(x, w1, input_precision="tf32") * g1[None, :] + b1[None, :], 0.0)  # 0 where masked
        w2 = tl.load(w2_ptr + p + offs_n[None, :] * H + offs_h[:, None], mask=mask_h[:, None] & mask_n[None, :],
                     other=0.0)
        acc = tl.dot(hid, w2, acc, input_precision="tf32")
    g2 = tl.load(g2_ptr + p + offs_n // gain2, mask=mask_n, other=0.0)
    b2 = tl.load(b2_ptr + p + offs_n, mask=mask_n, other=0.0)
    y = acc * g2[None, :] + b2[None, :]
    if RELU2:
        y = tl.maximum(y, 0.0)
    tl.store(y_ptr + z * y_zstride + offs_m[:, None] * N + offs_n[None, :], y, mask=mask_m[:, None] & mask_n[None, :])


def pair_fits(k: int, n: int) -> bool:
    """Whether two layers (K inputs -> H hidden -> N outputs) fit one `linear_pair_forward` launch (any H)."""
    return 1 <= k <= MAX_K and 1 <= n <= MAX_N


def linear_pair_forward(x: torch.Tensor, first: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
                        second: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], y: torch.Tensor, relu: bool, *,
                        rows: torch.Tensor | None = None, nets: int = 1, p_zstride: int = 0) -> torch.Tensor:
    """y[z] = act(g2 (relu(g1 (x @ W1^T) + b1) @ W2^T) + b2) of net z < nets in one launch, the first layer's ReLU
    output never stored (TF32 tensor cores, kernel `_fwd_ddqn_tf32_gemm2_kernel`: a Double-DQN-forward kernel).

    Args:
        x: (R, K) float32 input rows, unit column stride (row stride may exceed K); with `rows`, row m of the product
            is x[rows[m]] (gathered from replay storage), else rows 0..M-1.
        first, second: (w, b, g, gain_group) of each layer, views of net 0's flat fp32 buffer: W1 (H, K), b1 (H,),
            g1 (ceil(H / gain_group1),); W2 (N, H), b2 (N,), g2 (ceil(N / gain_group2),). Net z reads them
            z * p_zstride floats further. The first layer always has a ReLU; `relu` is the second's.
        y: (M, N) or (nets, M, N) float32 contiguous, fully overwritten.
        rows: optional (M,) int64 row indices into x (not bounds-checked). nets: 1 or 2.
    Returns y. Grid (max(2, ceil(M / 64)), nets).
    Raises ValueError for wrong dtype, shape, device or contiguity, bad nets / gain groups, or a shape that
    `pair_fits` rejects (K > 128 or N > 256).
    """
    (w1, b1, g1, gain1), (w2, b2, g2, gain2) = first, second
    check_tensor("w1", w1, dtype=torch.float32, ndim=2)
    h, k = w1.shape
    dev = w1.device
    check_tensor("w2", w2, dtype=torch.float32, ndim=2, device=dev)
    n = w2.shape[0]
    if w2.shape[1] != h:
        raise ValueError(f"w2 must be (N, {h}) to follow w1 {tuple(w1.shape)}, got {tuple(w2.shape)}")
    if not pair_fits(k, n):
        raise ValueError(f"linear_pair_forward needs K <= {MAX_K} and N <= {MAX_N}, got K = {k}, N = {n}")
    if gain1 < 1 or gain2 < 1:
        raise ValueError(f"gain groups must be >= 1, got {gain1}, {gain2}")
    for name, t, shape in (("b1", b1, (h,)), ("g1", g1, (-(-h // gain1),)), ("b2", b2, (n,)),
                           ("g2", g2, (-(-n // gain2),))):
        check_tensor(name, t, dtype=torch.float32, shape=shape, device=dev)
    check_tensor("x", x, dtype=torch.float32, ndim=2, device=dev, contiguous=False)
    if x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x must be (R, {k}) with unit column stride, got shape {tuple(x.shape)} "
                         f"stride {x.stride()}")
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
    block_m = 64
    _fwd_ddqn_tf32_gemm2_kernel[(max(2, triton.cdiv(m, block_m)), nets)](
        x, rows if rows is not None else x, w1, b1, g1, w2, b2, g2, y, m, k, h, n, x.stride(0), p_zstride, m * n,
        gain1, gain2, GATHER=rows is not None, RELU2=relu, BLOCK_M=block_m, BLOCK_K=max(16, triton.next_power_of_2(k)),
        BLOCK_H=32, BLOCK_N=max(16, triton.next_power_of_2(n)), num_warps=4, num_stages=2)
    return y
