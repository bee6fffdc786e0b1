"""kernels/tf32_split.py: the Triton rounding (`tf32_rna`, run through a one-program copy kernel, on the CPU under
the interpreter) against the plain-torch `split_tf32`, and both against a float64 round-to-nearest-ties-away to 10
mantissa bits; special values (zeros, subnormals, +-inf, NaN with any payload) included."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.tf32_split import split_tf32, tf32_rna

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _split_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    hi = tf32_rna(x)
    tl.store(out_ptr + offs, hi, mask=mask)
    tl.store(out_ptr + n + offs, tf32_rna(x - hi), mask=mask)


def _values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    ordinary = torch.randn(3000, generator=gen) * torch.logspace(-30, 30, 3000)
    bits = torch.randint(-(2**31), 2**31 - 1, (2000,), generator=gen, dtype=torch.int64).to(torch.int32)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-40, -3e-42, float("inf"), float("-inf"), 3.4028235e38])
    nans = (
        torch.tensor([0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF - 2**32, 0x7F800001, 0xFF800FFF - 2**32], dtype=torch.int64)
        .to(torch.int32)
        .view(torch.float32)
    )
    return torch.cat([ordinary, bits.view(torch.float32), special, nans])


def test_triton_rounding_equals_the_torch_reference_bit_for_bit():
    x = _values()
    out = torch.full((2 * x.numel(),), 7.0, device=DEVICE)
    _split_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(DEVICE), out, x.numel(), BLOCK=1024)
    ref = split_tf32(x)
    got = out.cpu().view(2, -1)
    same = (got.view(torch.int32) == ref.view(torch.int32)) | (got.isnan() & ref.isnan())
    assert bool(same.all())
    assert bool((got[0].isnan() == x.isnan()).all())  # NaN stays NaN, whatever its payload


def test_split_is_round_to_nearest_ties_away_and_reproduces_x():
    x = _values()
    finite = x[x.isfinite() & (x.abs() > 1e-37) & (x.abs() < 1e38)]
    hi, lo = split_tf32(finite)
    assert not bool((hi.view(torch.int32) & 0x1FFF).any()) and not bool((lo.view(torch.int32) & 0x1FFF).any())
    m, e = torch.frexp(finite.double())  # finite = m 2^e, 0.5 <= |m| < 1
    scaled = m * 2.0**11  # 11 significant bits: TF32's 10 + the implicit one
    want = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5) * 2.0 ** (e - 11).double()
    assert torch.equal(hi.double(), want)
    normal = finite.abs() > 1e-30  # lo = x - hi ~ 2^-11 x must itself be a normal float for the 2^-22 bound
    rel = ((finite.double() - hi.double() - lo.double()).abs() / finite.double().abs())[normal].max()
    assert float(rel) <= 2.0**-22
    ties = torch.tensor([1.0 + 2.0**-11, -(1.0 + 3 * 2.0**-11)])  # halfway cases round away from zero
    assert split_tf32(ties)[0].tolist() == [1.0 + 2.0**-10, -(1.0 + 2 * 2.0**-10)]
    inf = torch.tensor([float("inf"), float("-inf")])
    assert split_tf32(inf)[0].tolist() == inf.tolist()


def test_round_copy_writes_the_rounded_values_and_keeps_the_source(monkeypatch):
    """`tf32_round_copy`: with the rounding on (the GPU; the interpreter when it emulates Hopper's dot) dst is
    `split_tf32(src)[0]` bit for bit over a poisoned dst, src untouched; on the plain interpreter a plain copy."""
    from hotloop.kernels.tf32_split import tf32_round_copy

    x = _values().to(DEVICE)
    before = x.clone()
    for emulate in ("1", "0"):
        monkeypatch.setenv("HOTLOOP_INTERPRET_TF32", emulate)
        dst = torch.full_like(x, 7.0)
        assert tf32_round_copy(x, dst) is dst
        rounds = emulate == "1" or DEVICE == "cuda"
        want = split_tf32(x.cpu())[0] if rounds else x.cpu()
        got = dst.cpu()
        assert bool(((got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())).all())
        assert torch.equal(x.view(torch.int32), before.view(torch.int32))


def test_round_copy_refuses_bad_input():
    from hotloop.kernels.tf32_split import tf32_round_copy

    x = torch.randn(2, 300, device=DEVICE)
    for dst, what in (
        (torch.empty(2, 301, device=DEVICE), "shape"),
        (torch.empty(2, 300, device=DEVICE).double(), "dtype"),
        (x, "must not be src"),
    ):
        try:
            tf32_round_copy(x, dst)
        except ValueError as e:
            assert what in str(e), e
        else:
            raise AssertionError(f"no error for a bad dst ({what})")
    try:
        tf32_round_copy(x.t(), torch.empty(300, 2, device=DEVICE))
    except ValueError as e:
        assert "contiguous" in str(e)
    else:
        raise AssertionError("no error for a non-contiguous src")
