"""The split-GEMM probe's kernels (results/lab/split_gemm_probe.py) against torch on the CPU interpreter, every mode and
both the stored and the split-K epilogue (atomic, or for cat-ws partials summed after), the TMA mode's partial
tiles; and the TF32 split it feeds the pre-split modes."""

from pathlib import Path

import pytest
import torch

from lab.split_gemm_probe import MODES, PRESPLIT_MODES, _run, split_tf32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (tests/conftest.py)


def test_split_tf32_keeps_ten_mantissa_bits_and_loses_nothing():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 10.0 ** torch.randint(-3, 4, (4096,))
    hi, lo = split_tf32(x)
    assert int((hi.view(torch.int32) & 0x1FFF).abs().sum()) == 0  # the low 13 of 23 mantissa bits are zero
    assert torch.equal(hi + lo, x)
    assert float((lo.abs() / x.abs()).max()) <= 2.0**-11


BF16_MODES = ("bf16x3", "bf16x6")
"""Modes the interpreter's dot refuses (it takes tf32, tf32x3 and ieee only): checked on the GPU, and compiled for
sm90 on the CPU (test_bf16_modes_compile_to_bf16_mmas_for_sm90)."""


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("splits", [1, 2])
def test_probe_gemm_matches_torch(mode, splits):
    if DEVICE == "cpu" and mode in BF16_MODES:
        pytest.skip(f"{mode}: the Triton interpreter's dot takes tf32, tf32x3 and ieee only (checked on the GPU)")
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
    tol = (
        dict(rtol=2e-3, atol=5e-2)
        if loose
        else dict(rtol=1e-4, atol=1e-3)
        if mode == "bf16x3"
        else dict(rtol=1e-5, atol=1e-4)
    )  # bf16x3 keeps ~16 of fp32's 24 bits: ~1e-5 relative
    torch.testing.assert_close(c, a @ b, **tol)


SM90_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lab.split_gemm_probe import MODES, _probe_gemm_kernel as fn
sig = {n: "*fp32" for n in ("a_ptr", "a_lo_ptr", "b_ptr", "b_lo_ptr", "c_ptr")}
sig.update({n: "i32" for n in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "k_per_split")})
out = {}
for mode in sys.argv[1:]:
    consts = dict(MODE=MODES[mode], BLOCK_M=128, BLOCK_N=128, BLOCK_K=32)
    src = ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in consts}},
                    constexprs={(fn.arg_names.index(c),): v for c, v in consts.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8)).asm["ptx"]
    out[mode] = [line.strip() for line in ptx.splitlines() if "wgmma.mma_async" in line]
print(json.dumps(out))
"""


def test_bf16_modes_compile_to_bf16_mmas_for_sm90():
    """bf16x3 and bf16x6 build their products from bf16 tensor-core MMAs, twice as many for bf16x6: compiled for
    Hopper with Triton's bundled ptxas, no GPU needed, in a process without TRITON_INTERPRET (the interpreter's
    kernels do not compile); skipped where this Triton cannot target sm90."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", SM90_COMPILE, *BF16_MODES],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2] / "results",  # `import lab` (results/lab/, not installed)
    )
    if res.returncode != 0:
        pytest.skip(f"this Triton cannot compile for sm90 here: {res.stderr.strip().splitlines()[-1][:200]}")
    mmas = json.loads(res.stdout.strip().splitlines()[-1])
    for mode, lines in mmas.items():
        assert lines and all("bf16" in line for line in lines), (mode, lines[:2])
    assert len(mmas["bf16x6"]) == 2 * len(mmas["bf16x3"])


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


@pytest.mark.parametrize(
    "mode, m, k, splits, problem",
    [
        ("cat-ws", 48, 64, 1, "multiples of the tile"),
        ("cat-ws", 64, 64, 3, "whole 16-wide steps"),
        ("cat-tma", 64, 40, 1, "whole 16-wide steps"),
    ],
)
def test_probe_tma_modes_refuse_shapes_they_cannot_tile(mode, m, k, splits, problem):
    """Without the check, cat-ws writes past C on a partial tile and either mode drops the reduction's tail."""
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    b = torch.randn(k, 32).to(DEVICE)
    c = torch.full((m, 32), float("nan"), device=DEVICE)
    with pytest.raises(ValueError, match=problem):
        _run(mode, a, b, c, m, 32, k, splits, (32, 16, 16, 4, 1), a, b)
    assert torch.isnan(c).all()  # nothing launched
