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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
