"""Greedy evaluation of the learner's policy: one episode per env copy, epsilon 0, the mean of the first episodes'
returns (the per-epoch table's `eval_return`).

Three implementations of one evaluation, the same arithmetic step by step, so the same per-env returns bit for bit
(the fused path: on a GPU; tests/kernels/test_greedy_eval.py):

- `evaluate_reference`: the eager loop the trainer has always run (reset with the seed; per step the learner's
  greedy actions, `env.step`, returns accumulated in float64 while each copy's first episode runs), which stops once
  every first episode has ended, checked on the host every 50 steps (`REFERENCE_CHECK_EVERY`: a host read each).
  It is the reference the device path is tested against, and the path of every env the device path cannot run
  (the Gymnasium adapter: not `capturable`; an env with no known time limit) and of the CPU, where a host read
  waits for no device and stopping early saves the work.
- the fused path of `GreedyEvaluator` (CartPole in float32 with the hotloop learner's flat net, on CUDA): the whole
  evaluation in ONE launch, `hotloop.kernels.greedy_eval.greedy_eval` (each program runs its block of envs to the
  end of their first episodes: the flat net's forward as the learner's forward kernels compute it, the greedy
  argmax, the CartPole step rounded as the eager torch ops; kernels/greedy_eval.py), after the env's reset (the
  reset states drawn by the env's generator, as the reference draws them). No chunk, no graph, no host read but
  the mean. The reference's later draws (the autoreset states after each copy's first episode, which its masked
  totals never read) are not drawn: the env's generator and state are left where the reset put them, and every
  evaluation re-seeds both.
- the device path of `GreedyEvaluator` (every other capturable env with a time limit): the number of steps is known
  without reading the device: the env's time limit (`episode_horizon`: CartPole's `max_episode_steps`, the synthetic
  env's `episode_length`), by which every first episode has ended (both envs count the steps of an episode from the
  reset, and truncate at the limit). It runs those steps in chunks of `chunk_steps` (the same function as the
  reference's loop body, with the masked sums in buffers of fixed address); on CUDA one chunk is run eagerly first (it
  compiles the kernels and allocates the buffers: nothing may be compiled during a capture, as trainer/actor.py
  DeviceActor.capture and trainer/step.py HotLearner.capture), then captured once into a CUDA graph and replayed.
  Exactly one host read per evaluation: the mean, at the end. Steps past the time limit (the last chunk may reach
  beyond it) add `reward * False = +0.0` to every total, so they change nothing.

Randomness inside `env.step`: without uniforms, the envs draw from their own generator (`env.generator`):
CartPole the reset states of its autoreset (drawn every step, used only where an episode ended: after a copy's
first episode, which the masked totals no longer read), the synthetic env the noise of every step (it moves the
observations the greedy actions and rewards depend on: it matters). The device path draws exactly as the reference
does (same generator, same calls, same order), and its graph registers the generator
(`CUDAGraph.register_generator_state`), so each replay draws at the generator's current Philox seed and offset and
advances the offset by the graph's draws, as the eager calls would: the reset before each evaluation re-seeds the
generator (`env.reset(seed)`), and the replays after it draw what the reference draws.

Source: the eager evaluation of hotloop.trainer.loop.Trainer.evaluate before issue 37 (item 2, "Evaluation on the
device"); CUDA graph capture rules as in tensordict's cudagraphs docstring (CONVENTIONS.md item 2).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from hotloop.kernels.acting import ActingNet
from hotloop.kernels.greedy_eval import greedy_eval
from hotloop.profiles.ranges import phase_range
from hotloop.trainer.actor import capturable
from hotloop.trainer.config import Config
from hotloop.trainer.envs import CartPoleVec, VecEnv, make_env
from hotloop.trainer.flat_net import FlatLayout

REFERENCE_CHECK_EVERY = 50
"""The reference loop reads on the host whether any first episode still runs every this many steps."""
CHUNK_STEPS = 50
"""Default env steps per captured chunk of the device path (a graph of ~50 x the step's kernels; cartpole's limit
of 500 is 10 replays)."""

Greedy = Callable[[torch.Tensor], torch.Tensor]
"""The learner's greedy policy: obs (N, obs_dim) float on the env's device -> actions (N, D) int64, no host read
(HotLearner.greedy, DQNLearner.greedy)."""
FlatNet = tuple[FlatLayout, torch.Tensor]
"""The hotloop learner's net as the fused path reads it: its layout and its live (P,) float32 parameters on the
env's device (HotLearner.layout, HotLearner.params, updated in place), whose greedy policy is `Greedy`'s."""


def episode_horizon(env: VecEnv) -> int | None:
    """The env's time limit in steps: `max_episode_steps` (CartPoleVec) or `episode_length` (SyntheticBatchEnv), by
    which every episode started at a reset has ended; None for an env that states neither (the Gymnasium adapter)."""
    for name in ("max_episode_steps", "episode_length"):
        value = getattr(env, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def _check_call(seed: object, max_steps: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0:
        raise ValueError(f"max_steps must be an int >= 0, got {max_steps!r}")


@torch.no_grad()
def evaluate_reference(env: VecEnv, greedy: Greedy, seed: int, max_steps: int = 10_000) -> torch.Tensor:
    """The eager reference evaluation: reset `env` with `seed`, then step it with `greedy`'s actions until every
    copy's first episode has ended (checked on the host every REFERENCE_CHECK_EVERY steps: a host read each) or
    `max_steps` steps ran. Returns the (N,) float64 tensor on env.device of each copy's first-episode return (the
    rewards up to and including the step that ended it; up to `max_steps` for one still running). Does not catch
    what `env` or `greedy` raise; raises ValueError for a seed that is not an int or max_steps not an int >= 0."""
    _check_call(seed, max_steps)
    obs = env.reset(seed=seed)
    total = torch.zeros(env.num_envs, dtype=torch.float64, device=env.device)
    running = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    for t in range(max_steps):
        res = env.step(greedy(obs))
        total += res.reward.to(total.dtype) * running
        running &= ~(res.terminated | res.truncated)
        obs = res.obs
        if t % REFERENCE_CHECK_EVERY == REFERENCE_CHECK_EVERY - 1 and not bool(running.any()):
            break
    return total


def fusable(env: VecEnv, flat: FlatNet | None) -> bool:
    """Whether the fused evaluation (kernels/greedy_eval.py) can run `env` with `flat`: a float32 CartPoleVec and a
    flat net of 4 inputs and one branch of 2 actions whose (P,) float32 parameters sit on the env's device (the
    conditions of the fused actor's CartPole path, trainer/actor.py)."""
    if flat is None or not isinstance(env, CartPoleVec) or env.dtype != torch.float32:
        return False
    layout, params = flat
    return (
        (layout.obs_dim, layout.branches, layout.actions) == (4, 1, 2)
        and params.dtype == torch.float32
        and tuple(params.shape) == (layout.numel,)
        and params.device == env.device
    )


def chunk_plan(steps: int, horizon: int, chunk: int) -> tuple[int, int]:
    """(full chunks, remaining single steps) that run `steps` env steps in chunks of `chunk`: when `steps` reaches
    the time limit `horizon`, the remainder is rounded up to one more full chunk (its steps past the limit are
    masked: every first episode has ended), else (max_steps cut the episodes short) the remainder runs as that many
    single steps. Raises ValueError for steps < 0 or horizon, chunk < 1."""
    if steps < 0 or horizon < 1 or chunk < 1:
        raise ValueError(f"chunk_plan needs steps >= 0 and horizon, chunk >= 1; got {steps}, {horizon}, {chunk}")
    full, rest = divmod(steps, chunk)
    if rest and steps >= horizon:
        return full + 1, 0
    return full, rest


class GreedyEvaluator:
    """Greedy evaluation of one episode per env copy (module docstring), on the device where it can be.

    Args:
        env: the evaluation env (N = env.num_envs copies), built once; reset at every evaluation with its seed.
        greedy: the learner's greedy policy (`Greedy`); a captured graph reads the learner's parameters by address,
            so the learner must update them in place (both learners do: their steps, `load_state_dict`, restore).
        chunk_steps: env steps per chunk of the device path (>= 1; capped at the env's time limit).
        device_path: True: the device path (ValueError when the env is not `capturable` or has no
            `episode_horizon`); False: `evaluate_reference`; None (default): the device path exactly when the env
            is on CUDA and could run it (on the CPU the reference's early stop is cheaper, and its host reads wait
            for no device).
        capture: whether the device path captures its chunk into a CUDA graph (None: when the env is on CUDA;
            True off CUDA: ValueError). Without it the chunks run eagerly, with no host read either.
        on_phase: called with "capture" before the capture and "evaluate" after it (the trainer's watchdog hook,
            Trainer.on_phase); the capture also opens a "capture" NVTX / record_function range.
        flat: the learner's flat net (`FlatNet`) where it is the hotloop learner's; None: no fused path.
        fused: True: the fused path (ValueError unless `fusable(env, flat)`; on the CPU the kernel runs on the
            Triton interpreter); False: never; None (default): exactly when the env is fusable and the device path
            is chosen (on CUDA, device_path not False).
    Attributes: env, flat, horizon (the time limit or None), chunk (steps per chunk), device_path, fused, net (the
        fused path's `ActingNet`, else None), scratch ((2, N, net.max_width) float32 on env.device, its workspace,
        else None), use_graph (never with the fused path), graph (CUDAGraph or None), obs (N, obs_dim) env dtype and
        running (N,) bool on env.device (the chunked device path's buffers, allocated here once; None on the other
        paths), total (N,) float64 on env.device (the device and fused paths' returns; None on the reference path),
        eager_chunks (host count of chunks run eagerly), capture_s (seconds of the capture, nan before it: the first
        evaluation on CUDA), last_s (seconds of the last `evaluate`, host wall time to its result; nan before),
        times_s (every evaluation's seconds, in order).
    Raises ValueError as stated for device_path, capture and fused, and for chunk_steps < 1.
    """

    def __init__(
        self,
        env: VecEnv,
        greedy: Greedy,
        *,
        chunk_steps: int = CHUNK_STEPS,
        device_path: bool | None = None,
        capture: bool | None = None,
        on_phase: Callable[[str], None] | None = None,
        flat: FlatNet | None = None,
        fused: bool | None = None,
    ) -> None:
        if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or chunk_steps < 1:
            raise ValueError(f"chunk_steps must be an int >= 1, got {chunk_steps!r}")
        self.env, self.greedy = env, greedy
        self.on_phase = on_phase or (lambda name: None)
        self.horizon = episode_horizon(env)
        possible = capturable(env) and self.horizon is not None
        cuda = env.device.type == "cuda"
        if device_path and not possible:
            raise ValueError(
                f"{type(env).__name__} cannot run the device evaluation: it needs a capturable env "
                f"with a time limit (capturable: {capturable(env)}, horizon: {self.horizon})"
            )
        self.device_path = possible and cuda if device_path is None else bool(device_path)
        if capture and not cuda:
            raise ValueError(f"capture needs a CUDA env, the env is on {env.device}")
        if fused and not fusable(env, flat):
            raise ValueError(
                f"{type(env).__name__} cannot run the fused evaluation: it needs a float32 CartPoleVec "
                "and the hotloop learner's flat net (4 inputs, one branch of 2 actions) on its device"
            )
        self.fused = fusable(env, flat) and cuda and self.device_path if fused is None else bool(fused)
        self.flat = flat
        self.net = ActingNet.from_layout(flat[0], env.device) if self.fused else None
        self.use_graph = self.device_path and not self.fused and (cuda if capture is None else bool(capture))
        self.chunk = min(chunk_steps, self.horizon) if self.device_path else chunk_steps
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_chunks = 0
        self.capture_s = self.last_s = math.nan
        self.times_s: list[float] = []
        self.obs = self.total = self.running = self.scratch = None
        n, dev = env.num_envs, env.device
        if self.fused:
            self.total = torch.zeros(n, dtype=torch.float64, device=dev)
            self.scratch = torch.empty(2, n, self.net.max_width, device=dev)
        elif self.device_path:
            self.obs = torch.empty(n, env.obs_dim, dtype=getattr(env, "dtype", torch.float32), device=dev)
            self.total = torch.zeros(n, dtype=torch.float64, device=dev)
            self.running = torch.ones(n, dtype=torch.bool, device=dev)

    @torch.no_grad()
    def _steps(self, steps: int) -> None:
        """`steps` evaluation steps from `obs`: the reference's loop body (without its host check), the last
        observation copied back into `obs`. Device work only; what a capture records."""
        obs, total, running = self.obs, self.total, self.running
        for _ in range(steps):
            res = self.env.step(self.greedy(obs))
            total += res.reward.to(total.dtype) * running
            running &= ~(res.terminated | res.truncated)
            obs = res.obs
        if steps:
            self.obs.copy_(obs)

    def _chunk(self) -> None:
        """One chunk: a replay of the graph; else eagerly, the first on CUDA being followed by the capture."""
        if self.graph is None and self.use_graph and self.eager_chunks > 0:
            self.capture()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._steps(self.chunk)
            self.eager_chunks += 1

    def capture(self) -> float:
        """Capture one chunk (`chunk` steps) into a CUDA graph, with the env's generator registered
        (`env.generator`, where it has one); returns (and keeps in capture_s) its seconds. Nothing runs during the
        capture (the state is left as it was). Capture mode "thread_local": another thread's CUDA calls (a
        background checkpoint write) do not break it. Raises RuntimeError when `use_graph` is off or before one
        eager chunk in this process (it compiles the kernels and allocates the buffers the graph keeps)."""
        if not self.use_graph:
            raise RuntimeError("GreedyEvaluator.capture: this evaluator does not capture (device path on CUDA only)")
        if self.eager_chunks == 0:
            raise RuntimeError("GreedyEvaluator.capture: run one eager chunk first (it compiles the kernels)")
        self.on_phase("capture")
        start = time.perf_counter()
        with phase_range("capture"), torch.cuda.device(self.env.device):
            torch.cuda.synchronize(self.env.device)  # once, at capture time (torch.cuda.graph syncs too)
            graph = torch.cuda.CUDAGraph()
            generator = getattr(self.env, "generator", None)
            if generator is not None:
                graph.register_generator_state(generator)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._steps(self.chunk)
        self.graph = graph
        self.capture_s = time.perf_counter() - start
        self.on_phase("evaluate")
        return self.capture_s

    @torch.no_grad()
    def returns(self, seed: int, max_steps: int = 10_000) -> torch.Tensor:
        """Each copy's first-episode return for the episodes of reset seed `seed`, at most `max_steps` steps: (N,)
        float64 on env.device, no host read on the device and fused paths (there: the live `total` buffer,
        overwritten by the next evaluation: clone it to keep it). The reference path is `evaluate_reference`'s.
        Raises ValueError for a seed that is not an int or max_steps not an int >= 0; RuntimeError from `capture`."""
        _check_call(seed, max_steps)
        if self.fused:  # the reset's states, then one launch runs every first episode to its end
            steps = min(max_steps, self.horizon)
            return greedy_eval(self.net, self.flat[1], self.env.reset(seed=seed), steps, self.total, self.scratch)
        if not self.device_path:
            return evaluate_reference(self.env, self.greedy, seed, max_steps)
        self.obs.copy_(self.env.reset(seed=seed))
        self.total.zero_()
        self.running.fill_(True)
        full, rest = chunk_plan(min(max_steps, self.horizon), self.horizon, self.chunk)
        for _ in range(full):
            self._chunk()
        self._steps(rest)  # only when max_steps cut the time limit short: eager single steps
        return self.total

    def evaluate(self, seed: int, max_steps: int = 10_000) -> float:
        """The mean of `returns(seed, max_steps)` as a host float: the evaluation's one host read (`.item()`) on the
        device path. Records last_s and times_s. Raises as `returns`."""
        start = time.perf_counter()
        value = self.returns(seed, max_steps).mean().item()
        self.last_s = time.perf_counter() - start
        self.times_s.append(self.last_s)
        return value


def build_evaluator(
    cfg: Config,
    greedy: Greedy,
    device: torch.device,
    on_phase: Callable[[str], None] | None = None,
    flat: FlatNet | None = None,
) -> GreedyEvaluator | None:
    """The trainer's evaluator: `cfg.eval_episodes` copies of `cfg.env` on `device`, built with seed cfg.seed + 1 and
    the config's env shape (hotloop.trainer.envs.make_env), evaluated with `greedy`, through the fused kernel where
    `flat` (the hotloop learner's net) and the env allow it on CUDA (GreedyEvaluator's default paths); None when
    cfg.eval_episodes is 0. Raises ValueError from make_env."""
    if not cfg.eval_episodes:
        return None
    env = make_env(cfg.env, cfg.eval_episodes, device, cfg.seed + 1, **cfg.env_shape())
    return GreedyEvaluator(env, greedy, on_phase=on_phase, flat=flat)
