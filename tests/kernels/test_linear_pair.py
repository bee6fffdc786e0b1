"""kernels/linear_pair.py against two plain-torch float64 `linear_reference` layers.

Fresh random inputs, odd sizes (rows not a multiple of the 64-row tile, hidden widths not a multiple of the 32-wide
chunk, gain groups that split tiles), outputs poisoned (NaN) before each launch. Tolerances: the CPU interpreter
multiplies in float32 (rtol/atol 1e-4 of float64); the GPU in TF32 (checked: relative error between 1e-5 and 5e-3,
the forward placement).
"""

from __future__ import annotations

import pytest
import torch

from kernels.linear import linear_reference
from kernels.linear_pair import linear_pair_forward, pair_fits

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=1e-4, atol=1e-4) if DEVICE == "cpu" else dict(rtol=1e-2, atol=1e-2)


def _rand(*shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def _layer(gen, n, k, gain_group):
    return (_rand(n, k, gen=gen, scale=k ** -0.5), _rand(n, gen=gen, scale=0.1),
            1.0 + _rand(-(-n // gain_group), gen=gen, scale=0.2))


def _flat(layers) -> tuple[torch.Tensor, list[tuple[int, torch.Size]]]:
    """Both layers' (w, b, g) packed into one flat float32 buffer on DEVICE, and each part's (offset, shape)."""
    parts = [t for layer in layers for t in layer]
    spec, off = [], 0
    for t in parts:
        spec.append((off, t.shape))
        off += t.numel()
    return torch.cat([t.reshape(-1) for t in parts]).float().to(DEVICE), spec


def _views(buf: torch.Tensor, spec) -> list[torch.Tensor]:
    return [buf[o:o + shape.numel()].view(shape) for o, shape in spec]


@pytest.mark.parametrize("m,k,h,n,gains,relu,gather,nets", [
    (70, 12, 24, 16, (8, 16), True, True, 2), (200, 64, 96, 48, (32, 16), False, False, 1),
    (130, 33, 50, 20, (25, 7), True, True, 1), (65, 4, 64, 256, (64, 256), True, False, 2)])
def test_pair_matches_two_float64_layers(m, k, h, n, gains, relu, gather, nets):
    gen = torch.Generator().manual_seed(m + h)
    nets_layers = [(_layer(gen, h, k, gains[0]), _layer(gen, n, h, gains[1])) for _ in range(nets)]
    flats = [_flat(layers) for layers in nets_layers]
    buf = torch.stack([f for f, _ in flats])            # net z's parameters one row further, as HotLearner.nets
    views = _views(buf[0], flats[0][1])
    src = _rand(m + 9, k + 3, gen=gen)[:, :k]           # a row stride larger than K, as replay storage rows
    rows = torch.randperm(m + 9, generator=gen)[:m] if gather else None
    y = torch.full((nets, m, n) if nets == 2 else (m, n), float("nan"), device=DEVICE)
    x_dev = torch.empty(m + 9, k + 3, device=DEVICE)[:, :k]
    x_dev.copy_(src.float())
    linear_pair_forward(x_dev, (*views[:3], gains[0]), (*views[3:], gains[1]), y, relu,
                        rows=None if rows is None else rows.to(DEVICE), nets=nets, p_zstride=buf.stride(0))
    x = src[rows] if gather else src[:m]
    for z, (first, second) in enumerate(nets_layers):
        ref = linear_reference(linear_reference(x, *first, gains[0], True), *second, gains[1], relu)
        got = y[z] if nets == 2 else y
        torch.testing.assert_close(got.cpu().double(), ref, **TOL)


def test_pair_fits_and_rejects_bad_inputs():
    assert pair_fits(64, 256) and pair_fits(1, 1)
    assert not pair_fits(129, 64) and not pair_fits(64, 257)
    gen = torch.Generator().manual_seed(1)
    v = _views(*_flat((_layer(gen, 24, 12, 24), _layer(gen, 16, 24, 16))))
    first, second = (*v[:3], 24), (*v[3:], 16)
    x, y = torch.randn(10, 12, device=DEVICE), torch.empty(10, 16, device=DEVICE)
    with pytest.raises(ValueError, match="w2 must be"):
        linear_pair_forward(x, first, (v[3][:, :20].contiguous(), v[4], v[5], 16), y, True)
    with pytest.raises(ValueError, match="y must be"):
        linear_pair_forward(x, first, second, torch.empty(10, 15, device=DEVICE), True)
    with pytest.raises(ValueError, match="x must be"):
        linear_pair_forward(torch.randn(10, 11, device=DEVICE), first, second, y, True)
    with pytest.raises(ValueError, match="nets must be"):
        linear_pair_forward(x, first, second, y, True, nets=3)
    with pytest.raises(ValueError, match="x has 10 rows"):
        linear_pair_forward(x, first, second, torch.empty(11, 16, device=DEVICE), True)
    with pytest.raises(ValueError, match="gain groups"):
        linear_pair_forward(x, (*v[:3], 0), second, y, True)
    big = torch.randn(300, 24, device=DEVICE)
    with pytest.raises(ValueError, match="N <= 256"):
        linear_pair_forward(x, first, (big, torch.zeros(300, device=DEVICE), torch.ones(1, device=DEVICE), 300), y,
                            True)


@pytest.mark.gpu
def test_pair_runs_tf32_at_seed_scale_shapes():
    """Seed-scale trunk (64 -> 512 -> 256, 8192 rows): TF32 error (~1e-3), not FP32 (< 1e-5) nor worse (> 5e-3)."""
    gen = torch.Generator().manual_seed(0)
    first, second = _layer(gen, 512, 64, 512), _layer(gen, 256, 512, 256)
    v = _views(*_flat((first, second)))
    x = _rand(8192, 64, gen=gen).float().cuda()
    y = torch.empty(8192, 256, device="cuda")
    linear_pair_forward(x, (*v[:3], 512), (*v[3:], 256), y, True)
    f64 = [t.double() for t in v]
    ref = linear_reference(linear_reference(x.double(), *f64[:3], 512, True), *f64[3:], 256, True)
    err = float((y.double() - ref).norm() / ref.norm())
    assert 1e-5 < err < 5e-3, f"relative error {err:.2e}: not TF32"
