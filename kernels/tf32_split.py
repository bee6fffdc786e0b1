"""The TF32 hi/lo split of fp32 operands for FP32-accurate products on TF32 tensor cores (3xTF32).

x = hi + lo (+ ~2^-22 |x|), hi = x rounded to TF32 (10 mantissa bits; to nearest, ties away from zero, as PTX
`cvt.rna.tf32.f32`), lo = (x - hi) rounded the same way; a product a b is then a_hi b_hi + a_hi b_lo + a_lo b_hi
on TF32 MMAs (the dropped a_lo b_lo is ~2^-22 relative): Ootomo & Yokota 2022, the scheme of Triton's "tf32x3".
Kernels that read an operand many times split it once where it is produced and store both parts, a (2, ...) fp32
tensor [hi, lo]; the consuming GEMM then streams both parts straight into shared memory and splits only its other
operand in registers (kernels/linear.py says why).

- `tf32_rna` (Triton, inside kernels): the rounding, in integer ops (interpreter-safe): adding half an ulp to the
  magnitude bits of a sign-magnitude float and truncating rounds to nearest, ties away; NaN is passed through (as
  cvt.rna.tf32.f32 does), and +-inf stay +-inf. `tf32_hi_lo` (Triton): both parts of a tile.
- `split_tf32` (plain torch): the (2, *shape) [hi, lo] of a float32 tensor, the reference and a test helper.
- `tf32_round_copy` (launcher): dst = hi of src, elementwise, in one launch: the rounded weights a TF32 forward
  GEMM streams straight into shared memory (kernels/linear.py, `w_tf32`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor, rounds_tf32_operands
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs


@triton.jit
def tf32_rna(x):
    """x (fp32 tensor) rounded to TF32, kept as fp32 with the low 13 mantissa bits zero."""
    bits = x.to(tl.uint32, bitcast=True)
    r = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return tl.where(x == x, r, x)  # NaN stays NaN (the carry would turn a high-payload NaN into 0 or inf)


@triton.jit
def tf32_hi_lo(x):
    """x (fp32 tensor) as its TF32 parts (hi, lo): hi = tf32_rna(x), lo = tf32_rna(x - hi)."""
    hi = tf32_rna(x)
    return hi, tf32_rna(x - hi)


def split_tf32(t: torch.Tensor) -> torch.Tensor:
    """Plain-torch (2, *t.shape) float32 [hi, lo] of t (taken as float32), as the kernels write it with `tf32_rna`;
    hi + lo is t within ~2^-22 relative."""

    def rna(x: torch.Tensor) -> torch.Tensor:
        bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        r = ((bits + 0x1000) & 0xFFFFE000).to(torch.uint32).view(torch.int32).view(torch.float32)
        return torch.where(x.isnan(), x, r)

    x = t.float()
    hi = rna(x)
    return torch.stack([hi, rna(x - hi)])


_ROUND_BLOCK = 2048


@triton.jit
def _fwd_weights_rna_kernel(src_ptr, dst_ptr, n, ROUND: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    gdc_prologue(GDC)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask)
    if ROUND:
        x = tf32_rna(x)
    tl.store(dst_ptr + offs, x, mask=mask)


def tf32_round_copy(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """dst = src rounded to TF32 (to nearest, ties away; `tf32_rna`, whose plain-torch twin is `split_tf32(src)[0]`),
    elementwise over the flat tensors, in one launch of max(2, ceil(numel / 2048)) programs: the weight copy a TF32
    forward reads with `w_tf32=True` (kernels/linear.py). A plain copy on the interpreter unless it emulates
    Hopper's dot (kernels/_common.py `rounds_tf32_operands`), like the forward's own rounding.
    src, dst: float32 contiguous tensors of one shape (any), on one device; dst is fully overwritten and returned.
    Raises ValueError for another dtype, shape, device or a non-contiguous tensor, or dst being src (partial
    overlaps are not checked)."""
    check_tensor("src", src, dtype=torch.float32)
    check_tensor("dst", dst, dtype=torch.float32, shape=tuple(src.shape), device=src.device)
    if dst.data_ptr() == src.data_ptr() and src.numel():
        raise ValueError("dst must not be src: tf32_round_copy writes a copy (the source stays FP32)")
    n = src.numel()
    _fwd_weights_rna_kernel[(max(2, triton.cdiv(n, _ROUND_BLOCK)),)](
        src,
        dst,
        n,
        ROUND=rounds_tf32_operands(),
        BLOCK=_ROUND_BLOCK,
        **pdl_kwargs(),
    )
    return dst
