"""kernels/fused_adam.py against torch.nn.utils.clip_grad_norm_ + torch.optim.Adam (+ lerp_ for the target).

The reference runs on float64 copies of the same flat buffers (and, as a second check, in float32 exactly as a
user would run it). Tolerance after up to 100 steps, for lr = 1e-2 and parameters of order 1: params, target and
exp_avg_sq within rtol = atol = 2e-5 of the float64 reference, exp_avg within atol = 2e-5 and the grad norm
within rtol = 1e-5. Measured on CPU after 100 steps: params within 2.2e-6 of float64 and 5e-7 (a few ulps) of
the float32 torch run; the error grows about linearly in the step count.
On CPU the kernels run in the Triton interpreter; the `gpu` tests need an H100/H200-class CUDA device.
"""

from __future__ import annotations

import math

import pytest
import torch

import hotloop.kernels.fused_adam as fa_mod
from hotloop.kernels.fused_adam import FusedAdam, adam_reference, reference_params
from lab.kernel_bench_inputs import ADAM_SEED_SHAPES, adam_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=2e-5, atol=2e-5)
NORM_TOL = dict(rtol=1e-5, atol=1e-6)
LR = 1e-2


def _shapes(n: int) -> list[tuple[int, ...]]:
    """A network-like split of n parameters: one matrix, then up to two vectors."""
    cols = max(1, math.isqrt(n // 2))
    rows = (n // 2) // cols
    rest = n - rows * cols
    shapes = [(rows, cols), (rest // 2,), (rest - rest // 2,)]
    return [s for s in shapes if math.prod(s) > 0]


class _Run:
    """The fused optimizer and two torch references (float64 and float32) over identical starting buffers."""

    def __init__(
        self, n, *, weight_decay=0.0, tau=None, seed=0, lr=LR, shapes=None, lr_end_factor=1.0, lr_decay_steps=0
    ):
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.n, self.tau = n, tau
        self.max_grad_norm = math.sqrt(n)  # ~ norm of randn(n): grads are scaled by 0.3..3
        params = torch.randn(n, generator=self.gen)
        target = torch.randn(n, generator=self.gen)
        self.fused = FusedAdam(
            n,
            DEVICE,
            lr=lr,
            weight_decay=weight_decay,
            max_grad_norm=self.max_grad_norm,
            lr_end_factor=lr_end_factor,
            lr_decay_steps=lr_decay_steps,
        )
        self.params, self.target = params.to(DEVICE, copy=True), target.to(DEVICE, copy=True)
        self.refs = []
        for dtype in (torch.float64, torch.float32):
            p, g = params.to(DEVICE, dtype, copy=True), torch.empty(n, dtype=dtype, device=DEVICE)
            opt = torch.optim.Adam(
                reference_params(p, g, shapes or _shapes(n)), lr=float(lr), weight_decay=weight_decay
            )
            sched = (
                torch.optim.lr_scheduler.LinearLR(opt, 1.0, lr_end_factor, lr_decay_steps) if lr_decay_steps else None
            )
            self.refs.append(dict(params=p, grads=g, target=target.to(DEVICE, dtype, copy=True), opt=opt, sched=sched))
        self.clipped = []

    def step(self) -> None:
        scale = math.exp(torch.empty(()).uniform_(math.log(0.3), math.log(3.0), generator=self.gen).item())
        grads = (torch.randn(self.n, generator=self.gen) * scale).to(DEVICE)
        for t in (self.fused.partials, self.fused.grad_norm, self.fused._scalars):
            t.fill_(float("nan"))  # poison every scratch/output
        grads_before = grads.clone()
        norm = self.fused.step(self.params, grads, None if self.tau is None else self.target, tau=self.tau or 1.0)
        torch.testing.assert_close(grads, grads_before, rtol=0, atol=0)  # grad_buf is only read
        for ref in self.refs:
            ref["grads"].copy_(grads)
            ref_norm = adam_reference(
                ref["opt"],
                self.max_grad_norm,
                ref["params"],
                None if self.tau is None else ref["target"],
                tau=self.tau or 1.0,
            )
            torch.testing.assert_close(norm.double(), ref_norm.double(), **NORM_TOL)
            if ref["sched"] is not None:
                ref["sched"].step()
        self.clipped.append(ref_norm.item() > self.max_grad_norm)

    def check(self, steps: int) -> None:
        assert self.fused.step_count.dtype == torch.int64 and self.fused.step_count.item() == steps
        for ref in self.refs:
            views = [p for group in ref["opt"].param_groups for p in group["params"]]
            state = [ref["opt"].state[p] for p in views]
            assert all(s["step"].item() == steps for s in state)
            flat = {k: torch.cat([s[k].reshape(-1) for s in state]).float() for k in ("exp_avg", "exp_avg_sq")}
            torch.testing.assert_close(self.params, ref["params"].float(), **TOL)
            torch.testing.assert_close(self.target, ref["target"].float(), **TOL)
            torch.testing.assert_close(self.fused.exp_avg, flat["exp_avg"], rtol=0, atol=TOL["atol"])
            torch.testing.assert_close(self.fused.exp_avg_sq, flat["exp_avg_sq"], **TOL)


class _GridSpy:
    """Stands in for a Triton kernel object and records the grid of every launch."""

    def __init__(self, kernel, grids):
        self.kernel, self.grids = kernel, grids

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize(
    "n, steps, weight_decay, tau",
    [
        (1, 12, 0.0, None),
        (7, 12, 0.01, 1.0),
        (1000, 12, 0.0, 0.005),
        (1000, 12, 0.01, None),
        (4097, 100, 0.01, 0.005),
        (4097, 30, 0.0, 1.0),
        (250_001, 2, 0.01, 0.005),
    ],
)
def test_matches_clip_grad_norm_and_torch_adam(n, steps, weight_decay, tau, monkeypatch):
    grids = []
    for name in ("_grad_sumsq_kernel", "_clip_adam_kernel"):
        monkeypatch.setattr(fa_mod, name, _GridSpy(getattr(fa_mod, name), grids))
    run = _Run(n, weight_decay=weight_decay, tau=tau, seed=n)
    for i in range(steps):
        run.step()
        assert run.fused.step_count.item() == i + 1  # exactly one increment per call
    run.check(steps)
    if steps >= 12:
        assert any(run.clipped) and not all(run.clipped), "want steps with and without clipping"
    assert len(grids) == 2 * steps and all(len(g) == 1 and g[0] >= 2 for g in grids), "a single-block launch"
    if n > 200_000:
        assert min(g[0] for g in grids) >= 132  # every SM of an H100/H200 gets a block


@pytest.mark.smoke
def test_lr_tensor_is_read_every_step():
    lr = torch.tensor(LR, device=DEVICE)
    run = _Run(1000, seed=3, lr=lr)
    for new_lr in (LR, 3e-3, 3e-2):
        lr.fill_(new_lr)
        for ref in run.refs:
            ref["opt"].param_groups[0]["lr"] = new_lr
        run.step()
    run.check(3)


def test_linear_lr_decay_matches_torch_linear_lr():
    """lr decays to 0.1 of itself over 8 steps, then holds (torch's LinearLR stepped after every Adam step)."""
    run = _Run(1000, seed=11, lr_end_factor=0.1, lr_decay_steps=8)
    const = _Run(1000, seed=11)
    for _ in range(12):
        run.step()
        const.step()
    run.check(12)
    assert run.refs[0]["opt"].param_groups[0]["lr"] == pytest.approx(0.1 * LR)
    assert (run.params - const.params).abs().max() > 1e-3  # the decay moved the trajectory


def test_state_dict_round_trip_and_torch_float_step():
    n = 1000
    a, b = _Run(n, seed=5), _Run(n, seed=5)
    for _ in range(3):
        a.step()
    state = a.fused.state_dict()
    state["step"] = state["step"].float().cpu()  # torch.optim.Adam keeps a float step
    b.fused.load_state_dict(state)
    b.params.copy_(a.params)
    assert b.fused.step_count.item() == 3
    grads = torch.randn(n, device=DEVICE)
    na, nb = a.fused.step(a.params, grads).clone(), b.fused.step(b.params, grads).clone()
    assert torch.equal(na, nb) and torch.equal(a.params, b.params) and torch.equal(a.fused.exp_avg, b.fused.exp_avg)
    assert b.fused.step_count.item() == 4


def test_value_errors():
    n = 7
    opt = FusedAdam(n, DEVICE, lr=LR)
    p, g = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    bad = {
        "dtype": (p.double(), g),
        "shape": (p, torch.randn(n + 1, device=DEVICE)),
        "2-D": (p.view(1, n), g),
        "contiguous": (torch.randn(2 * n, device=DEVICE)[::2], g),
        "type": (p.tolist(), g),
    }
    for pp, gg in bad.values():
        with pytest.raises(ValueError, match="params_buf|grad_buf"):
            opt.step(pp, gg)
    with pytest.raises(ValueError, match="alias"):
        opt.step(p, g, target_buf=p)
    with pytest.raises(ValueError, match="target_buf"):
        opt.step(p, g, target_buf=torch.randn(n + 1, device=DEVICE))
    for tau in (0.0, -0.1, 1.5, torch.tensor(0.5), True):
        with pytest.raises(ValueError, match="tau"):
            opt.step(p, g, target_buf=torch.randn(n, device=DEVICE), tau=tau)
    for kwargs, match in [
        (dict(num_params=0), "num_params"),
        (dict(num_params=2**31), "num_params"),
        (dict(num_params=7.0), "num_params"),
        (dict(lr=-1.0), "lr"),
        (dict(lr=torch.ones(1, device=DEVICE)), "lr"),
        (dict(lr=torch.tensor(1, device=DEVICE)), "lr"),
        (dict(betas=(0.9, 1.0)), "betas"),
        (dict(betas=(-0.1, 0.9)), "betas"),
        (dict(eps=-1e-8), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(max_grad_norm=float("nan")), "max_grad_norm"),
        (dict(lr_end_factor=1.5), "lr_end_factor"),
        (dict(lr_end_factor=float("nan")), "lr_end_factor"),
        (dict(lr_decay_steps=-1), "lr_decay_steps"),
        (dict(lr_decay_steps=2.0), "lr_decay_steps"),
    ]:
        args = dict(num_params=n, device=DEVICE, lr=LR) | kwargs
        with pytest.raises(ValueError, match=match):
            FusedAdam(**args)
    with pytest.raises(ValueError, match="exp_avg_sq"):
        opt.load_state_dict({"step": torch.tensor(1), "exp_avg": torch.zeros(n)})
    with pytest.raises(ValueError, match="exp_avg"):
        opt.load_state_dict({"step": torch.tensor(1), "exp_avg": torch.zeros(n + 1), "exp_avg_sq": torch.zeros(n)})
    with pytest.raises(ValueError, match="step"):
        opt.load_state_dict({"step": torch.tensor([1]), "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)})
    with pytest.raises(ValueError, match="tile"):
        reference_params(p, g, [(2, 3)])


@pytest.mark.gpu
def test_seed_scale_100_steps_gpu():
    shapes = ADAM_SEED_SHAPES
    run = _Run(sum(math.prod(s) for s in shapes), weight_decay=0.01, tau=0.005, seed=11, shapes=shapes)
    for _ in range(100):
        run.step()
    run.check(100)
    assert any(run.clipped) and not all(run.clipped)


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager_gpu():
    replays = 20
    inp = adam_inputs("cuda")
    n = inp["params_buf"].numel()
    gen = torch.Generator(device="cuda").manual_seed(0)
    grads = [torch.randn(n, device="cuda", generator=gen) * (0.01 + 0.01 * i) for i in range(replays)]
    eager, graphed = (FusedAdam(n, "cuda", lr=1e-3, weight_decay=0.01, max_grad_norm=10.0) for _ in range(2))
    bufs = {name: [inp[k].clone() for k in ("params_buf", "target_buf")] for name in ("eager", "graphed")}
    static_grads = torch.empty_like(grads[0])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile both kernels before capture
        FusedAdam(n, "cuda", lr=1e-3, weight_decay=0.01).step(
            inp["params_buf"].clone(), grads[0], inp["target_buf"].clone(), tau=0.005
        )
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_norm = graphed.step(bufs["graphed"][0], static_grads, bufs["graphed"][1], tau=0.005)
    assert graphed.step_count.item() == 0  # capture records, does not run

    for g in grads:
        static_grads.copy_(g)
        graph.replay()
        norm_replay = graph_norm.clone()
        norm_eager = eager.step(bufs["eager"][0], g, bufs["eager"][1], tau=0.005).clone()
        assert torch.equal(norm_replay, norm_eager)
    torch.cuda.synchronize()
    assert eager.step_count.item() == graphed.step_count.item() == replays
    for a, b in zip(bufs["eager"], bufs["graphed"]):
        assert torch.equal(a, b)
    assert torch.equal(eager.exp_avg, graphed.exp_avg) and torch.equal(eager.exp_avg_sq, graphed.exp_avg_sq)


def test_target_every_updates_the_target_only_on_multiples_of_the_device_step():
    n = 3000
    gen = torch.Generator().manual_seed(3)
    params = torch.randn(n, generator=gen).to(DEVICE)
    target = torch.randn(n, generator=gen).to(DEVICE)
    opt = FusedAdam(n, DEVICE, lr=LR)
    for step in range(1, 8):
        before = target.clone()
        opt.step(params, torch.randn(n, generator=gen).to(DEVICE), target, tau=1.0, target_every=3)
        if step % 3 == 0:
            assert torch.equal(target, params), f"step {step}: hard update expected"
        else:
            assert torch.equal(target, before), f"step {step}: target must not change"
    with pytest.raises(ValueError, match="target_every"):
        opt.step(params, params.clone(), target, target_every=0)
