"""Learner-step variants for `hotloop bench`: the same DQN learner step built eager, captured, or compiled+captured.

One learner step (every variant, same math) = sample a stratified prioritized batch from a filled
`PrioritizedReplay` (plain-torch sum tree, `use_kernels=False`) + the `DQNLearner.update` math (Double DQN target,
dueling branching Q-network with torch's spectral_norm parametrization, importance-weighted TD loss, Adam,
grad-norm clip) + the priority update. The builders return a `Variant` whose `step()` runs one such step:

- `build_eager`: CleanRL style (cleanrl/dqn.py): eager torch, and `.item()` on the loss every step (the host
  sync is part of this variant, on purpose: it is what a plain training loop does for logging).
- `build_graph`: the step without `.item()`, warmed up on a side stream, then captured whole in ONE
  `torch.cuda.CUDAGraph`; `step()` replays it. Capture rules followed (PyTorch "CUDA Graphs" notes, whole-network
  capture; tensordict `tensordict/nn/cudagraphs.py` docstring): all state in static tensors (replay storage,
  tree, parameters, optimizer state), `torch.optim.Adam(capturable=True)`, random draws from the default CUDA
  generator (graph-safe: each replay advances its Philox offset), no host reads, grads set to None before capture
  so backward allocates them in the graph's pool.
- `build_compiled`: LeanRL style (leanrl/dqn_torchcompile.py): the update's forward+loss and its
  clip+Adam step through `torch.compile(mode="max-autotune-no-cudagraphs", dynamic=False)`, warmed up (the compile
  time is `setup_s`), then the whole step captured in one CUDA graph as in `build_graph`.

- `build_iteration`: not a learner step but the whole training-loop iteration, `Trainer.iterate(1)` of
  hotloop.trainer.loop (env step(s), replay insert, learner step, the periodic readback publication or target
  update), the real loop built from the same Config on the bench's device.

`DQNLearner.update` itself is not capture-friendly: its Python-side `steps` counter decides the target-network
update, so a capture would bake the update into every replay or into none. `learner_update` below is the same math
without it; the target update (one copy per `target_update_interval` steps) is left out of every timed step.
The replay's importance-sampling exponent is fixed at `cfg.per_beta_start` (no annealing inside a bench).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from hotloop.kernels.losses import branch_diversity_term, chosen_q, cql_term, double_dqn_target, td_loss
from hotloop.trainer.config import Config
from hotloop.trainer.learner import DQNLearner, UpdateMetrics
from hotloop.trainer.network import BranchingDuelingQNet
from hotloop.trainer.replay import PrioritizedBatch, PrioritizedReplay
from hotloop.trainer.step import HotLearner

SETUP_KINDS = ("none", "capture", "compile+capture", "trainer", "trainer+captures")
GRAPH_PRECISIONS = ("fp32", "tf32")
COMPILED_PRECISIONS = ("tf32", "split")
FILL_BATCHES = 4
"""The bench replay holds min(capacity, FILL_BATCHES * batch_size) random transitions."""
GRAPH_WARMUP = 3
"""Steps run on a side stream before a capture (Adam's state, cuBLAS handles, the compiled graphs' recompiles)."""
COMPILE_MODE = "max-autotune-no-cudagraphs"
ITERATION_WARMUP = 3
"""Loop iterations `build_iteration` runs after the prefill (the first captures the actor's and the learner's CUDA
graphs on CUDA), inside setup_s."""


class Variant(NamedTuple):
    """One learner-step variant, ready to time.

    Fields:
        name: the row name in the bench table (e.g. "graph-tf32").
        step: zero-argument callable running ONE learner step on the variant's device (launches only, except the
            eager variant's `.item()` host sync); its return value is ignored.
        setup_s: wall seconds of the one-time setup before the first timed step: warm-up + capture, plus the
            compile for compiled variants (0.0 for eager). Measured with host time around synchronized work.
        setup_kind: "none", "capture" or "compile+capture" (SETUP_KINDS).
        precision: FP32 matmul mode of the step: "fp32", "tf32", or "split" (TF32 forward, FP32 backward).
        note: what the variant does and leaves out, for the table's note column.
        step_multiple: see the field (default 1).
    """

    name: str
    step: Callable[[], None]
    setup_s: float
    setup_kind: str
    precision: str
    note: str
    step_multiple: int = 1
    """The bench times a multiple of this many steps (its --steps rounded up): 1 for a learner step; for the
    iteration, the longest period of its periodic phases, so the timed window holds whole periods."""


# --------------------------------------------------------------------------------------------------------------
# TF32 switch
# --------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def tf32_matmuls(enabled: bool | None) -> Iterator[None]:
    """Within the block, FP32 matmuls (cuBLAS) and cuDNN convolutions may use TF32 tensor cores iff `enabled`;
    the previous settings are restored on exit (also on an exception). `None` changes nothing.

    Uses the legacy flags `torch.backends.cuda.matmul.allow_tf32` / `torch.backends.cudnn.allow_tf32`: their setter
    updates both the legacy and the new (`fp32_precision`) state, so every reader agrees (reading the legacy flag
    after only the new API set "tf32" raises in torch >= 2.9; Dynamo's global-state guard reads it). Inductor reads
    `torch.backends.cuda.matmul.fp32_precision` when it generates Triton GEMMs, cuBLAS reads the flag when a GEMM is
    launched (so a captured GEMM keeps the mode it was captured with). Host-only; no device work.
    """
    if enabled is None:
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    try:
        restore = ("legacy", matmul.allow_tf32, cudnn.allow_tf32)
    except RuntimeError:  # this process set the new API inconsistently with the legacy one: restore the new one
        restore = ("new", matmul.fp32_precision, cudnn.fp32_precision)
    matmul.allow_tf32 = cudnn.allow_tf32 = bool(enabled)
    try:
        yield
    finally:
        if restore[0] == "legacy":
            matmul.allow_tf32, cudnn.allow_tf32 = restore[1], restore[2]
        else:
            matmul.fp32_precision, cudnn.fp32_precision = restore[1], restore[2]


# --------------------------------------------------------------------------------------------------------------
# The learner step (same math as DQNLearner.update + PrioritizedReplay.sample / update_priorities)
# --------------------------------------------------------------------------------------------------------------


def forward_loss(
    online: BranchingDuelingQNet,
    target: BranchingDuelingQNet,
    cfg: Config,
    obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    next_obs: torch.Tensor,
    terminated: torch.Tensor,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The forward half of `DQNLearner.update`, same ops in the same order (so the spectral norms' power
    iterations advance identically): Double-DQN target on s' (online + target network, no grad), online forward on
    s, importance-weighted TD loss, optional CQL / branch-diversity terms.

    Shapes: obs/next_obs (B, obs_dim) float32, action (B, D) int64, reward/terminated/weights (B,) float32; all on
    the networks' device. Returns (total, loss, q_mean, cql, diversity, td_abs): `total` 0-dim with grad (what to
    backpropagate), the others detached: 0-dim float32 except td_abs (B,) float32 = mean_d |td|, the new
    priorities' input. Source: trainer/learner.py (DQNLearner.update), kernels/losses.py.
    """
    with torch.no_grad():
        next_online = online(next_obs)
        next_target = target(next_obs)
        y = double_dqn_target(reward, terminated, cfg.gamma, next_online, next_target, cfg.td_target_max)
    q, feats = online.forward_with_features(obs)
    q_taken = chosen_q(q, action)
    td = y.unsqueeze(1) - q_taken
    loss = td_loss(td, weights, cfg.loss, cfg.huber_delta)
    cql = cql_term(q, action) if cfg.cql_weight > 0 else loss.new_zeros(())
    div = branch_diversity_term(feats) if cfg.diversity_weight > 0 else loss.new_zeros(())
    # Terms with weight 0 are not added (DQNLearner adds 0 * 0, the same value): with them, Inductor (torch 2.13)
    # returned `total` without a grad_fn, as for `l = f(x); t = l + 0.0 * l.new_zeros(()); return t, l.detach()`.
    total = loss
    if cfg.cql_weight > 0:
        total = total + cfg.cql_weight * cql
    if cfg.diversity_weight > 0:
        total = total + cfg.diversity_weight * div
    return (total, loss.detach(), q_taken.detach().mean(), cql.detach(), div.detach(), td.detach().abs().mean(dim=1))


def optimizer_step(online: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> torch.Tensor:
    """Global grad-norm clip (`clip_grad_norm_`, no host sync) then `optimizer.step()`, as `DQNLearner.update`.
    Returns the pre-clip total grad norm, a detached 0-dim float32 tensor on the parameters' device."""
    grad_norm = torch.nn.utils.clip_grad_norm_(online.parameters(), max_grad_norm)
    optimizer.step()
    return grad_norm.detach()


def env_shapes(cfg: Config) -> tuple[int, tuple[int, ...]]:
    """(obs_dim, action_nvec) of the configured env: the config's own for `synthetic`, else read from one CPU copy
    of the env (as `hotloop.guards.commands.checks.check_env` builds it). Raises ValueError for an unusable env
    name."""
    if cfg.env == "synthetic":
        return cfg.obs_dim, tuple(cfg.action_nvec)
    from hotloop.trainer.envs import make_env

    env = make_env(cfg.env, 1, "cpu", cfg.seed)
    shapes = int(env.obs_dim), tuple(int(n) for n in env.action_nvec)
    getattr(env, "close", lambda: None)()
    return shapes


def fill_random(replay: PrioritizedReplay, cfg: Config, action_nvec: tuple[int, ...]) -> None:
    """Add min(capacity, FILL_BATCHES * batch_size) random transitions to `replay` (on its device, from the global
    generator): obs/next_obs standard normal, uniform actions per branch of `action_nvec`, normal rewards, 5%
    terminal; then set their priorities from |N(0, 1)| TD errors, so the sum tree is not uniform."""
    n, dev = min(cfg.replay_capacity, FILL_BATCHES * cfg.batch_size), replay.device
    action = (torch.rand(n, len(action_nvec), device=dev) * torch.tensor(action_nvec, device=dev)).long()
    replay.add(
        torch.randn(n, replay.obs_dim, device=dev),
        action,
        torch.randn(n, device=dev),
        torch.randn(n, replay.obs_dim, device=dev),
        torch.rand(n, device=dev) < 0.05,
    )
    replay.update_priorities(torch.arange(n, device=dev), torch.randn(n, device=dev))


class BenchState:
    """Everything one bench learner step touches, built from a Config on one device.

    Args:
        cfg: the Config (network sizes, batch size, replay capacity/alpha/eps, gamma, lr, clip, loss, seed).
        device: where everything lives (torch.device; CPU or CUDA).
        capturable: build Adam with `capturable=True` (its step counters on the device: needed for CUDA-graph
            capture); otherwise `DQNLearner`'s own Adam (as the reference trainer).

    Attributes:
        learner: a `DQNLearner` (online + target network, Adam); only its modules and optimizer are used.
        replay: `PrioritizedReplay(cfg.replay_capacity, ..., use_kernels=False)` filled by `fill_random`.
        obs_dim, action_nvec: the env's shapes. batch_size: cfg.batch_size. beta: cfg.per_beta_start (fixed).
    Seeds torch's global generators with cfg.seed; sampling draws from the global (default) generator of `device`.
    Raises ValueError from the Config/replay/env checks.
    """

    def __init__(self, cfg: Config, device: torch.device, capturable: bool = False) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.obs_dim, self.action_nvec = env_shapes(cfg)
        torch.manual_seed(cfg.seed)
        self.learner = DQNLearner(cfg, self.obs_dim, self.action_nvec, self.device)
        if capturable:
            self.learner.optimizer = torch.optim.Adam(
                self.learner.online.parameters(),
                lr=cfg.lr,
                eps=cfg.adam_eps,
                weight_decay=cfg.weight_decay,
                capturable=True,
            )
        self.batch_size, self.beta = cfg.batch_size, float(cfg.per_beta_start)
        self.replay = PrioritizedReplay(
            cfg.replay_capacity,
            self.obs_dim,
            len(self.action_nvec),
            alpha=cfg.per_alpha,
            eps=cfg.per_eps,
            device=self.device,
            use_kernels=False,
        )
        fill_random(self.replay, cfg, self.action_nvec)

    @property
    def online(self) -> BranchingDuelingQNet:
        """The online Q-network (trained)."""
        return self.learner.online

    @property
    def target(self) -> BranchingDuelingQNet:
        """The target Q-network (never updated by a bench step)."""
        return self.learner.target

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The online network's Adam."""
        return self.learner.optimizer

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        weights: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """`forward_loss` on this state's networks and config (same arguments and results)."""
        return forward_loss(self.online, self.target, self.cfg, obs, action, reward, next_obs, terminated, weights)

    def optimize(self) -> torch.Tensor:
        """`optimizer_step` on this state's network and optimizer; returns the 0-dim grad norm."""
        return optimizer_step(self.online, self.optimizer, self.cfg.max_grad_norm)

    def update(
        self,
        batch: PrioritizedBatch,
        forward: Callable[..., tuple[torch.Tensor, ...]] | None = None,
        optimize: Callable[[], torch.Tensor] | None = None,
        tf32_forward: bool | None = None,
        tf32_backward: bool | None = None,
    ) -> UpdateMetrics:
        """The `DQNLearner.update` math on a sampled batch, without the target-network update: `forward` (default
        `self.forward`) -> zero grads (set to None) + backward -> `optimize` (default `self.optimize`).
        `tf32_forward` / `tf32_backward`: the `tf32_matmuls` setting around the forward resp. the backward +
        optimizer (None: leave the process setting). No host reads; returns detached device `UpdateMetrics`."""
        b = batch
        with tf32_matmuls(tf32_forward):
            total, loss, q_mean, cql, div, td_abs = (forward or self.forward)(
                b.obs, b.action, b.reward, b.next_obs, b.terminated, b.weights
            )
        with tf32_matmuls(tf32_backward):
            self.optimizer.zero_grad(set_to_none=True)
            total.backward()
            grad_norm = (optimize or self.optimize)()
        return UpdateMetrics(loss, q_mean, grad_norm, cql, div, td_abs)

    def step(
        self,
        forward: Callable[..., tuple[torch.Tensor, ...]] | None = None,
        optimize: Callable[[], torch.Tensor] | None = None,
        tf32_forward: bool | None = None,
        tf32_backward: bool | None = None,
    ) -> UpdateMetrics:
        """One learner step: sample B = batch_size with the fixed beta (`PrioritizedReplay.sample`) -> `update`
        (same arguments) -> priorities of the sampled slots from td_abs (`update_priorities`). No host reads;
        returns the step's detached `UpdateMetrics` (device tensors)."""
        b = self.replay.sample(self.batch_size, self.beta)
        metrics = self.update(b, forward, optimize, tf32_forward, tf32_backward)
        self.replay.update_priorities(b.indices, metrics.td_abs)
        return metrics

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor a step mutates or reads as state (online/target parameters and buffers, Adam's state, the
        replay's tree, max priority and bad-priority count); for snapshot/restore in tests. Live tensors."""
        nets = [*self.online.parameters(), *self.online.buffers(), *self.target.parameters(), *self.target.buffers()]
        opt = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        tree = self.replay.tree
        return nets + opt + [tree.nodes, tree.max_value, tree.bad_priority_count]


# --------------------------------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------------------------------


class EagerStep:
    """The eager variant's step: `state.step()` then `loss.item()` (a host sync, CleanRL-style logging), with
    TF32 off (`tf32_matmuls(False)`) so the row is FP32 whatever the process setting. `last_loss` keeps the float."""

    def __init__(self, state: BenchState) -> None:
        self.state = state
        self.last_loss = float("nan")

    def __call__(self) -> None:
        with tf32_matmuls(False):
            metrics = self.state.step()
        self.last_loss = metrics.loss.item()


class GraphStep:
    """A captured step: `graph.replay()` on the current stream. Attributes: state (the `BenchState` whose static
    tensors the graph reads and writes), graph (`torch.cuda.CUDAGraph`), metrics (the `UpdateMetrics` tensors
    captured as outputs: each replay overwrites them), functions (the callables that were captured, kept alive)."""

    def __init__(
        self, state: BenchState, graph: torch.cuda.CUDAGraph, metrics: UpdateMetrics, functions: tuple = ()
    ) -> None:
        self.state, self.graph, self.metrics, self.functions = state, graph, metrics, functions

    def __call__(self) -> None:
        self.graph.replay()


def _needs_cuda(name: str, device: torch.device) -> None:
    """RuntimeError("<name> needs CUDA ...") unless `device` is a CUDA device and CUDA is available."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"{name} needs CUDA (CUDA graph capture); device is {device}, "
            f"torch.cuda.is_available() is {torch.cuda.is_available()}"
        )


def capture_step(
    step_fn: Callable[[], UpdateMetrics], device: torch.device, warmup: int = GRAPH_WARMUP
) -> tuple[torch.cuda.CUDAGraph, UpdateMetrics]:
    """Warm `step_fn` up `warmup` times on a side stream, then capture one call of it in a new CUDA graph.

    `step_fn`: a zero-argument learner step using only static tensors (see the module docstring's capture rules);
    `device`: its CUDA device. Returns (graph, the captured call's outputs). Each warm-up call is a real step (it
    changes the state). Exceptions of the capture propagate (e.g. "operation not permitted when stream is
    capturing" for a host sync). Source: PyTorch CUDA Graphs notes (whole-network capture).
    """
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step_fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            metrics = step_fn()
        torch.cuda.synchronize()
    return graph, metrics


def build_eager(cfg: Config, device: torch.device) -> Variant:
    """The eager CleanRL-style variant ("eager"): `BenchState(cfg, device)` stepped eagerly in FP32 with `.item()`
    on the loss every step. Works on CPU and CUDA. Raises ValueError from the Config/env/replay checks."""
    state = BenchState(cfg, torch.device(device))
    return Variant(
        "eager",
        EagerStep(state),
        0.0,
        "none",
        "fp32",
        "eager torch, loss.item() every step (host sync on purpose); target update not timed",
    )


def build_graph(cfg: Config, device: torch.device, precision: str = "fp32") -> Variant:
    """The whole step captured in one CUDA graph ("graph-fp32" / "graph-tf32").

    `precision`: "fp32" (TF32 off) or "tf32" (TF32 on) for the warm-up and the capture (the cuBLAS math mode is
    baked into the captured GEMMs; the process setting is restored afterwards). Adam is capturable; sampling uses
    the default CUDA generator. setup_s = warm-up + capture wall time.
    Raises ValueError for another precision, RuntimeError("... needs CUDA ...") off CUDA.
    """
    if precision not in GRAPH_PRECISIONS:
        raise ValueError(f"precision must be one of {GRAPH_PRECISIONS}, got {precision!r}")
    name = f"graph-{precision}"
    _needs_cuda(name, device)
    state = BenchState(cfg, torch.device(device), capturable=True)
    start = time.perf_counter()
    with tf32_matmuls(precision == "tf32"):
        graph, metrics = capture_step(state.step, state.device)
    setup = time.perf_counter() - start
    return Variant(
        name,
        GraphStep(state, graph, metrics),
        setup,
        "capture",
        precision,
        f"one CUDA graph per step, {precision.upper()} matmuls, capturable Adam; no .item(); target update not timed",
    )


def build_compiled(cfg: Config, device: torch.device, precision: str = "split") -> Variant:
    """LeanRL-style compiled variant ("compiled-split" / "compiled-tf32"), then captured in one CUDA graph.

    The forward + loss (`forward_loss`) and the clip + Adam step (`optimizer_step`) are each wrapped in
    `torch.compile(mode="max-autotune-no-cudagraphs", dynamic=False)`; sampling, backward launch and the priority
    update stay plain torch inside the captured step. Compilation happens during the warm-up (`GRAPH_WARMUP` steps
    on a side stream, caches off: `torch.compiler.config.force_disable_caches`, so the compile is cold and an earlier
    variant's kernels are not reused across precisions); `torch._dynamo.reset()` first.

    `precision`:
      - "tf32": TF32 on for everything (compile and capture).
      - "split": TF32 on while the compiled forward compiles and runs, off while the backward and the optimizer
        compile and run. AOTAutograd compiles the backward lazily, at the first backward (static shapes), i.e. under
        the FP32 setting, so Inductor's Triton GEMM templates of the backward are generated without TF32; cuBLAS
        GEMMs read the flag when launched, i.e. at capture time, under the same per-phase setting. So the split is
        real as far as torch's flags govern it; whether every backward GEMM really ran in FP32 is shown by the kernel
        names in the bench note (gemms per step by precision; Triton templates count as "gemm", their names do not
        say) and must be confirmed on the GPU.
    setup_s = compile + warm-up + capture wall time.
    Raises ValueError for another precision, RuntimeError("... needs CUDA ...") off CUDA.
    """
    if precision not in COMPILED_PRECISIONS:
        raise ValueError(f"precision must be one of {COMPILED_PRECISIONS}, got {precision!r}")
    name = f"compiled-{precision}"
    _needs_cuda(name, device)
    state = BenchState(cfg, torch.device(device), capturable=True)
    forward, optimize = compile_update(state)
    tf32_fwd, tf32_bwd = True, precision == "tf32"

    def step() -> UpdateMetrics:
        return state.step(forward, optimize, tf32_forward=tf32_fwd, tf32_backward=tf32_bwd)

    start = time.perf_counter()
    with torch.compiler.config.patch(force_disable_caches=True):
        graph, metrics = capture_step(step, state.device)
    setup = time.perf_counter() - start
    split = (
        "split by flag per phase: TF32 on while the compiled forward compiles/runs, off while backward+Adam "
        "compile/run (AOTAutograd compiles the backward lazily, so under the off flag); real for cuBLAS GEMMs "
        "(mode read at capture) and, if the backward did compile lazily, for Inductor Triton GEMMs; best-effort "
        "until gemms/step confirms it"
        if precision == "split"
        else "TF32 everywhere"
    )
    return Variant(
        name,
        GraphStep(state, graph, metrics, (forward, optimize)),
        setup,
        "compile+capture",
        precision,
        f"torch.compile({COMPILE_MODE}) of forward+loss and clip+Adam (sampling, priority update plain "
        f"torch), then one CUDA graph; {split}; cold compile (caches off) in setup_s; target update not "
        f"timed",
    )


def compile_update(state: BenchState) -> tuple[Callable[..., tuple[torch.Tensor, ...]], Callable[[], torch.Tensor]]:
    """(compiled forward, compiled optimizer step) for `state`: `torch.compile(mode=COMPILE_MODE, dynamic=False)`
    of `state.forward` (forward_loss: same arguments/results) and `state.optimize` (optimizer_step). Resets Dynamo
    first. Nothing is compiled until the first call; works on any device Inductor supports."""
    torch._dynamo.reset()
    online, target, optimizer, cfg = state.online, state.target, state.optimizer, state.cfg

    def forward(obs, action, reward, next_obs, terminated, weights):
        return forward_loss(online, target, cfg, obs, action, reward, next_obs, terminated, weights)

    def optimize():
        return optimizer_step(online, optimizer, cfg.max_grad_norm)

    return (
        torch.compile(forward, mode=COMPILE_MODE, dynamic=False),
        torch.compile(optimize, mode=COMPILE_MODE, dynamic=False),
    )


def build_hotloop_variant(cfg: Config, device: torch.device, switches: tuple[str, ...] = ()) -> Variant:
    """The `hotloop` row of `hotloop bench`: a HotLearner (hotloop.trainer.step) over a kernel-backed
    PrioritizedReplay filled by `fill_random` (as the other rows' replay), captured (setup_s = warm-up + capture
    seconds); `step` replays the graph. `switches`: bool Config fields set True first (a lever variant of
    hotloop.guards.probes.bench, named "hotloop:<switch>+..."; the note names them).
    Returns a Variant. Raises RuntimeError without CUDA, ValueError for an unsupported cfg."""
    device = torch.device(device)
    name = "hotloop" + (":" + "+".join(switches) if switches else "")
    if device.type != "cuda":
        raise RuntimeError(f"{name}: needs CUDA (the step is a captured CUDA graph)")
    if any(not isinstance(getattr(cfg, s, None), bool) for s in switches):
        raise ValueError(f"{name}: switches must be bool Config fields, got {switches}")
    cfg = dataclasses.replace(cfg, **{s: True for s in switches})
    obs_dim, nvec = env_shapes(cfg)
    replay = PrioritizedReplay(
        cfg.replay_capacity, obs_dim, len(nvec), alpha=cfg.per_alpha, eps=cfg.per_eps, device=device, use_kernels=True
    )
    torch.manual_seed(cfg.seed)  # as BenchState: the other rows' replay holds the same kind of random data
    fill_random(replay, cfg, nvec)
    learner = HotLearner(cfg, obs_dim, nvec, device, replay)
    capture_s = learner.capture()
    return Variant(
        name,
        learner.step,
        capture_s,
        "capture",
        "split",
        (f"switches on: {', '.join(switches)}; " if switches else "")
        + f"compile+warm-up {learner.warmup_s:.1f} s before the capture; flat buffers, fused Triton kernels, "
        + ("the three forwards as one launch per layer" if cfg.grouped_forward else "DDQN forward on a 2nd stream")
        + ", one CUDA graph; TF32 forward, 3xTF32 (FP32-accurate) backward; target update fused into Adam",
    )


class IterationStep:
    """The iteration variant's step: `trainer.iterate(1)`, one whole loop iteration (its (3,) device sums are
    dropped: no host read). Attribute: trainer (the `hotloop.trainer.loop.Trainer`)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def __call__(self) -> None:
        self.trainer.iterate(1)


def iteration_periods(cfg: Config, kind: str) -> dict[str, int]:
    """{phase: period} of the periodic phases a row of `Trainer.iterate(1)` calls can hold: those of
    `hotloop.trainer.loop.loop_periods(cfg, kind)` except "progress" (iterate counts it from the start of each call,
    so one-iteration calls open it only when its period is 1; its callback is a no-op here). The counters of the
    others (learner_steps for readback_publish, DQNLearner.steps for target_update) run across calls.
    `kind`: "hotloop" or "reference" (ValueError otherwise, from loop_periods)."""
    from hotloop.trainer.loop import loop_periods

    return {k: v for k, v in loop_periods(cfg, kind).items() if k != "progress"}


def build_iteration(cfg: Config, device: torch.device) -> Variant:
    """The "iteration" row of `hotloop bench`: the whole training-loop iteration, `Trainer.iterate(1)`.

    Builds `hotloop.trainer.loop.Trainer(cfg with device=str(device))` (everything else as `cfg`; the Trainer
    resolves learner "auto" to hotloop on CUDA and to the reference learner elsewhere), runs its prefill
    (`Trainer.prefill`: learning_starts transitions) and ITERATION_WARMUP iterations, which on CUDA with the hotloop
    learner capture the actor's env-step graph and the learner's step graph (one graph holding both when the
    Trainer runs the actor inside the learner step); setup_s = the wall seconds of all
    that (build + prefill + captures, synchronized on CUDA). `step()` runs one iteration: env_steps_per_update
    vectorized env steps of num_envs each + one learner step + the periodic phases that fall on it (hotloop: the
    readback publication every log_interval learner steps; reference: the target update every
    target_update_interval steps).
    step_multiple = the longest period of `iteration_periods(cfg, kind)`, so the bench times whole periods.
    setup_kind "trainer+captures" when a CUDA graph was captured, else "trainer"; precision "split" for the hotloop
    learner (TF32 forward, 3xTF32 backward), else "tf32" or "fp32" after the process's TF32 matmul flag on CUDA
    ("fp32" on CPU). Raises what the Trainer raises (ValueError for an unusable device or env, errors of the
    prefill, the captures or the steps).
    """
    from hotloop.trainer.loop import Trainer

    device = torch.device(device)
    run_cfg = dataclasses.replace(cfg, device=str(device))
    start = time.perf_counter()
    trainer = Trainer(run_cfg)
    trainer.prefill()
    for _ in range(ITERATION_WARMUP):
        trainer.iterate(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    setup = time.perf_counter() - start
    kind = trainer.learner_kind
    captured = any(getattr(part, "graph", None) is not None for part in (trainer.learner, trainer.actor))
    if kind == "hotloop":
        precision = "split"
    else:
        precision = "tf32" if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"
    periods = iteration_periods(run_cfg, kind)
    periodic = ", ".join(f"{k} every {v}" for k, v in periods.items() if v > 1) or "none"
    if trainer.actor is None:
        actor = "eager env steps"
    elif getattr(trainer, "actor_in_step", False):
        actor = "the actor's kernels in the learner's graph"
    else:
        actor = (
            "the actor's captured graph"
            if getattr(trainer.actor, "graph", None) is not None
            else "the actor's eager step"
        )
    note = (
        f"Trainer.iterate(1): {cfg.env_steps_per_update} x {cfg.num_envs} env steps ({actor}) + {kind} learner "
        f"step; periodic: {periodic}; the learner-step rows leave out the env and the periodic work"
    )
    return Variant(
        "iteration",
        IterationStep(trainer),
        setup,
        "trainer+captures" if captured else "trainer",
        precision,
        note,
        max(periods.values()),
    )
