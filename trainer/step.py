"""hotloop's learner step: flat buffers, fused Triton kernels, two streams, replayed as one CUDA graph.

One step, all on the device, no host read (the seed's hot loop; capture rules as tensordict's cudagraphs docstring:
static buffers, warm-up on a side stream, then `torch.cuda.graph`):
  prepare     on a second stream, beside the sampling: both nets' parameters rounded to TF32 (one launch,
              `tf32_round_copy`: the weights the forwards read, kernels/linear.py says why; the online forward waits
              for it alone), the gain-scaled W^T of every layer but the first, in one
              launch (the input-gradient GEMMs read it K-major: kernels/linear.py), and the step's one memset (the
              gradient buffer: the weight-gradient kernels accumulate with atomics); W^T reads only the parameters,
              the memset must follow the previous step's Adam (which read the gradients): the fork at the start of
              the step (the side stream waits for the main one) orders both
  sample      tree_sample (stratified proportional sampling + importance weights, 2 launches; it draws its
              Philox uniforms and computes the annealed beta itself, keyed by the optimizer's device step count:
              hotloop.kernels.replay_batch.CounterUniforms, AnnealedBeta); then, after the online forward (the shorter
              chain), gather_transitions (actions, rewards, terminal flags, and the observations transposed for
              the first layer's weight gradient; the forwards read the observations in place, by index)
  ddqn_forward  on the second stream, concurrent with the online forward: online and target net on s' in ONE
              launch per layer (TF32)
  forward     online net on s (TF32), activations kept for the backward (and their transposes, for the
              weight-gradient GEMMs). With cfg.grouped_forward the two phases are one: the three forwards (online
              net on s, online and target net on s') in ONE launch per layer and one for the heads (grid z = 3,
              trainer/flat_net.py flat_forward_grouped), on the main stream, phase "forward", no ddqn_forward
  loss        fused Double-DQN TD loss: target, TD errors, loss, dLoss/dQ, new priorities, metrics
  backward    the heads' backward (IEEE FP32 FMAs: its products have 1 or A terms) and each layer's input- and
              weight-gradient kernels (split-precision FP32; the input-gradient kernels also sum the bias
              gradients of the layer below, and the second layer's also adds the first layer's weight gradient
              from its tiles in registers: kernels/linear.py)
  optimizer   grad-norm + clip + Adam over the flat buffers, with the target update fused in (hard or Polyak, on
              the device-side steps that are multiples of target_update_interval)
  spectral_norm  all weight matrices projected to sigma = 1 in one launch
  priority_update  sum-tree update with the new priorities, on the second stream, concurrent with the optimizer
              and spectral norm (joined at the end of the step)
Kernels per step: (1 + 1 + 1) + 2 + 1 + 4 + 4 + 1 + 5 (2 trunk layers) + 2 + 1 + 1 = 24 at seed scale (20 with
cfg.grouped_forward: 4 forward launches instead of 4 + 4).
The target net therefore holds the parameters after Adam and before that step's spectral-norm projection (they
differ by one step's change of sigma, O(lr)).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext

import torch

from hotloop.kernels.dependent_launch import dependent_launch
from hotloop.kernels.fused_adam import FusedAdam
from hotloop.kernels.heads import heads_backward
from hotloop.kernels.linear import (
    MAX_FUSED_K0,
    WeightTranspose,
    linear_backward_input,
    linear_backward_weight,
    linear_forward,
    linear_forward_grouped,
)
from hotloop.kernels.replay_batch import AnnealedBeta, CounterUniforms, gather_transitions
from hotloop.kernels.segment_tree import tree_sample, tree_update
from hotloop.kernels.spectral_norm import SpectralNormTable, spectral_norm_
from hotloop.kernels.td_loss import METRIC_NAMES, TDLossOutputs, TDLossWorkspace, td_loss_forward
from hotloop.kernels.tf32_split import tf32_round_copy
from hotloop.profiles.ranges import phase_range
from hotloop.trainer.config import Config
from hotloop.trainer.flat_net import FlatForward, FlatLayout, flat_forward, flat_forward_grouped
from hotloop.trainer.learner import epsilon_greedy
from hotloop.trainer.replay import PrioritizedReplay

METRICS = (*METRIC_NAMES, "grad_norm")
"""Names of the device metric slots `HotLearner.metric_sources` returns, in order."""
WARMUP_STEPS = 2
"""Eager learner steps `capture` runs first on a side stream (they compile the kernels; they are real steps)."""
SN_WARMUP_ITERATIONS = 15
"""Power iterations of the initial spectral-norm projection (torch's parametrization also warms up with 15)."""


def check_supported(cfg: Config, action_nvec: tuple[int, ...]) -> None:
    """Raise ValueError if the hotloop learner cannot run `cfg` (it needs equal branch sizes, no diversity
    term: the fused loss has no branch-feature term, and no weight decay without spectral norm: the fused Adam
    decays every slot of the flat buffer, the fixed gains too)."""
    if len(set(action_nvec)) != 1:
        raise ValueError(f"learner 'hotloop' needs action branches of equal size, got {action_nvec}")
    if cfg.diversity_weight != 0:
        raise ValueError(
            "learner 'hotloop' has no branch-diversity term: set diversity_weight=0 or learner='reference'"
        )
    if cfg.weight_decay != 0 and not cfg.spectral_norm:
        raise ValueError(
            f"learner 'hotloop' with spectral_norm=False keeps every gain at 1, and weight_decay="
            f"{cfg.weight_decay} would decay them: set weight_decay=0, spectral_norm=True or "
            "learner='reference'"
        )


def check_device_supports(cfg: Config, device: torch.device | str) -> None:
    """Raise ValueError when `device` cannot run `cfg`'s hotloop step: cfg.dependent_launch (programmatic dependent
    launch, kernels/dependent_launch.py) on a CUDA device older than sm_90. Reads the device's compute capability
    only (no work, no sync); the CPU passes (its interpreter ignores the switch)."""
    device = torch.device(device)
    if cfg.dependent_launch and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            raise ValueError(
                f"config.dependent_launch needs a Hopper-class GPU (sm_90+), {device} is sm_{major}{minor}: "
                "set dependent_launch=false"
            )


class HotLearner:
    """The optimized Double-DQN learner over a prioritized replay; `step()` replays the captured step.

    Args:
        cfg: the run's Config (sizes, gamma, lr, loss, clip, tau, target_update_interval, PER alpha/beta/eps, CQL).
        obs_dim, action_nvec: the env's shapes (branches of equal size).
        device: a CUDA device, or the CPU under TRITON_INTERPRET=1 (tests; no graph, no second stream).
        replay: the PrioritizedReplay the env loop fills (its storage and sum tree are read and written in place).
        grad_sync: None (one process), or a function that averages the flat gradient buffer `grads` over the ranks
            in place with one collective (hotloop.trainer.distributed.GradientAverager): the step calls it after the
            backward and the priority update's fork (the sum-tree update on the side stream overlaps it) and before
            grad-norm, clip and Adam; captured into the step's graph on CUDA (every rank captures the same
            collective in the same stream order). The Double-DQN (target-net) forward cannot overlap it: the loss,
            hence the gradient, needs it.
    Attributes: layout (FlatLayout), nets (2, P) float32 (row 0 = params_buf, row 1 = target_buf), params, target,
        grads (P,) float32 (grad_buf), nets_tf32 (2, P) float32 (nets rounded to TF32 at each step's start: the
        forwards' weights), learns_gains (bool: the backward writes gain gradients), adam (FusedAdam),
        sn_table / sn_u / sn_v, steps (host count of steps run),
        graph (CUDAGraph or None), use_graph (True on CUDA: the trainer captures before the first step),
        warmup_s (kernel compilation + warm-up steps) and capture_s (seconds); linear_forward,
        linear_forward_grouped, linear_backward_input, spectral_norm, round_weights: the launch functions the step
        calls (guards/faults.py
        swaps them; the precision probe reads them; the grouped forward of cfg.grouped_forward calls none of
        linear_forward: it launches hotloop.kernels.linear.linear_forward_grouped).
    Raises ValueError for an unsupported config (`check_supported`), a replay on another device, or
    cfg.dependent_launch on a GPU older than sm_90.
    """

    def __init__(
        self,
        cfg: Config,
        obs_dim: int,
        action_nvec: tuple[int, ...],
        device: torch.device,
        replay: PrioritizedReplay,
        grad_sync: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        check_supported(cfg, action_nvec)
        self.grad_sync = grad_sync
        if replay.device != torch.empty(0, device=device).device:
            raise ValueError(f"replay is on {replay.device}, the learner on {device}")
        check_device_supports(cfg, device)
        self.cfg, self.device, self.replay = cfg, device, replay
        lay = self.layout = FlatLayout(obs_dim, tuple(action_nvec), cfg.trunk_hidden, cfg.head_hidden)
        gen = torch.Generator().manual_seed(cfg.seed)
        self.nets = torch.empty(2, lay.numel, device=device)
        self.params, self.target = self.nets[0], self.nets[1]
        self.params.copy_(lay.init_params(gen))
        self.grads = torch.zeros(lay.numel, device=device)
        self.nets_tf32 = torch.empty_like(self.nets)  # both nets rounded to TF32, for the forwards (each step)
        shapes, offsets = lay.sn_matrices()
        # the table's default slab split on the GPU (the H200 sweep's); few slabs on the CPU interpreter, where
        # programs run serially
        self.sn_table = (
            SpectralNormTable.from_shapes(shapes, device, offsets)
            if device.type == "cuda"
            else SpectralNormTable.from_shapes(shapes, device, offsets, min_slabs=8)
        )
        self.sn_u, self.sn_v = self.sn_table.new_vectors(gen)
        if cfg.spectral_norm:
            spectral_norm_(self.params, self.sn_table, self.sn_u, self.sn_v, SN_WARMUP_ITERATIONS)
        self.target.copy_(self.params)
        # the forwards' TF32-rounded weights, made at every step's start; made here too, so that the actor, which
        # acts with the online half (trainer/actor.py), never reads them unset
        tf32_round_copy(self.nets, self.nets_tf32)
        # the actor's launches when it runs inside the step (attach_actor), and their stream
        self.actor: tuple[Callable[[], None], Callable[[], None]] | None = None
        self.actor_stream: torch.cuda.Stream | None = None
        # the gains are learned only with spectral norm (sigma-reparam); without it they stay 1 and get no
        # gradient (the backward passes dg None: the kernels write none), so that the update is the reference's
        self.learns_gains = cfg.spectral_norm
        self.adam = FusedAdam(
            lay.numel,
            device,
            lr=cfg.lr,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            lr_end_factor=cfg.lr_end_factor,
            lr_decay_steps=cfg.total_learner_steps(),
        )
        b, d, a = cfg.batch_size, lay.branches, lay.actions

        def new(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device=device)

        # the sampler draws its uniforms and computes the annealed beta itself, keyed by the optimizer's device
        # step count (no launch of batch_uniforms: the same Philox stream and formula)
        self.uniforms = CounterUniforms(self.adam.step_count, cfg.seed)
        self.beta = AnnealedBeta(self.adam.step_count, cfg.per_beta_start, cfg.per_beta_end, cfg.total_learner_steps())
        self.weights = new(b)
        self.idx, self.action = new(b, dtype=torch.int64), new(b, d, dtype=torch.int64)
        self.reward, self.terminated = new(b), new(b)
        self.acts = [new(b, x.rows) for x in lay.layers]  # online activations, kept for the backward
        # transposed copies the weight-gradient GEMMs read (batch axis contiguous): the observations and the
        # activations that feed a next layer (both split into TF32 parts, kernels/tf32_split.py), and the
        # pre-activation gradients (dz_t; not the first layer's when its weight gradient is fused)
        self.obs_t = new(2, obs_dim, b)
        self.acts_t = [new(2, x.rows, b) for x in lay.layers[:-1]] + [None]
        self.ddqn_acts = [new(2, b, x.rows) for x in lay.layers]  # online + target on s'
        self.q, self.q_next = new(b, d * a), new(2, b, d * a)
        # the grouped forward's launch point (cfg.grouped_forward), swappable like the step's others below
        self.linear_forward_grouped = linear_forward_grouped
        self.dz = [None] + [new(b, x.rows) for x in lay.layers[1:]]  # pre-activation gradients (layer 0: none)
        # the first layer's weight gradient is fused into the second layer's input-gradient kernel where its input
        # fits one tile (kernels/linear.py MAX_FUSED_K0): then its pre-activation gradient is never stored
        self.fuse_first_weight_grad = len(lay.layers) >= 2 and lay.layers[0].cols <= MAX_FUSED_K0
        self.dz_t = [
            None if i == 0 and self.fuse_first_weight_grad else new(x.rows, b) for i, x in enumerate(lay.layers)
        ]
        self.weight_transpose = WeightTranspose(
            [(x.w_offset, x.g_offset, x.rows, x.cols, x.gain_group) for x in lay.layers[1:]], device
        )
        self.wt = new(self.weight_transpose.numel)
        self.wts = [None, *self.weight_transpose.views(self.wt)]  # g-scaled W^T of layers 1..
        self.td = TDLossOutputs.empty(b, d, a, device)
        self.td_ws = TDLossWorkspace.create(b, device)
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.weights_rounded = torch.cuda.Event() if device.type == "cuda" else None
        self.acting = FlatForward(lay, device)
        self.action_nvec = torch.tensor(action_nvec, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.use_graph = device.type == "cuda"
        # the step's launch points, instance attributes so that guards/faults.py can swap one for a faulty variant
        self.linear_forward, self.linear_backward_input = linear_forward, linear_backward_input
        self.round_weights = tf32_round_copy
        self.spectral_norm = lambda: spectral_norm_(
            self.params, self.sn_table, self.sn_u, self.sn_v, cfg.sn_power_iterations
        )
        self.capture_s = self.warmup_s = float("nan")
        self.steps = 0

    def _sample(self) -> None:
        cfg, rp = self.cfg, self.replay
        with phase_range("sample"):
            tree_sample(
                rp.tree.nodes,
                rp.capacity,
                rp.capacity,
                cfg.batch_size,
                self.uniforms,
                self.beta,
                self.idx,
                self.weights,
            )

    def _gather(self) -> None:
        """The sampled transitions' actions, rewards, terminal flags and transposed observations (the forwards read
        the observations by index: only the loss and the first layer's weight gradient need these)."""
        rp = self.replay
        with phase_range("sample"):
            gather_transitions(
                self.idx,
                rp.action,
                rp.reward,
                rp.terminated,
                rp.obs,
                self.action,
                self.reward,
                self.terminated,
                self.obs_t,
            )

    def _forward(
        self,
        obs: torch.Tensor,
        acts: list[torch.Tensor],
        q: torch.Tensor,
        nets: int,
        acts_t: list[torch.Tensor | None] | None = None,
    ) -> None:
        """Forward of `nets` networks (1: online on s; 2: online and target on s') from replay rows self.idx."""
        flat_forward(
            self.layout,
            self.params,
            obs,
            acts,
            q,
            rows=self.idx,
            nets=nets,
            linear=self.linear_forward,
            acts_t=acts_t,
            w_buf=self.nets_tf32[0],
        )

    def _backward(self) -> None:
        lay, params, grads, learn = self.layout, self.params, self.grads, self.learns_gains
        w_out, _, g_out = lay.out_views(params)
        dw_out, db_out, dg_out = lay.out_views(grads)
        db_hidden = lay.layers[-1].views(grads)[1]
        heads_backward(
            self.acts[-1],
            self.td.grad.view(self.cfg.batch_size, -1),
            w_out,
            g_out,
            self.dz[-1],
            self.dz_t[-1],
            db_hidden,
            dw_out,
            db_out,
            dg_out if learn else None,
            lay.branches,
        )
        for i in reversed(range(len(lay.layers))):
            slots = lay.layers[i]
            w, _, g = slots.views(params)
            dw, _, dg = slots.views(grads)
            if i > 0 or not self.fuse_first_weight_grad:
                linear_backward_weight(
                    self.dz_t[i],
                    self.obs_t if i == 0 else self.acts_t[i - 1],
                    w,
                    g,
                    dw,
                    dg if learn else None,
                    slots.gain_group,
                )
            if i > 0:  # layer i - 1's pre-activation gradient (the layouts it has buffers for) and bias gradient
                below = None
                if i == 1 and self.fuse_first_weight_grad:  # and the first layer's weight gradient, from registers
                    (w0, _, g0), (dw0, _, dg0) = lay.layers[0].views(params), lay.layers[0].views(grads)
                    below = (self.obs_t, w0, g0, dw0, dg0 if learn else None, lay.layers[0].gain_group)
                self.linear_backward_input(
                    self.dz[i],
                    self.wts[i],
                    self.acts[i - 1],
                    self.dz_t[i - 1],
                    lay.layers[i - 1].views(grads)[1],
                    dx=self.dz[i - 1],
                    weight_grad_below=below,
                )

    def _on_side(self, stream: torch.cuda.Stream | None | str = "side"):
        """Context: launches in it run on the side stream (or `stream`) after everything launched so far on the
        current one (a fork; `_join_side` joins). Without that stream (the CPU, the ddqn_serial fault) a no-op."""
        stream = self.side if stream == "side" else stream
        if stream is None:
            return nullcontext()
        stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(stream)

    def _join_side(self) -> None:
        """The current stream waits for everything launched on the side stream so far."""
        if self.side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.side)

    def attach_actor(self, overlapped: Callable[[], None], tail: Callable[[], None]) -> None:
        """Run one env step of the actor inside every later step (and so inside its graph, when captured after
        this): `overlapped` (the fused actor's main launch, which writes the replay's storage at the ring position)
        on a third stream once the step's reads of the replay storage are done (the forwards and the gather),
        concurrent with the loss, backward, optimizer and spectral norm; `tail` (the sum tree's insert and the
        actor's commit) on the main stream after the step's last join (after the priority update). The actor acts
        with nets_tf32[0], which this step wrote before its forwards and the next step rewrites only after the
        graph ends. The warm-up steps of `capture` run without it. Raises RuntimeError once captured."""
        if self.graph is not None:
            raise RuntimeError("attach_actor: the step is captured already")
        self.actor = (overlapped, tail)
        self.actor_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def _forwards(self) -> None:
        """The forwards as two chains: the Double-DQN one (online and target net on s', one launch per layer) on the
        side stream, beside the online one on s on the main stream (the default)."""
        rp = self.replay
        with self._on_side(), phase_range("ddqn_forward"):
            self._forward(rp.next_obs, self.ddqn_acts, self.q_next, nets=2)
        with phase_range("forward"):
            self._forward(rp.obs, self.acts, self.q, nets=1, acts_t=self.acts_t)

    def _forwards_grouped(self) -> None:
        """The three forwards (online net on s, online and target net on s') as one chain on the main stream, one
        launch per layer and one for the heads (grid z = 3; cfg.grouped_forward): the same output buffers as
        `_forwards`', so the loss and the backward are unchanged."""
        rp = self.replay
        with phase_range("forward"):
            flat_forward_grouped(
                self.layout,
                self.params,
                rp.obs,
                rp.next_obs,
                self.acts,
                self.ddqn_acts,
                self.q,
                self.q_next,
                rows=self.idx,
                acts_t=self.acts_t,
                w_buf=self.nets_tf32[0],
                linear=self.linear_forward_grouped,
            )

    def _body(self, with_actor: bool = True) -> None:
        with dependent_launch(self.cfg.dependent_launch):  # PDL for every Triton launch of the step, or none
            self._launch_step(with_actor)

    def _launch_step(self, with_actor: bool) -> None:
        cfg, rp, lay = self.cfg, self.replay, self.layout
        actor = self.actor if with_actor else None
        # beside the sampling (small latency-bound launches): the gain-scaled W^T the input-gradient GEMMs read
        # (it reads only the parameters) and the zeroed gradient buffer the weight-gradient kernels accumulate into
        # (after the previous step's Adam read it: the fork makes the side stream wait for the main one); on the
        # side stream they are ahead of the Double-DQN forward
        # first, the TF32-rounded weights both forwards read (after the previous step's Adam and spectral norm)
        with self._on_side():
            with phase_range("forward"):
                self.round_weights(self.nets, self.nets_tf32)
            if self.weights_rounded is not None:
                self.weights_rounded.record()
            with phase_range("backward"):
                self.weight_transpose(self.params, self.wt)
                self.grads.zero_()
        self._sample()
        if self.weights_rounded is not None:  # before any forward the main stream might run (the copy is on the side)
            torch.cuda.current_stream(self.device).wait_event(self.weights_rounded)
        if cfg.grouped_forward:
            self._forwards_grouped()
        else:
            self._forwards()
        self._gather()  # after the online chain, the shorter one: off the critical path (grouped: after all three)
        self._join_side()
        if actor is not None:  # the replay's storage is read: the actor may write its ring slots now
            with self._on_side(self.actor_stream), phase_range("env_step"):
                actor[0]()
        b, d, a = cfg.batch_size, lay.branches, lay.actions
        with phase_range("loss"):
            td_loss_forward(
                self.q.view(b, d, a),
                self.q_next[0].view(b, d, a),
                self.q_next[1].view(b, d, a),
                self.action,
                self.reward,
                self.terminated,
                self.weights,
                cfg.gamma,
                cfg.loss,
                cfg.huber_delta,
                cfg.cql_weight,
                cfg.per_eps,
                cfg.per_alpha,
                out=self.td,
                workspace=self.td_ws,
                target_max=cfg.td_target_max,
            )
        with phase_range("backward"):
            self._backward()
        # the sum-tree update on the side stream, concurrent with the optimizer and spectral norm (small,
        # latency-bound launches; beside the backward it slowed the heads' backward as much as it hid)
        with self._on_side(), phase_range("priority_update"):
            tree_update(
                rp.tree.nodes, self.idx, self.td.priorities, rp.capacity, rp.tree.max_value, rp.tree.bad_priority_count
            )
        if self.grad_sync is not None:  # data-parallel: one all-reduce of the flat gradient, beside the tree update
            with phase_range("grad_allreduce"):
                self.grad_sync(self.grads)
        with phase_range("optimizer"):
            self.adam.step(self.params, self.grads, self.target, tau=cfg.tau, target_every=cfg.target_update_interval)
        if cfg.spectral_norm:
            with phase_range("spectral_norm"):
                self.spectral_norm()
        self._join_side()
        if actor is not None:  # after the priority update: the insert's leaves win, as in the sequential order
            if self.actor_stream is not None:
                torch.cuda.current_stream(self.device).wait_stream(self.actor_stream)
            with phase_range("env_step"):
                actor[1]()

    def capture(self) -> float:
        """Run WARMUP_STEPS eager steps on a side stream (compiling every kernel: their wall seconds go to
        warmup_s), then capture one step into a CUDA graph; returns (and keeps in capture_s) the capture's
        seconds. CUDA only (RuntimeError else).
        The replay must hold at least one transition (sampling from an empty tree reads garbage)."""
        if self.device.type != "cuda":
            raise RuntimeError("HotLearner.capture needs a CUDA device")
        start = time.perf_counter()
        warm = torch.cuda.Stream(self.device)
        warm.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(warm):
            for _ in range(WARMUP_STEPS):
                self._body(with_actor=False)
                self.steps += 1
        torch.cuda.current_stream(self.device).wait_stream(warm)
        torch.cuda.synchronize(self.device)
        self.warmup_s = time.perf_counter() - start
        start = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body()
        self.graph = graph
        torch.cuda.synchronize(self.device)  # once, at capture time (outside the hot loop)
        self.capture_s = time.perf_counter() - start
        return self.capture_s

    def step(self) -> None:
        """One learner step: a graph replay once `capture` ran, else the same kernels launched eagerly."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
        self.steps += 1

    def head_keys(self) -> tuple[str, ...]:
        """The dueling head's parts: "value", then "b0" ... "b{D-1}" (one per action branch)."""
        return ("value", *(f"b{d}" for d in range(self.layout.branches)))

    def metric_names(self) -> tuple[str, ...]:
        """Names of the values `metric_sources` holds, in order: METRICS, then (with spectral norm on) the learned
        gains of each head part's hidden matrix, gain_hidden_<key>, and output matrix, gain_out_<key>
        (keys from `head_keys`)."""
        if not self.cfg.spectral_norm:
            return METRICS
        keys = self.head_keys()
        return (*METRICS, *(f"gain_hidden_{k}" for k in keys), *(f"gain_out_{k}" for k in keys))

    def metric_sources(self) -> list[torch.Tensor]:
        """Device tensors holding the last step's metrics, named by `metric_names`: the TD loss's metric slots (5,),
        the pre-clip grad norm () and, with spectral norm on, the (1 + D,) hidden-layer and (1 + D,) output-layer
        gain views of params_buf (no copy, no kernel); overwritten by every step (publish them with
        hotloop.trainer.readback)."""
        if not self.cfg.spectral_norm:
            return [self.td.metrics, self.adam.grad_norm]
        return [
            self.td.metrics,
            self.adam.grad_norm,
            self.layout.layers[-1].views(self.params)[2],
            self.layout.out_views(self.params)[2],
        ]

    def head_norms(self, values: Mapping[str, float]) -> dict[str, float]:
        """Per head part, its norm head_norm_<key> = gain_hidden_<key> x gain_out_<key> from published `values`
        (`metric_names`): every weight matrix is spectral-normalized to sigma = 1 and ReLU is 1-Lipschitz, so this
        is the spectral-norm (Lipschitz) bound of the value head and of each advantage branch (Miyato et al. 2018;
        Zhai et al. 2023 for the learned gain). Empty without spectral norm or when the gains are not in
        `values`."""
        keys = self.head_keys()
        if not all(f"gain_hidden_{k}" in values and f"gain_out_{k}" in values for k in keys):
            return {}
        return {f"head_norm_{k}": values[f"gain_hidden_{k}"] * values[f"gain_out_{k}"] for k in keys}

    @torch.no_grad()
    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """argmax_a Q_d(obs, a) of the online net per branch: (N, D) int64 for obs (N, obs_dim); eager kernels."""
        return self.acting.greedy(self.params, obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, epsilon: float, generator: torch.Generator) -> torch.Tensor:
        """Epsilon-greedy actions (N, D) int64 (hotloop.trainer.learner.epsilon_greedy), as DQNLearner.act."""
        return epsilon_greedy(self.greedy(obs), self.action_nvec, epsilon, generator)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of everything the learner carries from step to step (flat nets, Adam, spectral-norm vectors)."""
        return {
            "nets": self.nets.clone(),
            "sn_u": self.sn_u.clone(),
            "sn_v": self.sn_v.clone(),
            **{f"adam.{k}": v for k, v in self.adam.state_dict().items()},
        }

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor a rank's learner must share with the others at the start (the flat nets and the spectral-norm
        vectors), for hotloop.trainer.distributed.broadcast_; `sync_rounded` must follow a change of them."""
        return [self.nets, self.sn_u, self.sn_v]

    def sync_rounded(self) -> None:
        """Remake the TF32-rounded weights nets_tf32 (the actor's) from nets, after they were overwritten."""
        self.round_weights(self.nets, self.nets_tf32)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy `state` (from state_dict) in place, keeping every address (a captured graph stays valid).
        Raises ValueError for missing keys or wrong shapes."""
        for key, t in (("nets", self.nets), ("sn_u", self.sn_u), ("sn_v", self.sn_v)):
            if key not in state or tuple(state[key].shape) != tuple(t.shape):
                raise ValueError(f"learner state: {key!r} missing or not of shape {tuple(t.shape)}")
            t.copy_(state[key])
        self.round_weights(self.nets, self.nets_tf32)  # the actor's weights follow the loaded ones
        self.adam.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("adam.")})


PHASE_RULES = {
    r"_actor_step_kernel|_tree_insert_kernel|_actor_commit_kernel": "env_step",
    r"_tree_sample|_tree_weights|_gather_transitions": "sample",
    r"_fwd_ddqn_|_heads_ddqn_": "ddqn_forward",
    r"_fwd_online_|_heads_online_|_fwd_weights_rna|_fwd_grouped_|_heads_grouped_": "forward",
    r"_td_loss": "loss",
    r"_bwd_|FillFunctor": "backward",
    r"_grad_sumsq|_clip_adam": "optimizer",
    r"_spectral_norm_kernel": "spectral_norm",
    r"_tree_update": "priority_update",
    r"^nccl": "grad_allreduce",
}
"""Kernel-name regex -> phase of HotLearner's kernels, for hotloop.guards.step_metrics (a graph replay carries no
record_function ranges, so its kernels are assigned to phases by name; the gradient buffer's zero_() is the
backward's one memset, a FillFunctor kernel; a data-parallel step's all-reduce is NCCL's kernel,
ncclDevKernel_AllReduce_...). The fused actor's kernels (`attach_actor`) are the env step's, not
the learner's (`ACTOR_PHASE`)."""
ACTOR_PHASE = "env_step"
"""The phase of the fused actor's kernels in PHASE_RULES (hotloop.trainer.loop.learner_phases leaves it out)."""
