"""The TF32/FP32 placement, checked on the CPU. The interpreter computes every dot in full fp32 whatever its
`input_precision` says, so on the CPU a backward that lost its split would still pass the float64 comparisons. Here
the interpreter's dot is patched to do what Hopper's tensor cores do:
- a "tf32" dot drops the low 13 mantissa bits of each fp32 operand (the MMA reads 10 of the 23);
- a "tf32x3" dot does Triton's split: hi = rna(x), lo = rna(x - hi), then lo*hi + hi*lo + hi*hi.
Under the patch, the backward kernels must stay FP32-accurate, and the operands of every TF32 dot they issue must
already be TF32-exact: that is their hi/lo split at work. The forward must show TF32's error, which also shows the
patch is active, with operands the kernel rounded to TF32 itself (TF32-exact too), so that the error has no sign.
Interpreter only: on a GPU the hardware truncates what it gets, and test_linear.py's GPU tests check there that
the forward's error is TF32's and has no sign (the kernels' own rounding at work).
Emulation idea: Ootomo & Yokota 2022 (3xTF32); the patch target is triton.runtime.interpreter."""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels.heads import heads_backward, heads_forward, heads_reference
from hotloop.kernels.linear import linear_backward_input, linear_backward_weight, linear_forward, linear_reference
from hotloop.kernels.tf32_split import split_tf32

FP32_BOUND = 2e-6  # relative max error of a split-precision (3xTF32) result against float64


def _rand(*shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("m,n,k,gain_group", [(200, 48, 40, 16), (130, 96, 70, 32)])
def test_backward_gemms_stay_fp32_accurate_under_hardware_tf32(hardware_tf32, m, n, k, gain_group):
    gen = torch.Generator().manual_seed(m)
    w, g = _rand(n, k, gen=gen, scale=k**-0.5), 1 + _rand(-(-n // gain_group), gen=gen, scale=0.2)
    x, dy = torch.relu(_rand(m, k, gen=gen)), _rand(m, n, gen=gen)
    w32, g32, x32, dy32 = (t.float() for t in (w, g, x, dy))
    scale = g32.repeat_interleave(gain_group)[:n]
    dx, dxt, db = torch.full((m, k), float("nan")), torch.full((k, m), float("nan")), torch.zeros(k)
    linear_backward_input(dy32, split_tf32((w32 * scale[:, None]).T), x32, dxt, db, dx=dx)
    dx_ref = (dy32.double() @ (w32.double() * scale.double()[:, None])) * (x > 0)
    assert _rel(dx, dx_ref) < FP32_BOUND
    dw, dg = torch.zeros(n, k), torch.zeros_like(g32)
    linear_backward_weight(dy32.T.contiguous(), split_tf32(x32.T), w32, g32, dw, dg, gain_group)
    dw_ref = scale.double()[:, None] * (dy32.double().T @ x32.double())
    assert _rel(dw, dw_ref) < FP32_BOUND
    assert hardware_tf32["tf32"] > 0 and hardware_tf32["tf32_inexact"] == 0


def test_fused_first_layer_weight_gradient_under_hardware_tf32(hardware_tf32):
    gen = torch.Generator().manual_seed(3)
    m, n, k, k0, gain0 = 200, 48, 96, 13, 96
    dy, w = _rand(m, n, gen=gen).float(), _rand(n, k, gen=gen, scale=k**-0.5).float()
    x, x0 = torch.relu(_rand(m, k, gen=gen)).float(), _rand(m, k0, gen=gen).float()
    w0, g0 = _rand(k, k0, gen=gen).float(), (1 + _rand(1, gen=gen, scale=0.2)).float()
    db, dw0, dg0 = torch.zeros(k), torch.zeros(k, k0), torch.zeros(1)
    linear_backward_input(
        dy, split_tf32(w.T), x, None, db, weight_grad_below=(split_tf32(x0.T), w0, g0, dw0, dg0, gain0)
    )
    dz = (dy.double() @ w.double()) * (x > 0)
    assert _rel(dw0, g0.double() * (dz.T @ x0.double())) < FP32_BOUND
    assert hardware_tf32["tf32"] > 0 and hardware_tf32["tf32_inexact"] == 0


HEADS = dict(m=140, branches=3, actions=4, hidden=20)
"""The heads tests' sizes: M rows, D branches of A actions, hidden width H."""


def _heads_inputs(gen):
    """h (M, (1 + D) H) ReLU features, w_out (1 + D A, H), gains (1 + D,): float32, for HEADS' sizes."""
    m, branches, actions, hidden = HEADS.values()
    j = 1 + branches * actions
    h = torch.relu(_rand(m, (1 + branches) * hidden, gen=gen)).float()
    w = _rand(j, hidden, gen=gen, scale=hidden**-0.5).float()
    return h, w, (1 + _rand(1 + branches, gen=gen, scale=0.2)).float()


def test_heads_backward_under_hardware_tf32(hardware_tf32):
    m, branches, actions, hidden = HEADS.values()
    j, width = 1 + branches * actions, (1 + branches) * hidden
    gen = torch.Generator().manual_seed(4)
    h, w, g = _heads_inputs(gen)
    dq = _rand(m, branches * actions, gen=gen).float()
    dh, dht = torch.full((m, width), float("nan")), torch.full((width, m), float("nan"))
    db_h, dw, db, dg = torch.zeros(width), torch.zeros(j, hidden), torch.zeros(j), torch.zeros(1 + branches)
    heads_backward(h, dq, w, g, dh, dht, db_h, dw, db, dg, branches)
    # the dueling head's backward in float64: dOut from dQ (value column, advantage minus its branch mean)
    dq3 = dq.double().view(m, branches, actions)
    dout = torch.cat([dq3.sum((1, 2))[:, None], (dq3 - dq3.mean(2, keepdim=True)).reshape(m, -1)], 1)
    grp = torch.tensor([0] + [1 + i // actions for i in range(branches * actions)])
    dout_g = dout * g.double()[grp]
    dh_ref = torch.zeros(m, width, dtype=torch.float64)
    for blk in range(1 + branches):
        sel = grp == blk
        dh_ref[:, blk * hidden : (blk + 1) * hidden] = dout_g[:, sel] @ w.double()[sel]
    dh_ref *= h > 0
    assert _rel(dh, dh_ref) < FP32_BOUND
    dw_ref = torch.stack([dout_g[:, i] @ h.double()[:, grp[i] * hidden : (grp[i] + 1) * hidden] for i in range(j)])
    assert _rel(dw, dw_ref) < FP32_BOUND
    # no tensor-core dot at all (IEEE FP32 FMAs): the bound above must hold without one
    assert hardware_tf32["tf32"] == 0 and hardware_tf32["tf32x3"] == 0


def test_forward_rounds_its_operands_to_tf32_under_hardware_tf32(hardware_tf32):
    """The forward's error is TF32's, not FP32's (the placement: TF32 forward), but without truncation's sign: its
    dots read operands already rounded to the nearest TF32 value (kernels/linear.py), so the hardware drops no bit
    and, on positive data, the mean signed error is near 0, where truncation's is about -1e-3 (2 x 2^-11)."""
    gen = torch.Generator().manual_seed(5)
    m, n, k = 150, 40, 64
    w, b, g = _rand(n, k, gen=gen, scale=k**-0.5).abs(), _rand(n, gen=gen, scale=0.1).abs(), torch.ones(1)
    x = torch.relu(_rand(m, k, gen=gen)) + 0.1
    y = torch.full((m, n), float("nan"))
    linear_forward(x.float(), w.float(), b.float(), g.float(), y, n, False)
    ref = linear_reference(x.float().double(), w.float().double(), b.float().double(), g.float().double(), n, False)
    assert 1e-5 < _rel(y, ref) < 1e-2
    assert abs(float(((y.double() - ref) / ref).mean())) < 1e-4
    assert hardware_tf32["tf32"] > 0 and hardware_tf32["tf32_inexact"] == 0


def test_heads_forward_rounds_its_operands_to_tf32_under_hardware_tf32(hardware_tf32):
    m, branches, actions, _ = HEADS.values()
    gen = torch.Generator().manual_seed(6)
    h, w, g = _heads_inputs(gen)
    b = _rand(w.shape[0], gen=gen, scale=0.1).float()
    q = torch.full((m, branches * actions), float("nan"))
    heads_forward(h, w, b, g, q, branches)
    ref = heads_reference(h.double(), w.double(), b.double(), g.double(), branches).reshape(m, -1)
    assert 1e-5 < _rel(q, ref) < 1e-2
    assert hardware_tf32["tf32"] > 0 and hardware_tf32["tf32_inexact"] == 0


def test_forward_flags_skip_the_rounding_of_operands_already_tf32(hardware_tf32):
    """x_tf32 / w_tf32 (operands a producer already rounded) give the same bits as the kernel's own rounding, and
    out_tf32 stores the rounded output: the chain flat_forward runs (kernels/linear.py). Leaving an unrounded
    operand flagged reaches the truncating dot and has truncation's sign, which shows the flags take effect."""
    gen = torch.Generator().manual_seed(8)
    m, n, k = 150, 40, 64
    w, b, g = _rand(n, k, gen=gen, scale=k**-0.5).abs(), _rand(n, gen=gen, scale=0.1).abs(), torch.ones(1)
    x = (torch.relu(_rand(m, k, gen=gen)) + 0.1).float()
    w, b, g = w.float(), b.float(), g.float()
    rna = lambda t: split_tf32(t)[0]  # noqa: E731
    own, flagged, rounded_out = (torch.full((m, n), float("nan")) for _ in range(3))
    linear_forward(x, w, b, g, own, n, False)
    linear_forward(rna(x), rna(w), b, g, flagged, n, False, x_tf32=True, w_tf32=True)
    assert torch.equal(own, flagged)
    linear_forward(x, w, b, g, rounded_out, n, False, out_tf32=True)
    assert torch.equal(rounded_out, rna(own))
    unrounded = torch.full((m, n), float("nan"))
    linear_forward(x, w, b, g, unrounded, n, False, x_tf32=True, w_tf32=True)
    ref = linear_reference(x.double(), w.double(), b.double(), g.double(), n, False)
    assert float(((unrounded.double() - ref) / ref).mean()) < -3e-4 < float(((own.double() - ref) / ref).mean())
    mh, branches, actions, _ = HEADS.values()
    h, wh, gh = _heads_inputs(gen)
    bh = _rand(wh.shape[0], gen=gen, scale=0.1).float()
    q_own, q_flagged = (torch.full((mh, branches * actions), float("nan")) for _ in range(2))
    heads_forward(h, wh, bh, gh, q_own, branches)
    heads_forward(rna(h), rna(wh), bh, gh, q_flagged, branches, x_tf32=True, w_tf32=True)
    assert torch.equal(q_own, q_flagged)


def test_the_forward_rounds_on_the_gpu_and_on_the_interpreter_only_when_asked(monkeypatch):
    """kernels/_common.py rounds_tf32_operands: on with no interpreter (the GPU), whatever HOTLOOP_INTERPRET_TF32
    says; on the interpreter only with HOTLOOP_INTERPRET_TF32=1."""
    from hotloop.kernels._common import rounds_tf32_operands

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for flag in ("0", "1"):
        monkeypatch.setenv("HOTLOOP_INTERPRET_TF32", flag)
        assert rounds_tf32_operands()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert rounds_tf32_operands()
    monkeypatch.setenv("HOTLOOP_INTERPRET_TF32", "0")
    assert not rounds_tf32_operands()
