"""The split-GEMM probe's kernel (profiles/split_gemm_probe.py) against torch on the CPU interpreter, every mode and
both the stored and the split-K (atomic) epilogue; and the TF32 split it feeds the pre-split mode."""

import pytest
import torch

from profiles.split_gemm_probe import MODES, _run, split_tf32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (tests/conftest.py)


def test_split_tf32_keeps_ten_mantissa_bits_and_loses_nothing():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 10.0 ** torch.randint(-3, 4, (4096,))
    hi, lo = split_tf32(x)
    assert int((hi.view(torch.int32) & 0x1FFF).abs().sum()) == 0  # the low 13 of 23 mantissa bits are zero
    assert torch.equal(hi + lo, x)
    assert float((lo.abs() / x.abs()).max()) <= 2.0 ** -11


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("splits", [1, 2])
def test_probe_gemm_matches_torch(mode, splits):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(64, 64, generator=g).to(DEVICE)
    b = torch.randn(64, 32, generator=g).to(DEVICE).t().contiguous().t()  # a strided (K-major) operand
    a_lo = b_lo = None
    aa, bb = a, b
    if mode == "presplit":
        aa, a_lo = split_tf32(a)
        bb, b_lo = split_tf32(b)
    c = torch.full((64, 32), float("nan"), device=DEVICE)
    _run(mode, aa, bb, c, 64, 32, 64, splits, (32, 16, 16, 4, 1), a_lo, b_lo)()
    loose = DEVICE == "cuda" and mode == "tf32"  # one TF32 product: ~1e-3 relative error on a GPU
    torch.testing.assert_close(c, a @ b, rtol=2e-3 if loose else 1e-5, atol=5e-2 if loose else 1e-4)
