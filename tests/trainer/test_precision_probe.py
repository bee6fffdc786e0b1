"""guards/probes/precision_probe.py: the learner's GEMMs judged by their numbers, not their kernel names.

CPU: the Triton interpreter computes every dot in fp32 whatever its input_precision, so the probe must say it cannot
judge (NOT_MEASURED); with the interpreter's dot patched to do what Hopper's tensor cores do (a "tf32" dot drops
the low 13 mantissa bits of each fp32 operand; "tf32x3" is Triton's split: the patch of
tests/kernels/test_tf32_emulated.py, repeated here as a fixture), the step's forward must classify TF32-like and its
backward FP32-accurate, while an IEEE forward in a kernel NAMED tf32 and a backward cut down to one TF32 dot FAIL.
GPU (`gpu` marker, the H200): the same verdicts from the hardware itself. The mutants are the lab's
(results/lab/precision_variants.py, results/lab/precision_bounds.py): not shipped, imported from the checkout.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from test_hot_learner import _setup as hot_setup

from hotloop.guards.probes import precision_probe as pp
from hotloop.kernels.tf32_split import split_tf32
from lab.precision_bounds import variant_launchers
from lab.precision_variants import variant_linear_backward_weight, variant_linear_forward

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _setup(device=DEVICE, seed=0, **overrides):
    """A small HotLearner (tests/trainer/test_hot_learner.py's `_setup`) over 200 random transitions, one step
    taken."""
    *_, hot = hot_setup(device, seed, **overrides)
    hot.step()
    return hot


def _errors(result: pp.ProbeResult) -> dict[str, float]:
    return {p.name: p.error for p in result.products}


def test_products_cover_every_gemm_of_the_step():
    hot = _setup()
    result = pp.probe_precision(hot, pp.replay_batch(hot))
    names = [p.name for p in result.products]
    assert names == [
        "forward.L0",
        "forward.L1",
        "forward.L2",
        "ddqn.L0",
        "ddqn.L1",
        "ddqn.L2",
        "forward.heads",
        "ddqn.heads",
        "backward.heads.dh",
        "backward.heads.dW",
        "backward.dW.L2",
        "backward.dX.L2",
        "backward.dW.L1",
        "backward.dX.L1",
        "backward.dW.L0",
    ]
    by = {p.name: p for p in result.products}
    assert (by["forward.L1"].m, by["forward.L1"].n, by["forward.L1"].k) == (32, 16, 24)
    assert (by["backward.dW.L1"].m, by["backward.dW.L1"].n, by["backward.dW.L1"].k) == (16, 24, 32)
    assert "fused" in by["backward.dW.L0"].launcher and "linear_backward_input" in by["backward.dW.L0"].launcher
    assert all(p.live > 0 for p in result.products)
    assert result.table().shape[0] == len(names)


def test_interpreter_without_emulation_cannot_judge_the_forward():
    """No TF32 rounding on the plain interpreter: the forward looks FP32-like, and that is no FAIL."""
    if torch.cuda.is_available():
        pytest.skip("interpreter behaviour")
    hot = _setup()
    assert pp.tf32_dot_rounds(DEVICE) is False
    result = pp.probe_precision(hot, pp.replay_batch(hot))
    assert not result.tf32_rounds and "interpreter" in result.platform
    assert all(p.cls == pp.FP32_LIKE for p in result.products), _errors(result)
    assert pp.forward_verdict(result)[0] == pp.NOT_MEASURED
    assert pp.backward_verdict(result)[0] == pp.NOT_MEASURED  # a one-dot TF32 backward would pass here too
    verdict, evidence = pp.precision_verdict(result)
    assert verdict == pp.NOT_MEASURED == "not measured (CPU interpreter: no TF32 rounding)"
    assert any("do NOT round" in line for line in evidence)
    assert any("not available (interpreter)" in line for line in evidence)


def test_step_under_emulated_tf32_passes(hardware_tf32):
    hot = _setup()
    assert pp.tf32_dot_rounds(DEVICE) is True
    result = pp.probe_precision(hot, pp.replay_batch(hot))
    assert result.tf32_rounds
    for p in result.phase("forward"):
        assert p.cls == pp.TF32_LIKE, (p.name, p.error)
    for p in result.phase("backward"):
        assert p.cls == pp.FP32_LIKE, (p.name, p.error)
    verdict, evidence = pp.precision_verdict(result)
    assert verdict == pp.PASS, "\n".join(evidence)


def test_ieee_forward_in_a_kernel_named_tf32_fails(hardware_tf32):
    """The mutant keeps a TF32 name (the name-based classifier calls it TF32) but multiplies in IEEE FP32, on the
    weights as they are (no TF32-rounded copy): the probe sees FP32-like errors and the TF32-forward verdict FAILs.
    Swapped on the learner, as guards/faults.py swaps. (On the step's rounded operands an IEEE dot has TF32's
    errors: the instruction check below catches that one.)"""
    from lab import precision_variants

    name = precision_variants._variant_tf32_gemm_kernel.__name__
    assert "tf32" in name
    try:  # the name-based classifier the probe replaces (if it is still there) calls it TF32
        from hotloop.guards.step_metrics import gemm_precision
    except ImportError:
        gemm_precision = None
    if gemm_precision is not None:
        assert gemm_precision(name) == "tf32"
    hot = _setup()
    hot.linear_forward = variant_linear_forward("ieee")
    hot.round_weights = lambda src, dst: dst.copy_(src)
    result = pp.probe_precision(hot, pp.replay_batch(hot))
    fwd = result.phase("forward")
    assert all("variant_linear_forward[ieee]" in p.launcher for p in fwd if ".heads" not in p.name)
    assert {p.cls for p in fwd if ".heads" not in p.name} == {pp.FP32_LIKE}, _errors(result)
    verdict, lines = pp.forward_verdict(result)
    assert verdict == pp.FAIL and "not TF32" in lines[-1] and "forward.L0" in lines[-1]
    assert pp.backward_verdict(result)[0] == pp.PASS
    assert pp.precision_verdict(result)[0] == pp.FAIL


def test_forward_kernel_compiled_without_tf32_mma_fails(hardware_tf32):
    """An IEEE dot on the step's TF32-rounded operands has TF32's errors, so the forward verdict also reads the
    compiled kernels' instructions: a forward kernel specialization with no TF32 MMA (a mutant that keeps the
    kernel's name and sets input_precision="ieee") FAILs it, naming the kernel; backward kernels without MMAs (the
    heads' FMA backward) and kernels without evidence are not held against it."""
    hot = _setup()
    result = pp.probe_precision(hot, pp.replay_batch(hot))
    assert pp.forward_verdict(result)[0] == pp.PASS, pp.forward_verdict(result)[1]
    mma = {"tf32_mma": 8, "fma.f32": 64}
    clean = {
        "_fwd_online_tf32_gemm_kernel": [mma],
        "_heads_bwd_fp32_kernel": [{"tf32_mma": 0, "fma.f32": 499}],
        "_heads_online_tf32_kernel": "not available (not compiled in this process)",
    }
    assert pp.forward_verdict(replace(result, instructions=clean))[0] == pp.PASS
    ieee = {**clean, "_fwd_ddqn_tf32_gemm_kernel": [mma, {"tf32_mma": 0, "fma.f32": 1024}]}
    verdict, lines = pp.forward_verdict(replace(result, instructions=ieee))
    assert verdict == pp.FAIL and "_fwd_ddqn_tf32_gemm_kernel (fma.f32=1024)" in lines[-1], lines[-1]
    assert pp.forward_kernels_without_tf32("not available (interpreter)") == []


def test_heads_between_fp32_and_tf32_pass_and_trunk_layers_do_not(hardware_tf32):
    """The heads read their input already rounded to TF32, so only their few weights' rounding shows: an error
    between FP32's and TF32's is theirs to have (seen on the H200); a trunk layer there still FAILs the forward."""
    hot = _setup()
    result = pp.probe_precision(hot, pp.replay_batch(hot))

    def moved(names):
        return replace(
            result,
            products=tuple(replace(p, cls=pp.BETWEEN, error=3e-5) if p.name in names else p for p in result.products),
        )

    assert pp.forward_verdict(moved({"forward.heads", "ddqn.heads"}))[0] == pp.PASS
    verdict, lines = pp.forward_verdict(moved({"forward.L1"}))
    assert verdict == pp.FAIL and "forward.L1" in lines[-1], lines[-1]


def test_fp32_like_heads_pass_only_where_their_instructions_were_checked(hardware_tf32):
    """A heads error below FP32_BOUND is a draw of their few weights' rounding (9.5e-6 on the H200 in one clean
    gate): it passes where the compiled heads kernels were seen to hold TF32 MMAs, not where there is no such
    evidence (the interpreter's string), and a heads kernel compiled without TF32 MMAs FAILs."""
    hot = _setup()
    result = pp.probe_precision(hot, pp.replay_batch(hot))
    fp32_heads = replace(
        result,
        products=tuple(
            replace(p, cls=pp.FP32_LIKE, error=9.5e-6) if ".heads" in p.name else p for p in result.products
        ),
    )
    mma = {"tf32_mma": 4, "fma.f32": 8}
    checked = {"_fwd_online_tf32_gemm_kernel": [mma], "_heads_online_tf32_kernel": [mma]}
    assert pp.forward_verdict(replace(fp32_heads, instructions=checked))[0] == pp.PASS
    verdict, lines = pp.forward_verdict(replace(fp32_heads, instructions="not available (interpreter)"))
    assert verdict == pp.FAIL and "forward.heads" in lines[-1], lines[-1]
    ieee = {**checked, "_heads_online_tf32_kernel": [{"tf32_mma": 0, "fma.f32": 96}]}
    verdict, lines = pp.forward_verdict(replace(fp32_heads, instructions=ieee))
    assert verdict == pp.FAIL and "_heads_online_tf32_kernel" in lines[-1], lines[-1]


def _rounded_product(x, w, delta_x, delta_w):
    """(got, ref) of x @ w.T computed on operands carrying relative errors delta_x, delta_w (float64)."""
    return (x * (1 + delta_x)) @ (w * (1 + delta_w)).T, x @ w.T


def test_bias_se_covers_the_shared_rounding_errors_of_few_weights():
    """forward.L0's shape on CartPole (128 rows, K = 4, 64 columns; a few large inputs): rounding errors of zero mean
    on inputs (shared along a row) and weights (shared along a column) drawn 300 times. The clustered standard error
    matches the spread of the bias across draws, no draw sits BIAS_Z of them from zero, and the per-entry standard
    error (no clusters) would understate the spread; a truncation (every error negative) is BIAS_Z away on every
    draw."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 4, generator=g, dtype=torch.float64) * torch.tensor([0.1, 0.5, 0.05, 2.0], dtype=torch.float64)
    w = torch.randn(64, 4, generator=g, dtype=torch.float64)
    u = 2.0**-11

    def draw(lo, hi):
        return [lo + (hi - lo) * torch.rand(t.shape, generator=g, dtype=torch.float64) for t in (x, w)]

    rounded = [pp._Err().add(*_rounded_product(x, w, *draw(-u, u))) for _ in range(300)]
    biases = torch.tensor([e.bias() for e in rounded])
    se = torch.tensor([e.bias_se() for e in rounded])
    assert 0.8 < float(se.mean() / biases.std()) < 1.2, (float(se.mean()), float(biases.std()))
    assert float((biases.abs() / se).max()) < pp.BIAS_Z
    entrywise = [
        math.sqrt(float(((e.pieces[(128, 64)][0] - e.bias() * e.pieces[(128, 64)][1]) ** 2).sum())) / e.den
        for e in rounded
    ]
    assert sum(entrywise) / len(entrywise) < 0.5 * float(biases.std())
    truncated = [pp._Err().add(*_rounded_product(x, w, *draw(-2 * u, 0.0))) for _ in range(20)]
    assert all(e.bias() < -pp.TF32_BIAS_MAX and -e.bias() > pp.BIAS_Z * e.bias_se() for e in truncated), [
        (e.bias(), e.bias_se()) for e in truncated
    ]


def test_bias_se_of_masked_pieces_is_the_direct_two_way_formula():
    """Two pieces of one shape (the DDQN forward's two nets on the same inputs) with dead entries: `bias_se` equals
    sqrt(V_rows + V_cols - V_entries) / ||P||^2 computed directly on the live residuals (got - ref - b P) * P of
    the two pieces summed entry by entry (dead entries 0)."""
    g = torch.Generator().manual_seed(3)
    err = pp._Err()
    resid = torch.zeros(40, 12, dtype=torch.float64)
    prods = []
    for _ in range(2):
        ref = torch.randn(40, 12, generator=g, dtype=torch.float64)
        got = ref * (1 + 1e-3 * torch.randn(40, 12, generator=g, dtype=torch.float64)) + 1e-4
        live = torch.rand(40, 12, generator=g) < 0.7
        err.add(got, ref, ref, live)
        prods.append((got, ref, live))
    b = err.bias()
    for got, ref, live in prods:
        resid += torch.where(live, (got - ref - b * ref) * ref, torch.zeros_like(ref))
    v = (resid.sum(1) ** 2).sum() + (resid.sum(0) ** 2).sum() - (resid**2).sum()
    den = sum(float((ref[live] ** 2).sum()) for _, ref, live in prods)
    assert err.bias_se() == pytest.approx(math.sqrt(float(v)) / den, rel=1e-12)


def test_a_trunk_bias_beyond_rounding_within_its_standard_errors_passes(hardware_tf32):
    """A trunk layer's bias beyond rounding (`Product.excess_bias`) beyond TF32_BIAS_MAX FAILs only when it is BIAS_Z
    standard errors from zero; the heads' limit takes no standard error. The raw bias is evidence only."""
    hot = _setup()
    result = pp.probe_precision(hot, pp.replay_batch(hot))

    def moved(name, **fields):
        return replace(result, products=tuple(replace(p, **fields) if p.name == name else p for p in result.products))

    assert pp.forward_verdict(result)[0] == pp.PASS
    assert pp.forward_verdict(moved("forward.L0", excess_bias=1.4e-4, excess_bias_se=5e-5))[0] == pp.PASS
    verdict, lines = pp.forward_verdict(moved("forward.L0", excess_bias=1.4e-4, excess_bias_se=2e-5))
    assert verdict == pp.FAIL and "biased" in lines[-1] and "forward.L0 (+1.4e-04, 7.0 se)" in lines[-1], lines[-1]
    verdict, lines = pp.forward_verdict(moved("ddqn.heads", excess_bias=-3e-4, excess_bias_se=1e-3))
    assert verdict == pp.FAIL and "ddqn.heads" in lines[-1], lines[-1]
    assert pp.forward_verdict(moved("forward.L0", bias=-5e-4, bias_se=1e-6))[0] == pp.PASS  # raw bias: not judged
    assert pp.forward_verdict(moved("forward.L1", excess_bias=math.nan))[0] == pp.FAIL  # unmeasured: not a pass


def _shrunk_by_rounding(w: torch.Tensor) -> None:
    """Move every weight of w (fp32, in place) 0.45 TF32 ulp away from zero past a TF32 value, so that rounding to
    the nearest TF32 shrinks every one by ~2^-11 relative, as a truncation would: the worst draw of rounding errors
    few weights can make (e589755's clean gate drew forward.L0 -2.4e-4 at 4.2 standard errors on the H100)."""
    t = split_tf32(w)[0]
    ulp = torch.ldexp(torch.ones_like(t), torch.frexp(t)[1] - 11)
    w.copy_(t + 0.45 * ulp * t.sign())


def test_weights_whose_rounding_shrinks_them_all_pass_and_truncation_on_them_fails(hardware_tf32):
    """The false alarm where it happened, in the weights: layer 0's weights (K = 12 here) all placed where rounding
    to TF32 shrinks them. The raw bias of forward.L0 and ddqn.L0 is then beyond TF32_BIAS_MAX and BIAS_Z standard
    errors (the rule that judged the raw bias FAILed such a draw), but the kernels rounded exactly as designed:
    their bias beyond rounding stays within, and the verdict PASSes. On the same weights, a forward that leaves its
    operands to the MMA's truncation (its input then truncated too) still FAILs on its bias beyond rounding."""
    hot = _setup()
    with torch.no_grad():
        for z in range(2):
            _shrunk_by_rounding(hot.layout.layers[0].views(hot.nets[z])[0])
    torch.manual_seed(0)
    batch = pp.replay_batch(hot)
    result = pp.probe_precision(hot, batch)
    first = [p for p in result.phase("forward") if p.name in ("forward.L0", "ddqn.L0")]
    assert len(first) == 2 and all(p.bias < -pp.TF32_BIAS_MAX and -p.bias > pp.BIAS_Z * p.bias_se for p in first), [
        (p.name, p.bias, p.bias_se) for p in first
    ]
    assert all(abs(p.excess_bias) < pp.TF32_BIAS_MAX / 2 for p in result.phase("forward")), [
        (p.name, p.excess_bias) for p in result.phase("forward")
    ]
    assert pp.forward_verdict(result)[0] == pp.PASS
    truncated = pp.probe_precision(
        hot, batch, launchers=replace(pp.Launchers.of(hot), forward=variant_linear_forward("tf32"))
    )
    verdict, lines = pp.forward_verdict(truncated)
    assert verdict == pp.FAIL and "biased beyond rounding" in lines[-1] and "forward.L0" in lines[-1], lines[-1]


def test_tf32_forward_with_truncated_operands_fails_on_its_bias(hardware_tf32):
    """The same variant kernel with precision "tf32", which leaves its operands to the MMA's truncation: TF32 errors
    (the class follows the math, not the code), but biased toward zero, so the TF32-forward verdict FAILs on the
    bias (raw and beyond rounding); the step's own forward, which rounds its operands first, keeps its bias beyond
    rounding within TF32_BIAS_MAX."""
    hot = _setup()
    torch.manual_seed(0)  # the batch (the replay draws from the global generator)
    batch = pp.replay_batch(hot)
    result = pp.probe_precision(
        hot, batch, launchers=replace(pp.Launchers.of(hot), forward=variant_linear_forward("tf32"))
    )
    layers = [p for p in result.phase("forward") if ".L" in p.name]
    assert layers and all(
        p.cls == pp.TF32_LIKE and p.bias < -pp.TF32_BIAS_MAX and p.excess_bias < -pp.TF32_BIAS_MAX for p in layers
    ), [(p.name, p.cls, p.bias, p.excess_bias) for p in layers]
    verdict, lines = pp.forward_verdict(result)
    assert verdict == pp.FAIL and "biased" in lines[-1], lines[-1]
    step = pp.probe_precision(hot, batch)
    assert all(abs(p.excess_bias) <= pp._bias_max(p) for p in step.phase("forward")), [
        (p.name, p.excess_bias) for p in step.phase("forward")
    ]


def test_fwd_fp32_fault_fails_the_forward_verdict(hardware_tf32):
    """guards/faults.py's fwd_fp32 (the online forward's GEMMs in cuBLAS FP32, on the weights as they are) as the
    gate injects it: FP32-like products on the trunk, so "TF32 forward only" FAILs. (On the step's TF32-rounded
    weights the same FP32 product would have TF32's errors and no sign.)"""
    from hotloop.guards import faults

    hot = _setup()
    faults._fwd_fp32(hot)
    verdict, lines = pp.forward_verdict(pp.probe_precision(hot, pp.replay_batch(hot)))
    assert verdict == pp.FAIL and "not TF32" in lines[-1] and "forward.L1" in lines[-1], lines[-1]


def test_last_layer_stored_unrounded_fails_on_the_heads_bias(hardware_tf32):
    """A regression where it would happen: the last trunk layer stores its output unrounded (out_tf32 dropped)
    while the heads still read it as TF32, so the MMA truncates their input: the heads' bias passes
    TF32_HEADS_BIAS_MAX and the forward verdict FAILs, naming a heads product."""
    hot = _setup()
    last = hot.layout.layers[-1].rows
    own = hot.linear_forward

    def forward(x, w, *args, out_tf32=False, **kw):
        return own(x, w, *args, out_tf32=out_tf32 and w.shape[0] != last, **kw)

    hot.linear_forward = forward
    torch.manual_seed(0)
    result = pp.probe_precision(hot, pp.replay_batch(hot))
    heads = [p for p in result.phase("forward") if ".heads" in p.name]
    assert all(p.excess_bias < -pp.TF32_HEADS_BIAS_MAX for p in heads), [(p.name, p.excess_bias) for p in heads]
    verdict, lines = pp.forward_verdict(result)
    assert verdict == pp.FAIL and "biased" in lines[-1] and ".heads" in lines[-1], lines[-1]


def test_the_step_without_its_rounding_fails_the_forward_verdict(hardware_tf32, monkeypatch):
    """The fault where it would happen: the kernels' rounding switched off (kernels/_common.py
    rounds_tf32_operands answering False), the operands then reach the emulated MMA unrounded."""
    hot = _setup()
    batch = pp.replay_batch(hot)
    monkeypatch.setenv("HOTLOOP_INTERPRET_TF32", "0")  # the interpreter's answer: no rounding in the kernels
    verdict, lines = pp.forward_verdict(pp.probe_precision(hot, batch))
    assert verdict == pp.FAIL and "biased" in lines[-1], lines


def test_one_tf32_dot_backward_fails_and_split_backward_passes(hardware_tf32):
    hot = _setup()
    batch = pp.replay_batch(hot)
    cut = pp.probe_precision(hot, batch, launchers=variant_launchers(hot, "tf32_backward"), label="tf32_backward")
    errs = _errors(cut)
    for name in ("backward.dX.L2", "backward.dX.L1", "backward.dW.L2", "backward.dW.L1", "backward.dW.L0"):
        assert errs[name] > pp.FP32_BOUND, (name, errs[name])
        assert errs[name] > 1e-5  # a TF32 product's error, far above 3xTF32's ~1e-7
    verdict, lines = pp.backward_verdict(cut)
    assert verdict == pp.FAIL and "above the FP32 bound" in lines[-1]
    assert pp.precision_verdict(cut)[0] == pp.FAIL
    # the step's own split-precision backward and Triton's tf32x3 split both stay within the bound
    for name in ("step", "tf32x3_backward"):
        ok = pp.probe_precision(hot, batch, launchers=variant_launchers(hot, name))
        assert pp.backward_verdict(ok)[0] == pp.PASS, (name, _errors(ok))
        assert max(p.error for p in ok.phase("backward")) < 1e-6


def test_probe_step_runs_the_step_math():
    """The probe's gradient buffer equals the learner step's own on the same batch and parameters."""
    hot = _setup()
    nets = hot.nets.clone()
    hot.step()  # sample -> forward -> loss -> backward -> Adam: hot.grads holds the gradient at `nets`
    batch = SimpleNamespace(indices=hot.idx.clone(), weights=hot.weights.clone())
    t = pp.probe_step(hot, batch, nets=nets)
    torch.testing.assert_close(t.q, hot.q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(t.td_grad, hot.td.grad, rtol=1e-6, atol=1e-7)
    err = float((t.grads - hot.grads).abs().max() / hot.grads.abs().max())
    assert err < 1e-5, err


def test_non_finite_backward_fails_everywhere():
    hot = _setup()
    good = variant_linear_backward_weight("ieee")

    def nan_weight_grad(dyt, xt, w, g, dw, dg, gain_group):
        good(dyt, xt, w, g, dw, dg, gain_group)
        dw.fill_(float("nan"))

    result = pp.probe_precision(
        hot, pp.replay_batch(hot), launchers=replace(pp.Launchers.of(hot), backward_weight=nan_weight_grad)
    )
    assert pp.classify(_errors(result)["backward.dW.L2"]) == pp.NON_FINITE
    assert pp.backward_verdict(result)[0] == pp.FAIL  # even where TF32 cannot be judged


def test_classify_bands():
    assert pp.FP32_BOUND < pp.TF32_MIN < pp.TF32_MAX
    assert pp.classify(2.5e-7) == pp.FP32_LIKE
    assert pp.classify(pp.FP32_BOUND) == pp.FP32_LIKE
    assert pp.classify(2e-5) == pp.BETWEEN
    assert pp.classify(4e-4) == pp.TF32_LIKE
    assert pp.classify(0.5) == pp.WORSE
    assert pp.classify(math.inf) == pp.NON_FINITE
    assert pp.classify(math.nan) == pp.NO_LIVE


def test_normwise_error_ignores_bias_and_dead_units():
    """The error is the product's: a large bias or dead ReLU entries do not dilute it."""
    prod = torch.tensor([[1.0, -1.0], [2.0, 0.5]], dtype=torch.float64)
    bias = torch.tensor([100.0, 0.0], dtype=torch.float64)
    ref = (prod + bias).relu()
    got = (ref + 1e-3 * torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)).float()
    live = pp._relu_live(got.double(), ref)
    e = pp._Err().add(got, ref, prod, live).error()
    want = math.sqrt(2e-6) / float(prod[live].norm())
    assert e == pytest.approx(want, rel=1e-2)  # (101.001 in fp32 is off by < 4e-6)
    dead = pp._Err().add(torch.zeros(2), torch.zeros(2, dtype=torch.float64), live=torch.zeros(2, dtype=torch.bool))
    assert math.isnan(dead.error()) and pp.classify(dead.error()) == pp.NO_LIVE
    empty = pp._Err().add(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.float64))
    assert math.isnan(empty.error()) and math.isnan(empty.bias_se())


def test_bad_batch_and_nets_are_refused():
    hot = _setup()
    with pytest.raises(ValueError, match="batch"):
        pp.probe_step(hot, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="replay slots"):
        pp.probe_step(hot, torch.tensor([0, 10_000]))
    with pytest.raises(ValueError, match="nets"):
        pp.probe_step(hot, torch.tensor([0, 1]), nets=hot.params)


@pytest.mark.gpu
def test_gpu_step_passes_and_mutants_fail():
    """On the GPU the hardware rounds: the step PASSes, an IEEE forward and a one-dot TF32 backward FAIL."""
    hot = _setup(torch.device("cuda"))
    assert pp.tf32_dot_rounds(hot.device)
    batch = pp.replay_batch(hot)
    step = pp.probe_precision(hot, batch)
    assert pp.precision_verdict(step)[0] == pp.PASS, "\n".join(pp.precision_verdict(step)[1])
    ieee = pp.probe_precision(hot, batch, launchers=variant_launchers(hot, "ieee_forward"))
    assert pp.forward_verdict(ieee)[0] == pp.FAIL
    cut = pp.probe_precision(hot, batch, launchers=variant_launchers(hot, "tf32_backward"))
    assert pp.backward_verdict(cut)[0] == pp.FAIL
    ins = step.instructions
    assert ins["_fwd_online_tf32_gemm_kernel"][0]["tf32_mma"] > 0
    assert ins["_bwd_dx_fp32split_gemm_kernel"][0]["tf32_mma"] > 0
    assert ins["_heads_bwd_fp32_kernel"][0]["mma"] == 0


def test_with_fixed_gains_the_probe_runs_the_steps_kernels_and_its_stand_ins():
    """Spectral norm off: the step writes no gain gradient (learns_gains False), and the probe mirrors it with the
    step's kernels and with each stand-in backward; the gain slots of its gradient buffer stay 0."""
    hot = _setup(spectral_norm=False)
    assert not hot.learns_gains
    batch = pp.replay_batch(hot)
    for launchers in (None, variant_launchers(hot, "tf32_backward")):
        t = pp.probe_step(hot, batch, launchers=launchers)
        gains = [s.views(t.grads)[2] for s in hot.layout.layers] + [hot.layout.out_views(t.grads)[2]]
        assert all(int(torch.count_nonzero(g)) == 0 for g in gains)
        assert float(t.grads.abs().sum()) > 0
