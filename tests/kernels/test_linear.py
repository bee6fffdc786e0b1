"""kernels/linear.py and kernels/heads.py against plain-torch float64 references (autograd for the gradients).

Fresh random inputs (never zeros), odd sizes, outputs poisoned (NaN) before each launch. Tolerances: on the CPU
interpreter every dot is a float32 matmul, so all results are within rtol 1e-4 / atol 1e-4 of float64. On the GPU
the forward is TF32 (checked: relative error vs float64 between 1e-5 and 5e-3) and the backward split-precision
FP32 (checked: relative error <= 1e-5 of float64 given the same forward activations and dY, where a TF32 backward
would be ~1e-3).
"""

from __future__ import annotations

import pytest
import torch

import hotloop.kernels.heads
from hotloop.kernels.heads import heads_backward, heads_forward, heads_reference
from hotloop.kernels.linear import (
    WeightTranspose,
    linear_backward_input,
    linear_backward_weight,
    linear_forward,
    linear_reference,
)
from hotloop.kernels.tf32_split import split_tf32, tf32_round_copy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_TOL = dict(rtol=1e-4, atol=1e-4)
# the forward runs on TF32 tensor cores on the GPU (10-bit mantissa): its tolerance there is TF32's
FWD_TOL = CPU_TOL if DEVICE == "cpu" else dict(rtol=1e-2, atol=1e-2)


def _rand(*shape, gen, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _layer(gen, n, k, gain_group):
    groups = -(-n // gain_group)
    return _rand(n, k, gen=gen, scale=k**-0.5), _rand(n, gen=gen, scale=0.1), 1.0 + _rand(groups, gen=gen, scale=0.2)


def _scaled_wt(w, g, gain_group):
    """The g-scaled W^T (K, N), in w's dtype."""
    return (w * g.repeat_interleave(gain_group)[: w.shape[0], None]).T.contiguous()


def _wt(w, g, gain_group):
    """The g-scaled W^T split into TF32 parts, (2, K, N) float32: what WeightTranspose writes and the input-gradient
    kernel reads (the product taken in float32 first, as the kernel does)."""
    return split_tf32(_scaled_wt(w.float(), g.float(), gain_group))


@pytest.mark.parametrize(
    "m,n,k,gain_group,relu,gather",
    [
        (37, 20, 13, 20, True, False),
        (200, 48, 40, 16, False, True),
        (130, 96, 70, 32, True, True),
        (70, 72, 24, 7, True, False),
        (90, 256, 20, 48, True, False),
        (5632, 192, 16, 64, True, True),
    ],
)
def test_linear_forward_and_backward_match_float64(m, n, k, gain_group, relu, gather):
    # (90, 256, ...): two 128-row weight-gradient tiles; the second holds parts of 4 gain groups of 48 rows (2..5);
    # (5632, 192, ...): 64-wide forward tiles (they pad 192 less than 128-wide ones; 44 x 3 = 132 programs, so the
    # launcher keeps them)
    gen = torch.Generator().manual_seed(m + n)
    w, b, g = _layer(gen, n, k, gain_group)
    src = _rand(m + 11, k, gen=gen)
    rows = torch.randperm(m + 11, generator=gen)[:m] if gather else None
    x = src[rows] if gather else src[:m]
    dev = lambda t: t.float().to(DEVICE)  # noqa: E731
    y = torch.full((m, n), float("nan"), device=DEVICE)
    yt = torch.full((2, n, m), float("nan"), device=DEVICE)
    linear_forward(
        dev(src), dev(w), dev(b), dev(g), y, gain_group, relu, rows=None if rows is None else rows.to(DEVICE), yt=yt
    )
    ref = linear_reference(x, w, b, g, gain_group, relu)
    torch.testing.assert_close(y.cpu().double(), ref, **FWD_TOL)
    assert torch.equal(yt, split_tf32(y.T))  # y^T split into TF32 parts, bit for bit as the torch reference

    dy = _rand(m, n, gen=gen)
    # as in the network: dy is the pre-activation gradient and x a ReLU output (mask the reference accordingly)
    xr = torch.relu(x)
    dx, dxt = torch.full((m, k), float("nan"), device=DEVICE), torch.full((k, m), float("nan"), device=DEVICE)
    db_prev = _rand(k, gen=gen)  # accumulated into: starts from a nonzero value
    db_acc = dev(db_prev)
    linear_backward_input(dev(dy), dev(_wt(w, g, gain_group)), dev(xr), dxt, db_acc, dx=dx)
    dx_ref = ((dy * g.repeat_interleave(gain_group)[:n]) @ w) * (xr > 0)
    torch.testing.assert_close(dx.cpu().double(), dx_ref, **CPU_TOL)
    assert torch.equal(dxt, dx.T)
    torch.testing.assert_close(db_acc.cpu().double(), db_prev + dx_ref.sum(0), **CPU_TOL)

    # weight gradients: dy taken as the pre-activation gradient (what the network's backward passes in)
    dw, dg = (torch.zeros_like(dev(t)) for t in (w, g))
    w2, g2 = (t.clone().requires_grad_(True) for t in (w, g))
    linear_reference(x, w2, b, g2, gain_group, relu=False).backward(dy)
    linear_backward_weight(dev(dy.T.contiguous()), split_tf32(dev(x.T)), dev(w), dev(g), dw, dg, gain_group)
    torch.testing.assert_close(dw.cpu().double(), w2.grad, **CPU_TOL)
    torch.testing.assert_close(dg.cpu().double(), g2.grad, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("m,n,k,k0,gain0", [(200, 48, 96, 13, 96), (130, 40, 300, 64, 7), (70, 20, 256, 20, 48)])
def test_input_gradient_fuses_the_weight_gradient_of_the_layer_below(m, n, k, k0, gain0):
    """weight_grad_below: the layer below's dW and dg from the dz tiles in registers, as the unfused pair of launches
    gives them; dz^T not written. Cases: one gain group over all rows, groups of 7 (per-row dg atomics), groups of
    48 splitting the 128-row tiles."""
    gen = torch.Generator().manual_seed(m + k)
    dy, w = _rand(m, n, gen=gen), _rand(n, k, gen=gen, scale=k**-0.5)
    x, x0 = torch.relu(_rand(m, k, gen=gen)), _rand(m, k0, gen=gen)
    w0, g0 = _rand(k, k0, gen=gen), 1 + _rand(-(-k // gain0), gen=gen, scale=0.2)
    dev = lambda t: t.float().contiguous().to(DEVICE)  # noqa: E731
    db, dw0, dg0 = (torch.zeros(s, device=DEVICE) for s in ((k,), (k, k0), g0.shape))
    got = linear_backward_input(
        dev(dy),
        split_tf32(dev(w.T)),
        dev(x),
        None,
        db,
        weight_grad_below=(split_tf32(dev(x0.T)), dev(w0), dev(g0), dw0, dg0, gain0),
    )
    assert got is None
    dz = (dy @ w) * (x > 0)
    part = dz.T @ x0
    torch.testing.assert_close(dw0.cpu().double(), g0.repeat_interleave(gain0)[:k, None] * part, **CPU_TOL)
    dg_ref = torch.zeros_like(g0).index_add_(0, torch.arange(k) // gain0, (w0 * part).sum(1))
    torch.testing.assert_close(dg0.cpu().double(), dg_ref, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(db.cpu().double(), dz.sum(0), **CPU_TOL)
    with pytest.raises(ValueError, match="w0 must be"):
        linear_backward_input(
            dev(dy),
            split_tf32(dev(w.T)),
            dev(x),
            None,
            db,
            weight_grad_below=(split_tf32(dev(x0.T)), dev(w0[:-1]), dev(g0), dw0, dg0, gain0),
        )
    with pytest.raises(ValueError, match="dxt"):
        linear_backward_input(dev(dy), split_tf32(dev(w.T)), dev(x), None, db)
    with pytest.raises(ValueError, match="dxt must be None"):
        linear_backward_input(
            dev(dy),
            split_tf32(dev(w.T)),
            dev(x),
            torch.empty(k, m, device=DEVICE),
            db,
            weight_grad_below=(split_tf32(dev(x0.T)), dev(w0), dev(g0), dw0, dg0, gain0),
        )
    with pytest.raises(ValueError, match="hi and lo"):
        linear_backward_input(dev(dy), dev(w.T).expand(3, -1, -1).contiguous(), dev(x), None, db)


def test_weight_transpose_writes_every_matrix_scaled_in_one_launch():
    gen = torch.Generator().manual_seed(3)
    shapes = [(70, 33, 70), (20, 130, 5), (9, 9, 9)]  # (N, K, gain_group): several tiles, several groups per tile
    parts, entries, pos = [], [], 7  # the matrices sit at nonzero offsets of one flat buffer
    for n, k, gg in shapes:
        w, _, g = _layer(gen, n, k, gg)
        entries.append((pos, pos + n * k, n, k, gg))
        parts += [w.flatten(), g]
        pos += n * k + g.numel()
    flat = torch.cat([_rand(7, gen=gen), *parts]).float().to(DEVICE)
    op = WeightTranspose(entries, torch.device(DEVICE))
    dst = torch.full((op.numel,), float("nan"), device=DEVICE)
    op(flat, dst)
    for (w_off, g_off, n, k, gg), got in zip(entries, op.views(dst)):
        w, g = flat[w_off : w_off + n * k].view(n, k), flat[g_off : g_off + -(-n // gg)]
        ref = _wt(w, g, gg)
        assert torch.equal(got[0], ref[0])  # hi: the float32 product rounded to TF32
        # lo: on the GPU the compiler contracts w * g - hi into one FMA, so lo is the remainder of the exact
        # product, not of its float32 rounding: within an ulp of the product (2^-23) plus lo's own rounding
        bound = 2.0**-21 * _scaled_wt(w, g, gg).abs()
        assert ((got[1] - ref[1]).abs() <= bound).all()
        if DEVICE == "cpu":  # the interpreter rounds the product first, as the reference
            assert torch.equal(got[1], ref[1])
    with pytest.raises(ValueError, match="src has"):
        op(flat[:50], dst)
    with pytest.raises(ValueError, match="bad entry"):
        WeightTranspose([(0, 0, 0, 3, 1)], torch.device(DEVICE))
    with pytest.raises(ValueError, match="bad entry"):
        WeightTranspose([(0, 9, 3, 3, 1.5)], torch.device(DEVICE))


@pytest.mark.smoke
def test_two_nets_in_one_launch_use_each_buffer():
    gen = torch.Generator().manual_seed(5)
    n, k, m = 24, 17, 45
    bufs = []
    for _ in range(2):
        w, b, g = _layer(gen, n, k, n)
        bufs.append(torch.cat([w.flatten(), b, g]))
    flat = torch.cat(bufs).float().to(DEVICE)
    p = bufs[0].numel()
    w0, b0, g0 = flat[: n * k].view(n, k), flat[n * k : n * k + n], flat[n * k + n : p]
    x = _rand(m, k, gen=gen)
    y = torch.full((2, m, n), float("nan"), device=DEVICE)
    linear_forward(x.float().to(DEVICE), w0, b0, g0, y, n, True, nets=2, p_zstride=p, ddqn=True)
    for z in range(2):
        bz = bufs[z]
        ref = linear_reference(x, bz[: n * k].view(n, k), bz[n * k : n * k + n], bz[n * k + n :], n, True)
        torch.testing.assert_close(y[z].cpu().double(), ref, **FWD_TOL)


@pytest.mark.parametrize(
    "m,branches,actions,hidden,programs",
    [(50, 3, 4, 20, None), (140, 1, 2, 32, None), (300, 1, 2, 16, 4), (517, 3, 5, 20, 4)],
)  # few backward programs: each runs several row blocks, as at seed scale
def test_heads_forward_and_backward_match_float64(m, branches, actions, hidden, programs, monkeypatch):
    if programs is not None:
        monkeypatch.setattr(hotloop.kernels.heads, "BWD_PROGRAMS", programs)
    gen = torch.Generator().manual_seed(m)
    j = 1 + branches * actions
    h = torch.relu(_rand(m, (1 + branches) * hidden, gen=gen))
    w, b, g = (
        _rand(j, hidden, gen=gen, scale=hidden**-0.5),
        _rand(j, gen=gen),
        1 + _rand(1 + branches, gen=gen, scale=0.2),
    )
    dev = lambda t: t.float().to(DEVICE)  # noqa: E731
    q = torch.full((m, branches * actions), float("nan"), device=DEVICE)
    heads_forward(dev(h), dev(w), dev(b), dev(g), q, branches)
    h_, w_, b_, g_ = (t.clone().requires_grad_(True) for t in (h, w, b, g))
    ref = heads_reference(h_, w_, b_, g_, branches)
    torch.testing.assert_close(q.cpu().double().view(m, branches, actions), ref.detach(), **FWD_TOL)
    dq = _rand(m, branches, actions, gen=gen)
    ref.backward(dq)
    dh = torch.full_like(dev(h), float("nan"))
    dht = torch.full((h.shape[1], m), float("nan"), device=DEVICE)
    db_h = torch.zeros(h.shape[1], device=DEVICE)
    dw, db, dg = (torch.zeros_like(dev(t)) for t in (w, b, g))
    heads_backward(dev(h), dev(dq).view(m, -1), dev(w), dev(g), dh, dht, db_h, dw, db, dg, branches)
    torch.testing.assert_close(dh.cpu().double(), h_.grad * (h > 0), **CPU_TOL)
    assert torch.equal(dht, dh.T)
    torch.testing.assert_close(db_h.cpu().double(), (h_.grad * (h > 0)).sum(0), **CPU_TOL)
    torch.testing.assert_close(dw.cpu().double(), w_.grad, **CPU_TOL)
    torch.testing.assert_close(db.cpu().double(), b_.grad, **CPU_TOL)
    torch.testing.assert_close(dg.cpu().double(), g_.grad, rtol=1e-4, atol=1e-3)


def test_fixed_gains_get_no_gradient_and_the_rest_is_unchanged():
    """dg None (spectral norm off: the gains stay 1, as the reference learner's plain layers): each of the three
    backward launchers writes no gain gradient (the gain slots next to dW in one gradient buffer keep their
    sentinel) and every other gradient equals the learned-gain launch's (bit for bit on the CPU; on the GPU to the
    last bits that the atomic adds' order changes)."""

    def _same(a, b):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)

    gen = torch.Generator().manual_seed(11)
    dev = lambda t: t.float().contiguous().to(DEVICE)  # noqa: E731
    m, n, k, k0, gain_group = 70, 48, 40, 13, 16
    w, _, g = _layer(gen, n, k, gain_group)
    dy, x = _rand(m, n, gen=gen), _rand(m, k, gen=gen)

    def weight_grads(learn):  # dW then the groups' dg slots, as the flat layout keeps them
        buf = torch.full((n * k + g.numel(),), 7.0, device=DEVICE)
        buf[: n * k] = 0
        dw, dg = buf[: n * k].view(n, k), buf[n * k :]
        linear_backward_weight(dev(dy.T), split_tf32(dev(x.T)), dev(w), dev(g), dw, dg if learn else None, gain_group)
        return buf.cpu()

    learned, fixed = weight_grads(True), weight_grads(False)
    assert torch.equal(fixed[n * k :], torch.full((g.numel(),), 7.0)) and not torch.equal(
        learned[n * k :], fixed[n * k :]
    )
    _same(fixed[: n * k], learned[: n * k])

    w0, g0 = _rand(k, k0, gen=gen), 1 + _rand(1, gen=gen, scale=0.2)
    x0, xr = _rand(m, k0, gen=gen), torch.relu(x)

    def fused(learn):
        db, buf = torch.zeros(k, device=DEVICE), torch.full((k * k0 + 1,), 7.0, device=DEVICE)
        buf[: k * k0] = 0
        below = (
            split_tf32(dev(x0.T)),
            dev(w0),
            dev(g0),
            buf[: k * k0].view(k, k0),
            buf[k * k0 :] if learn else None,
            k,
        )
        linear_backward_input(dev(dy), dev(_wt(w, g, gain_group)), dev(xr), None, db, weight_grad_below=below)
        return torch.cat([buf, db]).cpu()

    learned, fixed = fused(True), fused(False)
    assert float(fixed[k * k0]) == 7.0 and float(learned[k * k0]) != 7.0
    _same(torch.cat([fixed[: k * k0], fixed[k * k0 + 1 :]]), torch.cat([learned[: k * k0], learned[k * k0 + 1 :]]))

    branches, actions, hidden = 2, 3, 20
    j = 1 + branches * actions
    h = torch.relu(_rand(m, (1 + branches) * hidden, gen=gen))
    wo, go, dq = (
        _rand(j, hidden, gen=gen, scale=hidden**-0.5),
        1 + _rand(1 + branches, gen=gen, scale=0.2),
        _rand(m, branches * actions, gen=gen),
    )

    def heads(learn):
        dh, dht = torch.empty(m, h.shape[1], device=DEVICE), torch.empty(h.shape[1], m, device=DEVICE)
        db_h, dw, db = (
            torch.zeros(h.shape[1], device=DEVICE),
            torch.zeros(j, hidden, device=DEVICE),
            torch.zeros(j, device=DEVICE),
        )
        dg = torch.full((1 + branches,), 7.0, device=DEVICE)
        heads_backward(dev(h), dev(dq), dev(wo), dev(go), dh, dht, db_h, dw, db, dg if learn else None, branches)
        return [t.cpu() for t in (dh, db_h, dw, db, dg)]

    learned, fixed = heads(True), heads(False)
    assert torch.equal(fixed[-1], torch.full((1 + branches,), 7.0)) and not torch.equal(learned[-1], fixed[-1])
    for a, b in zip(fixed[:-1], learned[:-1]):
        _same(a, b)


def test_launchers_reject_bad_inputs():
    w = torch.randn(8, 16, device=DEVICE)
    b, g = torch.randn(8, device=DEVICE), torch.ones(1, device=DEVICE)
    y = torch.empty(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="x must be"):
        linear_forward(torch.randn(4, 15, device=DEVICE), w, b, g, y, 8, True)
    with pytest.raises(ValueError, match="g must have shape"):
        linear_forward(torch.randn(4, 16, device=DEVICE), w, b, torch.ones(2, device=DEVICE), y, 8, True)
    with pytest.raises(ValueError, match="b must have dtype"):
        linear_forward(torch.randn(4, 16, device=DEVICE), w, b.double(), g, y, 8, True)
    with pytest.raises(ValueError, match="w_out must be"):
        heads_forward(
            torch.randn(4, 32, device=DEVICE),
            torch.randn(6, 16, device=DEVICE),
            torch.randn(6, device=DEVICE),
            torch.ones(2, device=DEVICE),
            torch.empty(4, 5, device=DEVICE),
            4,
        )
    e = lambda *shape: torch.empty(*shape, device=DEVICE)  # noqa: E731
    with pytest.raises(ValueError, match="h must have at least one row"):  # was a ZeroDivisionError
        heads_backward(e(0, 8), e(0, 2), e(3, 4), e(2), e(0, 8), e(8, 0), e(8), e(3, 4), e(3), e(2), 1)


@pytest.mark.gpu
def test_precision_placement_on_gpu():
    """Forward TF32 (error ~1e-3 vs float64), backward FP32-accurate (<= 1e-5), at seed-scale layer 2 shapes."""
    gen = torch.Generator().manual_seed(0)
    m, n, k = 8192, 256, 512
    w, b, g = _layer(gen, n, k, n)
    x = torch.relu(_rand(m, k, gen=gen))
    dev = lambda t: t.float().cuda()  # noqa: E731
    y = torch.empty(m, n, device="cuda")
    linear_forward(dev(x), dev(w), dev(b), dev(g), y, n, False)
    xf, wf, bf, gf = (dev(t).double() for t in (x, w, b, g))  # the float32-rounded inputs, exactly
    fwd_err = _rel(y, linear_reference(xf, wf, bf, gf, n, False))
    assert 1e-5 < fwd_err < 5e-3, f"forward relative error {fwd_err:.2e}: not TF32"
    dy = _rand(m, n, gen=gen)
    dxt = torch.empty(k, m, device="cuda")
    v = _scaled_wt(dev(w), dev(g), n)  # float32 g-scaled W^T; the kernel reads its TF32 split, as WeightTranspose
    linear_backward_input(dev(dy), split_tf32(v), dev(x), dxt, torch.zeros(k, device="cuda"))  # writes it
    dyf = dev(dy).double()
    dx_err = _rel(dxt.T, (dyf @ v.double().T) * (xf > 0))
    dw, dg = torch.zeros(n, k, device="cuda"), torch.zeros(1, device="cuda")
    linear_backward_weight(dev(dy.T.contiguous()), split_tf32(dev(x.T)), dev(w), dev(g), dw, dg, n)
    dw_err = _rel(dw, gf * (dyf.T @ xf))
    assert dx_err <= 1e-5 and dw_err <= 1e-5, f"backward relative errors dx {dx_err:.2e}, dw {dw_err:.2e}"


@pytest.mark.gpu
def test_forward_error_on_gpu_is_tf32_without_a_sign():
    """The TF32 forward rounds its operands before the MMA (kernels/linear.py): on positive data its mean signed
    error is near 0, where the MMA's own truncation would give about -1e-3 (-6.7e-4 in the CPU emulation of main's
    kernel), a bias of Q that the TD fixed point amplifies 100x (results/cpu/learning_causes/README.md, H6)."""
    gen = torch.Generator().manual_seed(2)
    m, n, k = 8192, 256, 512
    w, b = _rand(n, k, gen=gen, scale=k**-0.5).abs(), _rand(n, gen=gen, scale=0.1).abs()
    x = torch.relu(_rand(m, k, gen=gen)) + 0.1
    dev = lambda t: t.float().cuda()  # noqa: E731
    y = torch.empty(m, n, device="cuda")
    linear_forward(dev(x), dev(w), dev(b), torch.ones(1, device="cuda"), y, n, False)
    ref = linear_reference(*(dev(t).double() for t in (x, w, b)), torch.ones(1, device="cuda").double(), n, False)
    assert 1e-5 < _rel(y, ref) < 5e-3
    bias = float(((y.double() - ref) / ref).mean())
    assert abs(bias) < 1e-4, f"mean signed relative error {bias:.2e}: the operands reached the MMA unrounded"
    # the step's path: the weights from a rounded copy (w_tf32), the output stored rounded for the next layer: the
    # same products as the in-loop rounding, stored as TF32 values (within one TF32 ulp of y, 2^-11 relative)
    wc = tf32_round_copy(dev(w), torch.full((n, k), float("nan"), device="cuda"))
    yc = torch.full((m, n), float("nan"), device="cuda")
    linear_forward(dev(x), wc, dev(b), torch.ones(1, device="cuda"), yc, n, False, w_tf32=True, out_tf32=True)
    assert not bool((yc.view(torch.int32) & 0x1FFF).any()), "the output is not stored as TF32 values"
    assert bool(((yc - y).abs() <= 2.0**-11 * y.abs()).all())


@pytest.mark.gpu
def test_fused_first_layer_weight_gradient_is_fp32_accurate_on_gpu():
    """The first layer's weight gradient fused into the second layer's input gradient (seed-scale shapes: 8192 rows,
    256 -> 512 -> 64) keeps the backward's FP32 bound (<= 1e-5 relative to float64), as the unfused kernels do."""
    gen = torch.Generator().manual_seed(1)
    m, n, k, k0 = 8192, 256, 512, 64
    dy, w = _rand(m, n, gen=gen), _rand(n, k, gen=gen, scale=k**-0.5)
    x, x0, w0 = torch.relu(_rand(m, k, gen=gen)), _rand(m, k0, gen=gen), _rand(k, k0, gen=gen, scale=k0**-0.5)
    g0 = 1 + _rand(1, gen=gen, scale=0.2)
    dev = lambda t: t.float().contiguous().cuda()  # noqa: E731
    db, dw0, dg0 = torch.zeros(k, device="cuda"), torch.zeros(k, k0, device="cuda"), torch.zeros(1, device="cuda")
    linear_backward_input(
        dev(dy),
        split_tf32(dev(w.T)),
        dev(x),
        None,
        db,
        weight_grad_below=(split_tf32(dev(x0.T)), dev(w0), dev(g0), dw0, dg0, k),
    )
    f64 = lambda t: dev(t).double()  # noqa: E731  (the float32-rounded inputs, exactly)
    part = ((f64(dy) @ f64(w)) * (f64(x) > 0)).T @ f64(x0)
    dw_err = _rel(dw0, f64(g0) * part)
    dg_err = abs(float(dg0) - float((f64(w0) * part).sum())) / abs(float((f64(w0) * part).sum()))
    assert dw_err <= 1e-5 and dg_err <= 1e-4, f"fused dW0 relative error {dw_err:.2e}, dg0 {dg_err:.2e}"
