"""Fused Double-DQN TD loss (kernels/td_loss.py) vs the plain-torch terms of kernels/losses.py in float64.

On CPU the kernel runs under the Triton interpreter (tests/conftest.py); `gpu` tests run natively on CUDA.
"""

import pytest
import torch

from hotloop.kernels.td_loss import (
    METRIC_NAMES,
    TDLossOutputs,
    TDLossWorkspace,
    _num_programs,
    fused_td_loss,
    td_loss_forward,
    td_loss_reference,
)
from lab.kernel_bench_inputs import td_loss_inputs

FIELDS = ("objective", "target", "td", "per_sample", "priorities", "metrics")
SCALARS = dict(gamma=0.93, per_eps=1e-3, per_alpha=0.6)


# Kernel tests run natively on a CUDA machine and on the Triton interpreter elsewhere.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(batch, branches, actions, device=DEV, seed=0, terminal_p=0.3):
    """Fresh random float32 inputs (no zeros, Q spread wide enough to hit both Huber regimes)."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, branches, actions)
    return dict(
        q=torch.randn(shape, generator=g, device=device) * 2.0,
        q_next_online=torch.randn(shape, generator=g, device=device),
        q_next_target=torch.randn(shape, generator=g, device=device) * 1.5,
        action=torch.randint(0, actions, (batch, branches), generator=g, device=device),
        reward=torch.randn(batch, generator=g, device=device),
        terminated=(torch.rand(batch, generator=g, device=device) < terminal_p).float(),
        weights=torch.rand(batch, generator=g, device=device) * 0.9 + 0.1,
    )


def poisoned(batch, branches, actions, device=DEV):
    """NaN-filled outputs and partials, a zero counter: every value read afterwards was written by the kernel."""
    out = TDLossOutputs(*(t.fill_(float("nan")) for t in TDLossOutputs.empty(batch, branches, actions, device)))
    ws = TDLossWorkspace.create(batch, device)
    ws.partials.fill_(float("nan"))
    return out, ws


def reference(inp, **kw):
    """float64 reference outputs and its autograd gradient d(objective)/dq."""
    q64 = inp["q"].detach().double().requires_grad_()
    args = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items() if k != "q"}
    ref = td_loss_reference(q64, **args, **kw)
    ref.objective.backward()
    return ref, q64.grad


def assert_matches(res, ref, ref_grad, atol=2e-5, rtol=2e-5):
    for name in FIELDS:
        got = getattr(res, name)
        assert got.dtype == torch.float32 and not got.isnan().any(), name
        torch.testing.assert_close(got.double(), getattr(ref, name), atol=atol, rtol=rtol, msg=name)
    torch.testing.assert_close(res.grad.double(), ref_grad, atol=atol * 1e-2, rtol=rtol)


SHAPES = [(1, 2), (3, 4), (2, 5)]
LOSSES = [(kind, delta, cql) for kind, delta in (("huber", 1.0), ("huber", 0.35), ("mse", 1.0)) for cql in (0.0, 0.37)]
# Every loss configuration at the small batches; two at B = 1000 (32 programs: slow on the interpreter).
CASES = (
    [(b, *shape, *loss) for b in (1, 3, 257) for shape in SHAPES for loss in LOSSES]
    + [(1000, *shape, *loss) for shape in SHAPES for loss in (("huber", 0.35, 0.37), ("mse", 1.0, 0.0))]
    + [(5, 2, 1, "huber", 0.35, 0.37)]
)  # single-action branches


@pytest.mark.parametrize("batch,branches,actions,kind,delta,cql_weight", CASES)
def test_matches_reference(batch, branches, actions, kind, delta, cql_weight):
    inp = make_inputs(batch, branches, actions, seed=batch * 31 + actions)
    kw = dict(kind=kind, huber_delta=delta, cql_weight=cql_weight, **SCALARS)
    ref, ref_grad = reference(inp, **kw)
    out, ws = poisoned(batch, branches, actions)
    q = inp["q"].clone().requires_grad_()
    res = fused_td_loss(**{**inp, "q": q}, **kw, out=out, workspace=ws)
    assert_matches(res, ref, ref_grad)
    assert ws.counter.item() == 0, "the last program must reset the ticket counter"
    (res.objective * 1.7).backward()  # backward scales the saved gradient by grad_output
    torch.testing.assert_close(q.grad.double(), 1.7 * ref_grad, atol=1e-7, rtol=2e-5)
    if cql_weight == 0:
        assert res.metrics[METRIC_NAMES.index("cql")].item() == 0.0


@pytest.mark.parametrize("terminal_p,gamma", [(1.0, 0.99), (0.0, 0.99), (0.5, 0.0), (0.5, 1.0)])
def test_terminal_mixes_and_gamma_extremes(terminal_p, gamma):
    inp = make_inputs(67, 3, 4, seed=5, terminal_p=terminal_p)
    kw = dict(SCALARS, gamma=gamma, kind="huber", huber_delta=0.8, cql_weight=0.1)
    ref, ref_grad = reference(inp, **kw)
    res = fused_td_loss(**inp, **kw, out=poisoned(67, 3, 4)[0])
    assert_matches(res, ref, ref_grad)
    if terminal_p == 1.0 or gamma == 0.0:
        torch.testing.assert_close(res.target, inp["reward"])


@pytest.mark.parametrize("batch,terminal_p", [(3, 0.3), (257, 0.3), (67, 0.0)])
def test_target_clip_matches_reference(batch, terminal_p):
    """target_max clips the TD target from above (the return bound): kernel and float64 reference agree on every
    output, the clip binds on some rows and not on others, and the clipped rows' gradient follows the clipped
    target. The bound sits inside the spread of the unclipped targets, so a kernel that ignores it fails."""
    inp = make_inputs(batch, 3, 4, seed=batch + 11, terminal_p=terminal_p)
    inp["reward"] = inp["reward"].abs() + 1.0  # positive returns, so the bound (their median) is > 0
    kw = dict(kind="huber", huber_delta=0.8, cql_weight=0.1, **SCALARS)
    free, _ = reference(inp, **kw)
    bound = float(free.target.median())
    ref, ref_grad = reference(inp, **kw, target_max=bound)
    out, ws = poisoned(batch, 3, 4)
    res = fused_td_loss(**inp, **kw, out=out, workspace=ws, target_max=bound)
    assert_matches(res, ref, ref_grad)
    torch.testing.assert_close(res.target.double(), free.target.clamp(max=bound), atol=2e-5, rtol=2e-5)
    clipped = free.target > bound
    if batch > 1:
        assert clipped.any() and (~clipped).any(), "the bound must bind on some rows only"
    off = fused_td_loss(**inp, **kw, target_max=0.0)  # 0: no clip
    torch.testing.assert_close(off.target.double(), free.target, atol=2e-5, rtol=2e-5)


@pytest.mark.smoke
def test_repeated_calls_have_no_stale_accumulators():
    """The default workspace's cached counter is reused: each launch leaves it at 0, for any grid size."""
    kw = dict(kind="huber", huber_delta=1.0, cql_weight=0.2, **SCALARS)
    big, small = make_inputs(257, 3, 4, seed=1), make_inputs(3, 3, 4, seed=2)
    first = fused_td_loss(**big, **kw)
    out = poisoned(257, 3, 4)[0]
    for inp, expected in ((big, first), (small, None), (big, first), (big, first)):
        q = inp["q"].clone().requires_grad_()
        res = fused_td_loss(**{**inp, "q": q}, **kw, out=out if inp is big else None)
        res.objective.backward()
        if expected is not None:
            for name in FIELDS + ("grad",):
                assert torch.equal(getattr(res, name), getattr(expected, name)), name
            assert torch.equal(q.grad, first.grad)
    ref, _ = reference(small, **kw)
    torch.testing.assert_close(fused_td_loss(**small, **kw).metrics.double(), ref.metrics, atol=2e-5, rtol=2e-5)


def test_gradient_flows_into_the_network():
    """objective.backward() through the autograd.Function gives the reference's parameter gradients."""
    torch.manual_seed(3)
    batch, branches, actions = 45, 2, 5
    net = torch.nn.Linear(7, branches * actions).to(DEV)
    obs = torch.randn(batch, 7, device=DEV)
    inp = make_inputs(batch, branches, actions, seed=9)
    kw = dict(kind="huber", huber_delta=0.5, cql_weight=0.25, **SCALARS)
    fused_td_loss(**{**inp, "q": net(obs).view(batch, branches, actions)}, **kw).objective.backward()
    fused = [p.grad.clone() for p in net.parameters()]
    net64 = torch.nn.Linear(7, branches * actions).double().to(DEV)
    net64.load_state_dict(net.state_dict())
    args = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items() if k != "q"}
    td_loss_reference(net64(obs.double()).view(batch, branches, actions), **args, **kw).objective.backward()
    for got, p in zip(fused, net64.parameters()):
        torch.testing.assert_close(got.double(), p.grad, atol=1e-6, rtol=1e-5)


def test_grid_never_single_block():
    assert _num_programs(1) == 2 and _num_programs(64) == 2 and _num_programs(65) == 3
    assert _num_programs(8192) >= 132  # seed scale fills every SM of an H100/H200


def _bad(name, value):
    inp = make_inputs(5, 2, 3, seed=4)
    kw = dict(kind="huber", huber_delta=1.0, cql_weight=0.0, target_max=0.0, **SCALARS)
    if name in inp:
        inp[name] = value
    elif name in kw:
        kw[name] = value
    return inp, kw


@pytest.mark.parametrize(
    "name,value,match",
    [
        ("q", torch.randn(5, 2, 3, dtype=torch.float64), "q must have dtype"),
        ("q", torch.randn(5, 6), "q must be 3-D"),
        ("q", torch.randn(5, 3, 2).transpose(1, 2), "q must be contiguous"),
        ("q_next_online", torch.randn(5, 2, 4), "q_next_online must have shape"),
        ("q_next_target", torch.randn(4, 2, 3), "q_next_target must have shape"),
        ("action", torch.zeros(5, 2, dtype=torch.int32), "action must have dtype"),
        ("reward", torch.randn(6), "reward must have shape"),
        ("terminated", torch.ones(5, dtype=torch.bool), "terminated must have dtype"),
        ("weights", [1.0] * 5, "weights must be a torch.Tensor"),
        ("kind", "l1", "kind must be"),
        ("gamma", 1.5, "gamma must be"),
        ("gamma", True, "gamma must be"),
        ("huber_delta", 0.0, "huber_delta must be"),
        ("cql_weight", -0.1, "cql_weight must be"),
        ("per_eps", 0.0, "per_eps must be"),
        ("per_alpha", float("nan"), "per_alpha must be"),
        ("target_max", -1.0, "target_max must be"),
        ("target_max", float("inf"), "target_max must be"),
    ],
)
def test_value_errors(name, value, match):
    inp, kw = _bad(name, value)
    with pytest.raises(ValueError, match=match):
        td_loss_forward(**inp, **kw)


def test_value_errors_for_buffers():
    inp, kw = _bad(None, None)
    out, ws = poisoned(5, 2, 3)
    with pytest.raises(ValueError, match="out.grad must have shape"):
        td_loss_forward(**inp, **kw, out=out._replace(grad=torch.empty(5, 2, 4, device=DEV)))
    with pytest.raises(ValueError, match="workspace.partials must have shape"):
        td_loss_forward(**inp, **kw, workspace=ws._replace(partials=torch.empty(3, 8, device=DEV)))
    with pytest.raises(ValueError, match="workspace.counter must have dtype"):
        td_loss_forward(**inp, **kw, workspace=ws._replace(counter=torch.zeros(1, dtype=torch.int64, device=DEV)))
    with pytest.raises(ValueError, match="q must have B, D, A >= 1"):
        td_loss_forward(**{**inp, "q": torch.empty(0, 2, 3, device=DEV)}, **kw)


@pytest.mark.gpu
def test_seed_scale_matches_reference_on_gpu():
    args = td_loss_inputs("cuda")
    q = args["q"]
    inp = {k: v.detach() for k, v in args.items() if isinstance(v, torch.Tensor)}
    kw = {k: v for k, v in args.items() if k not in inp}
    ref, ref_grad = reference(inp, **kw)
    out, ws = poisoned(8192, 3, 4, "cuda")
    res = fused_td_loss(**{**inp, "q": q}, **kw, out=out, workspace=ws)
    assert_matches(res, ref, ref_grad)
    res.objective.backward()
    torch.testing.assert_close(q.grad.double(), ref_grad, atol=1e-9, rtol=2e-5)
    assert ws.counter.item() == 0


@pytest.mark.gpu
def test_cuda_graph_replay_equals_eager():
    """Capture forward + backward once; replay on new inputs copied into the static ones, 5 times."""
    kw = dict(kind="huber", huber_delta=1.0, cql_weight=0.1, **SCALARS)
    static = make_inputs(8192, 3, 4, device="cuda", seed=0)
    q = static["q"].requires_grad_()
    out, ws = poisoned(8192, 3, 4, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            q.grad = None
            fused_td_loss(**static, **kw, out=out, workspace=ws).objective.backward()
    torch.cuda.current_stream().wait_stream(side)
    q.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_td_loss(**static, **kw, out=out, workspace=ws).objective.backward()
    for seed in range(1, 6):
        fresh = make_inputs(8192, 3, 4, device="cuda", seed=seed)
        with torch.no_grad():
            for name, t in fresh.items():
                static[name].copy_(t)
        graph.replay()
        q_eager = fresh["q"].clone().requires_grad_()
        eager = fused_td_loss(**{**fresh, "q": q_eager}, **kw, workspace=TDLossWorkspace.create(8192, "cuda"))
        eager.objective.backward()
        torch.cuda.synchronize()
        for name in FIELDS:
            torch.testing.assert_close(getattr(out, name), getattr(eager, name), atol=0, rtol=0, msg=name)
        torch.testing.assert_close(q.grad, q_eager.grad, atol=0, rtol=0)
        assert ws.counter.item() == 0
