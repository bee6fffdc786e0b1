"""Epochs of learner steps interleaved with vectorized env steps (the reference training loop).

One learner step = `env_steps_per_update` vectorized env steps (epsilon-greedy actions, transitions added to the
prioritized replay at max priority) + one sampled batch + one `DQNLearner.update` + a priority update. Metrics
are accumulated on the device and read once per epoch, so the loop itself adds one host sync per epoch.

The loop body is `Trainer.iterate(n)`: `run_epoch` calls it, and `hotloop gate` guards K iterations of it after
the epochs, so the guarded code is the loop's own code. Each iteration is one "step" range holding everything the
body does; `loop_periods` says which phases an iteration runs and how often (some only every N iterations), and
`learner_phases` which of them are the learner's (what the learner-side criteria of docs/criteria.md judge).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import torch

from hotloop.profiles.ranges import phase_range
from hotloop.trainer.actor import DeviceActor, capturable
from hotloop.trainer.config import Config
from hotloop.trainer.device_choice import learner_kind, resolve_device
from hotloop.trainer.distributed import averager_if_initialized, broadcast_, rank_info, rank_seed
from hotloop.trainer.envs import make_env
from hotloop.trainer.episodes import EpisodeReturns
from hotloop.trainer.evaluation import build_evaluator
from hotloop.trainer.learner import DQNLearner
from hotloop.trainer.readback import AsyncReadback
from hotloop.trainer.replay import PrioritizedReplay
from hotloop.trainer.resume import restore_trainer, trainer_state
from hotloop.trainer.schedules import LinearSchedule
from hotloop.trainer.step import ACTOR_PHASE, PHASE_RULES, HotLearner

STEP_RANGE = "step"
"""Name of the range (NVTX + record_function, hotloop.profiles.ranges.phase_range) around each loop iteration."""
LEARNER_KINDS = ("hotloop", "reference")
_LEARNER_PHASES = {
    "hotloop": (*(p for p in dict.fromkeys(PHASE_RULES.values()) if p != ACTOR_PHASE), "update"),
    "reference": ("sample", "update", "priority_update", "target_update"),
}


def progress_period(cfg: Config) -> int:
    """Loop iterations between two `on_progress` calls: max(1, learner_steps_per_epoch // 100)."""
    return max(1, cfg.learner_steps_per_epoch // 100)


def loop_periods(cfg: Config, learner_kind: str) -> dict[str, int]:
    """{phase: period} of the phase ranges one `Trainer.iterate` iteration opens: the phase runs in every
    period-th iteration (1: in every one). Any `period` consecutive iterations hold the phase at least once, since
    each periodic phase runs when a counter that grows by one per iteration is a multiple of its period:

    - env_step 1 (`env_steps_per_update` vectorized env steps: the actor graph with the hotloop learner);
    - hotloop learner: update 1 (the captured learner step; its kernels' own phases, hotloop.trainer.step.
      PHASE_RULES, are in the graph) and readback_publish every `log_interval` (learner_steps % log_interval == 0);
      its target update is fused into the Adam kernel (no phase of its own);
    - reference learner: sample 1, update 1, priority_update 1, target_update every `target_update_interval`
      (DQNLearner.steps % target_update_interval == 0, hard or Polyak);
    - progress every `progress_period(cfg)` (the `on_progress` callback; counted from the start of each iterate
      call).

    Raises ValueError for a learner kind not in LEARNER_KINDS (resolve "auto" with `learner_kind` first)."""
    if learner_kind not in LEARNER_KINDS:
        raise ValueError(f"learner kind must be one of {LEARNER_KINDS}, got {learner_kind!r}")
    periods = {"env_step": 1}
    if learner_kind == "hotloop":
        periods |= {"update": 1, "readback_publish": cfg.log_interval}
    else:
        periods |= {"sample": 1, "update": 1, "priority_update": 1, "target_update": cfg.target_update_interval}
    return periods | {"progress": progress_period(cfg)}


def learner_phases(learner_kind: str) -> tuple[str, ...]:
    """The phases of the learner step (a range of one of them, or a kernel assigned to one, is the learner's):
    hotloop: the PHASE_RULES phases (its graph's kernels, by name) + "update" (the range around the replay);
    reference: sample, update (with its sub-ranges ddqn_forward, forward, loss, backward, optimizer),
    priority_update, target_update. Raises ValueError for a learner kind not in LEARNER_KINDS."""
    if learner_kind not in LEARNER_KINDS:
        raise ValueError(f"learner kind must be one of {LEARNER_KINDS}, got {learner_kind!r}")
    return _LEARNER_PHASES[learner_kind]


@dataclass
class EpochStats:
    """One row of the per-epoch table (host floats; wall_s in seconds, rates per second of wall time)."""

    epoch: int
    learner_steps: int
    env_steps: int
    wall_s: float
    learner_steps_per_s: float
    env_steps_per_s: float
    loss: float
    q_mean: float
    grad_norm: float
    mean_return_100: float
    eval_return: float
    episodes: int
    epsilon: float
    metrics_step: int
    """learner step at which loss, q_mean and grad_norm were measured (hotloop: the last completed readback)"""
    evaluate_s: float = 0.0
    """host seconds of the epoch's greedy evaluation (after the loop, outside wall_s; 0 when it is off)"""
    head_norms: dict[str, float] = field(default_factory=dict)
    """hotloop learner with spectral norm: head_norm_<part> per head part, from the same readback
    (HotLearner.head_norms); empty otherwise"""

    def as_row(self) -> dict[str, float | int]:
        """The table row: every field, with `head_norms` spread into one column per head part."""
        row = asdict(self)
        head_norms = row.pop("head_norms")
        return {**row, **head_norms}


class Trainer:
    """Builds env, replay and learner from a Config and runs epochs.

    Args:
        cfg: the run's Config.
        on_phase: called with a phase name ("env_step", "sample", "update", "priority_update", "readback_publish",
            "progress", "readback", "evaluate", "capture") as the loop enters it (each phase is also an NVTX range,
            and every loop iteration a "step" range, via hotloop.profiles.ranges.phase_range); the hang watchdog
            uses it to report where a hang happened.
        on_progress: called with (iterations done, iterations of this `iterate` call: an epoch's learner steps
            in `run_epoch`) every `progress_period(cfg)` iterations, inside the iteration's "step" range, in a
            "progress" phase range.
    Counters (host ints): env_steps (transitions), learner_steps, epochs_done (set by run_epoch and restore).
    warmup_s: host seconds the loop has spent compiling kernels and capturing CUDA graphs (the actor's first eager
        step, its capture, the learner's warm-up steps and capture), a part of the epoch's wall_s (epoch 1's, or
        the first after a resume); the run timeline (hotloop.profiles.run_timeline) shows it apart.
    actor: the DeviceActor (trainer/actor.py) that runs the env steps with the hotloop learner and a capturable env,
        else None. obs: (N, obs_dim), the observation to act on next (read-only property, updated in place).
    Checkpoint / resume: checkpoint_state and restore (hotloop.trainer.resume).
    Data-parallel: when a torch.distributed process group is initialized (`hotloop train --nproc N`,
        hotloop.trainer.distributed), `rank` (RankInfo) says where this process is; its env, replay and actors are
        seeded by rank (hotloop.trainer.distributed.rank_seed), the learner's initial state is rank 0's, and every learner step averages the
        gradient over the ranks (one all-reduce), so the parameters stay identical on every rank.
    Raises ValueError for an unusable device or env name.
    """

    def __init__(
        self,
        cfg: Config,
        on_phase: Callable[[str], None] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.on_phase = on_phase or (lambda name: None)
        self.on_progress = on_progress or (lambda done, total: None)
        # data-parallel (a process group initialized, hotloop.trainer.distributed): this rank's actors, env and
        # replay are seeded by rank (rank_seed), its gradient is averaged over the ranks at every learner step, and the
        # learner's initial state is rank 0's (broadcast); without a group, seed and a single-process learner
        self.rank = rank_info()
        seed = rank_seed(cfg.seed)
        grad_sync = averager_if_initialized()
        torch.manual_seed(seed)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.env = make_env(cfg.env, cfg.num_envs, self.device, seed, **cfg.env_shape())
        self.replay = PrioritizedReplay(
            cfg.replay_capacity,
            self.env.obs_dim,
            len(self.env.action_nvec),
            alpha=cfg.per_alpha,
            eps=cfg.per_eps,
            device=self.device,
            generator=self.generator,
        )
        self.learner_kind = learner_kind(cfg, self.device)
        if self.learner_kind == "hotloop":
            self.learner = HotLearner(
                replace(cfg, seed=seed),
                self.env.obs_dim,
                self.env.action_nvec,
                self.device,
                self.replay,
                grad_sync=grad_sync,
            )
            self.readback = AsyncReadback(self.learner.metric_names(), self.device)
        else:
            self.learner = DQNLearner(cfg, self.env.obs_dim, self.env.action_nvec, self.device, grad_sync=grad_sync)
        if grad_sync is not None:
            broadcast_(self.learner.state_tensors())
            if isinstance(self.learner, HotLearner):
                self.learner.sync_rounded()
        self.returns = EpisodeReturns(cfg.num_envs, self.device)
        flat = (self.learner.layout, self.learner.params) if isinstance(self.learner, HotLearner) else None
        self.evaluator = build_evaluator(cfg, self.learner.greedy, self.device, self.on_phase, flat)
        self.eval_env = self.evaluator.env if self.evaluator is not None else None
        self._obs = self.env.reset(seed=seed)
        per_update = cfg.env_steps_per_update * cfg.num_envs
        self.prefill_vec_steps = -(-cfg.learning_starts // cfg.num_envs)
        total_env = cfg.total_learner_steps() * per_update + self.prefill_vec_steps * cfg.num_envs
        self.epsilon = LinearSchedule(cfg.eps_start, cfg.eps_end, cfg.eps_decay_fraction * total_env)
        self.beta = LinearSchedule(cfg.per_beta_start, cfg.per_beta_end, cfg.total_learner_steps())
        self.actor = None
        if isinstance(self.learner, HotLearner) and capturable(self.env):
            self.actor = DeviceActor(
                self.learner,
                self.env,
                self.replay,
                self.returns,
                self.obs,
                seed,
                cfg.eps_start,
                cfg.eps_end,
                self.epsilon.duration / cfg.num_envs,
            )
        self.actor_in_step = bool(
            cfg.actor_in_step
            and self.actor is not None
            and self.actor.fused is not None
            and cfg.env_steps_per_update == 1
        )
        if self.actor_in_step:
            self.learner.attach_actor(self.actor.launch_main, self.actor.launch_tail)
        self.env_steps = 0
        self.warmup_s = 0.0
        self.learner_steps = 0
        self.epochs_done = 0
        self._no_sums = torch.zeros(3, device=self.device)

    @property
    def obs(self) -> torch.Tensor:
        """(N, obs_dim): the observation to act on next. Read-only: update it in place (`obs.copy_(...)`), as the
        actor's captured graph reads this tensor by address."""
        return self._obs

    def env_step(self) -> None:
        """One vectorized env step with epsilon-greedy actions; its transitions go into the replay. With the hotloop
        learner and a capturable env, the DeviceActor's step: eager once (compiling its kernels), then captured
        (on CUDA) and replayed; else eager torch ops with host-side epsilon."""
        if self.actor is not None:
            if self.actor.graph is None and self.device.type == "cuda" and self.actor.eager_steps > 0:
                with self.phase("capture"), self._warming():
                    self.actor.capture()
            if self.actor.eager_steps == 0:  # the first step compiles the actor's kernels
                with self._warming():
                    self.env_steps += self.actor.step()
                return
            self.env_steps += self.actor.step()  # no context manager per step on the hot path
            return
        actions = self.learner.act(self.obs, self.epsilon.value(self.env_steps), self.generator)
        res = self.env.step(actions)
        self.replay.add(self.obs, actions, res.reward, res.final_obs, res.terminated)
        self.returns.update(res.reward, res.terminated | res.truncated)
        self.obs.copy_(res.obs)
        self.env_steps += self.cfg.num_envs

    def prefill(self) -> None:
        """The `prefill_vec_steps` vectorized env steps (>= learning_starts transitions, exploration policy) that
        run before the first learner step, in an "env_step" phase range; run_epoch runs them in epoch 1."""
        with self.phase("env_step"):
            for _ in range(self.prefill_vec_steps):
                self.env_step()

    @contextmanager
    def _warming(self) -> Iterator[None]:
        """Add the body's wall seconds to `warmup_s` (kernel compilation and CUDA graph captures)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.warmup_s += time.perf_counter() - start

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Enter phase `name`: tell `on_phase` (the watchdog), and open its NVTX + record_function range."""
        self.on_phase(name)
        with phase_range(name):
            yield

    def learner_step(self) -> torch.Tensor | None:
        """Sample, update, re-prioritize; returns the stacked detached (loss, q_mean, grad_norm), or None for the
        hotloop learner, whose metrics go through the non-blocking readback every `log_interval` steps."""
        if isinstance(self.learner, HotLearner):
            if self.learner.graph is None and self.learner.use_graph:
                with self.phase("capture"), self._warming():  # warm-up steps (compiling every kernel) + capture
                    self.learner.capture()
            with self.phase("update"):
                self.learner.step()
            self.learner_steps += 1
            if self.learner_steps % self.cfg.log_interval == 0:
                with self.phase("readback_publish"):
                    self.readback.publish(self.learner.metric_sources(), self.learner.steps)
            return None
        with self.phase("sample"):
            b = self.replay.sample(self.cfg.batch_size, self.beta.value(self.learner_steps))
        with self.phase("update"):
            m = self.learner.update(b.obs, b.action, b.reward, b.next_obs, b.terminated, b.weights)
        with self.phase("priority_update"):
            self.replay.update_priorities(b.indices, m.td_abs)
        self.learner_steps += 1
        return torch.stack([m.loss, m.q_mean, m.grad_norm])

    def train_step(self) -> torch.Tensor | None:
        """One iteration of the loop: `env_steps_per_update` vectorized env steps, then one learner step;
        returns what `learner_step` returns. With `actor_in_step` the learner step runs the env step itself (one
        graph: it samples before the actor writes, HotLearner.attach_actor), and the "env_step" phase that follows
        it keeps the host's counters."""
        if self.actor_in_step:
            if self.actor.eager_steps == 0 and self.learner.graph is None and self.learner.use_graph:
                with self.phase("env_step"):  # compile the actor's kernels before the learner's capture holds them
                    self.env_step()
            out = self.learner_step()
            with self.phase("env_step"):
                self.env_steps += self.actor.note_step()
            return out
        with self.phase("env_step"):
            for _ in range(self.cfg.env_steps_per_update):
                self.env_step()
        return self.learner_step()

    def iterate(self, n: int) -> torch.Tensor:
        """Run `n` iterations of the training loop (the loop body `run_epoch` runs, and the code `hotloop gate`
        guards). Each iteration is one `phase_range(STEP_RANGE)` ("step") holding all it does: `train_step`
        (env steps, replay insert, learner step, the periodic readback publication or target update) and, every
        `progress_period(cfg)` iterations (counted from this call's start), `on_progress(i + 1, n)` in a "progress"
        phase range. Returns the (3,) float32 device tensor summing (loss, q_mean, grad_norm) over the iterations
        (zeros with the hotloop learner, whose metrics go through the readback); no host sync of its own.
        Raises ValueError for n < 0."""
        if n < 0:
            raise ValueError(f"iterate: n must be >= 0, got {n}")
        # the hotloop learner's metrics go through the readback: its sums are a zero buffer made once (a zeros(3)
        # per call would be a one-block fill kernel in the loop)
        hot = isinstance(self.learner, HotLearner)
        sums = self._no_sums if hot else torch.zeros(3, device=self.device)
        every = progress_period(self.cfg)
        for i in range(n):
            with phase_range(STEP_RANGE):
                out = self.train_step()
                if out is not None:
                    sums += out
                if (i + 1) % every == 0:
                    with self.phase("progress"):
                        self.on_progress(i + 1, n)
        return sums

    def run_epoch(self, epoch: int) -> EpochStats:
        """Run one epoch (the first also prefills `learning_starts` transitions); returns its stats row."""
        cfg = self.cfg
        start_wall = time.perf_counter()
        start_env = self.env_steps
        if self.learner_steps == 0:
            self.prefill()
        sums = self.iterate(cfg.learner_steps_per_epoch)
        with self.phase("readback"):
            mean_return = self.returns.mean()  # the epoch's one host sync
            if isinstance(self.learner, HotLearner):
                reading = self.readback.poll() or self.readback.latest
                values = reading.values if reading else {}
                loss, q_mean, grad_norm = (values.get(k, float("nan")) for k in ("td_loss", "q_mean", "grad_norm"))
                metrics_step = reading.step if reading else -1
                head_norms = self.learner.head_norms(values)
            else:
                loss, q_mean, grad_norm = (sums / cfg.learner_steps_per_epoch).tolist()
                metrics_step = self.learner_steps
                head_norms = {}
        wall = time.perf_counter() - start_wall
        eval_start = time.perf_counter()
        with self.phase("evaluate"):
            eval_return = self.evaluate(seed=self.cfg.seed * 100_003 + epoch)
        evaluate_s = time.perf_counter() - eval_start
        env_steps = self.env_steps - start_env
        self.epochs_done = epoch
        return EpochStats(
            epoch=epoch,
            learner_steps=cfg.learner_steps_per_epoch,
            env_steps=env_steps,
            wall_s=wall,
            learner_steps_per_s=cfg.learner_steps_per_epoch / wall,
            env_steps_per_s=env_steps / wall,
            loss=loss,
            q_mean=q_mean,
            grad_norm=grad_norm,
            mean_return_100=mean_return,
            eval_return=eval_return,
            episodes=self.returns.count(),
            epsilon=self.epsilon.value(self.env_steps),
            metrics_step=metrics_step,
            evaluate_s=evaluate_s,
            head_norms=head_norms,
        )

    def evaluate(self, seed: int, max_steps: int = 10_000) -> float:
        """Mean return (host float) of one greedy (epsilon 0) episode in each of the `eval_episodes` env copies reset
        with `seed`, at most `max_steps` steps each, or nan when evaluation is off: `self.evaluator`
        (hotloop.trainer.evaluation.GreedyEvaluator). On CUDA, CartPole with the hotloop learner in one fused launch
        (kernels/greedy_eval.py), one host read at the end; another capturable env as a CUDA graph of a chunk of steps
        replayed up to the env's time limit, one host read at the end (the first evaluation runs one chunk eagerly,
        then captures: a "capture" phase, `evaluator.capture_s`); elsewhere the eager reference loop, which checks for
        the end every 50 steps (a host read each). All give the same returns bit for bit. Seconds of each evaluation:
        `evaluator.last_s`, `evaluator.times_s`. Runs outside the timed epoch (run_epoch's "evaluate" phase). Raises
        ValueError for a seed that is not an int or max_steps not an int >= 0."""
        if self.evaluator is None:
            return float("nan")
        return self.evaluator.evaluate(seed, max_steps)

    def epochs(self) -> Iterator[EpochStats]:
        """Run the epochs after `epochs_done` up to `cfg.epochs`, yielding each one's stats as it finishes."""
        for epoch in range(self.epochs_done + 1, self.cfg.epochs + 1):
            yield self.run_epoch(epoch)

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """(tensors, meta) to save with hotloop.trainer.checkpoint.save_checkpoint: learner, optimizer, replay storage and
        tree, finished-episode returns, RNG states, counters, config (hotloop.trainer.resume.trainer_state). Some tensors
        are the live ones: save or clone them before the trainer runs again."""
        return trainer_state(self)

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Load a `checkpoint_state` in place (hotloop.trainer.resume.restore_trainer). The env is not restored: it is
        reset with seed cfg.seed + 7919 * epoch (its episodes in progress are lost; their running returns restart
        at 0). Raises ValueError naming what does not match (config fields that change shapes, learner kind,
        device type, missing keys) before anything is changed."""
        restore_trainer(self, tensors, meta)
