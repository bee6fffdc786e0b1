"""The split-GEMM probe's kernels (profiles/split_gemm_probe.py) against torch on the CPU interpreter, every mode and
both the stored and the split-K epilogue (atomic, or for cat-ws partials summed after), the TMA mode's partial
tiles; and the TF32 split it feeds the pre-split modes."""

import pytest
import torch

from hotloop.profiles.split_gemm_probe import MODES, PRESPLIT_MODES, _run, split_tf32

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
    if mode in PRESPLIT_MODES:
        aa, a_lo = split_tf32(a)
        bb, b_lo = split_tf32(b)
    c = torch.full((64, 32), float("nan"), device=DEVICE)
    _run(mode, aa, bb, c, 64, 32, 64, splits, (32, 16, 16, 4, 1), a_lo, b_lo)()
    loose = DEVICE == "cuda" and mode == "tf32"  # one TF32 product: ~1e-3 relative error on a GPU
    torch.testing.assert_close(c, a @ b, rtol=2e-3 if loose else 1e-5, atol=5e-2 if loose else 1e-4)


@pytest.mark.parametrize("splits", [1, 2])
def test_probe_cat_tma_partial_tiles(splits):
    """M and N not multiples of the tile: the tile rows past M (N) read the lo part's rows; C must not see them."""
    g = torch.Generator().manual_seed(2)
    a = torch.randn(48, 64, generator=g).to(DEVICE) * 3.0
    b = torch.randn(24, 64, generator=g).to(DEVICE).t()  # K-major: b.t() is (N, K) contiguous
    aa, a_lo = split_tf32(a)
    bb, b_lo = split_tf32(b)
    c = torch.full((48, 24), float("nan"), device=DEVICE)
    _run("cat-tma", aa, bb, c, 48, 24, 64, splits, (32, 16, 16, 4, 1), a_lo, b_lo)()
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode, m, k, splits, problem", [("cat-ws", 48, 64, 1, "multiples of the tile"),
                                                          ("cat-ws", 64, 64, 3, "whole 16-wide steps"),
                                                          ("cat-tma", 64, 40, 1, "whole 16-wide steps")])
def test_probe_tma_modes_refuse_shapes_they_cannot_tile(mode, m, k, splits, problem):
    """Without the check, cat-ws writes past C on a partial tile and either mode drops the reduction's tail."""
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    b = torch.randn(k, 32).to(DEVICE)
    c = torch.full((m, 32), float("nan"), device=DEVICE)
    with pytest.raises(ValueError, match=problem):
        _run(mode, a, b, c, m, 32, k, splits, (32, 16, 16, 4, 1), a, b)
    assert torch.isnan(c).all()  # nothing launched
