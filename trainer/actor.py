"""The hotloop trainer's actor: one vectorized env step (epsilon-greedy acting with the flat online net, env step,
replay insertion, episode returns) as device work with fixed addresses, captured in a CUDA graph on CUDA.

Everything the step needs from one step to the next lives on the device: the observation buffer (the trainer's
`obs`, updated in place), a step counter `t` (vector env steps taken), the replay's write position
(`PrioritizedReplay.pos_t`) and the env's state (updated in place by `step(actions, uniforms)`). The random numbers
are counter-based: one `hotloop.kernels.replay_batch.batch_uniforms` launch draws Philox uniforms keyed by (seed + t, i)
and writes epsilon(t) = eps_start + (eps_end - eps_start) * min(1, t / decay) (Mnih et al. 2015's linear decay, in
vector steps), so eager runs and graph replays draw the same numbers and nothing is read on the host. Per env:
column 0 decides exploration (u < epsilon), columns 1..D pick each branch's random action (floor(u * n_d)), the rest
go to the env (its `step_uniforms`: CartPole's reset states, the synthetic env's noise). The host keeps its own
counters (env steps, the replay's pos and size) in step, by the same arithmetic.

Two implementations of one step, the same arithmetic:
- the fused step (`fused`: CartPole in float32 and the synthetic env, N <= the replay's capacity): three launches,
  `hotloop.kernels.actor_step.actor_step` (uniforms, epsilon, the net's greedy actions, epsilon-greedy, the env with
  autoreset, the replay's storage, the returns), the sum tree's insert, and `actor_commit` (the episode ring and the
  counters) -- no single-block kernel, no host read;
- `reference_step`: the same step in stock torch ops (one `batch_uniforms` launch, the learner's forward kernels,
  the env's own `step`, `PrioritizedReplay.write`, `EpisodeReturns.update`): the plain-torch reference the fused
  kernels are tested against (tests/kernels/test_actor_step.py), and the step for every other env.
Both act with `acting_weights`: the learner's TF32-rounded snapshot of its parameters (`HotLearner.nets_tf32[0]`,
refreshed at the start of every learner step and when it is built or loaded), the weights its last forward read.
"""

from __future__ import annotations

import math
import time

import torch

from hotloop.kernels.acting import ActingNet
from hotloop.kernels.actor_step import ENV_CARTPOLE, ENV_SYNTHETIC, ActorBuffers, actor_commit, actor_step
from hotloop.kernels.replay_batch import batch_uniforms
from hotloop.kernels.segment_tree import tree_insert
from hotloop.trainer.envs import CartPoleVec, SyntheticBatchEnv, VecEnv
from hotloop.trainer.episodes import EpisodeReturns
from hotloop.trainer.learner import epsilon_greedy_from
from hotloop.trainer.replay import PrioritizedReplay
from hotloop.trainer.step import HotLearner

ACTOR_SEED_OFFSET = 1 << 40
"""Added to cfg.seed for the actor's Philox key, so that its stream never meets the learner's (seed + step)."""


def capturable(env: VecEnv) -> bool:
    """True when `env` takes its per-step randomness as uniforms (`step_uniforms` and `step(actions, uniforms)`),
    which the actor needs (CartPoleVec, SyntheticBatchEnv; not the Gymnasium adapter)."""
    return isinstance(getattr(env, "step_uniforms", None), int)


class DeviceActor:
    """One vectorized env step of the hotloop trainer as capturable device work; `step()` replays its CUDA graph.

    Args:
        learner: the HotLearner whose online net (`learner.acting` over `learner.params`) picks the greedy actions.
        env: a capturable VecEnv (`capturable(env)`), already reset; N = env.num_envs.
        replay: the PrioritizedReplay the transitions go to (`write` at its device position).
        returns: the trainer's EpisodeReturns.
        obs: (N, obs_dim) float32 on the device, the observation to act on; read and overwritten in place.
        seed: the run's seed (the Philox key is seed + ACTOR_SEED_OFFSET + t).
        eps_start, eps_end: epsilon at t = 0 and after the decay; eps_decay_steps: the decay's length in vector
            steps (float >= 0; 0: epsilon is eps_end from the start).
    Attributes: t (0-dim int64, vector steps taken), epsilon (0-dim float32, the value the last step used),
        uniforms (N, 1 + D + env.step_uniforms) float32, graph (CUDAGraph or None), capture_s (seconds, nan before),
        eager_steps (host count of steps run without the graph: `capture` needs one first, to compile the kernels),
        acting_weights ((P,) float32, the learner's `nets_tf32[0]`), fused (the fused step's `ActorBuffers`, or None
        where `reference_step` runs), net (the `ActingNet` offsets, with the fused step), tiles (the fused main
        launch's (BLOCK_N, BLOCK_R, BLOCK_K, num_warps), None for `actor_step`'s defaults).
    Raises ValueError for an env that is not capturable, an obs buffer of the wrong shape, dtype or device, a seed
    that is not an int >= 0, or eps_decay_steps not a finite number >= 0.
    """

    def __init__(
        self,
        learner: HotLearner,
        env: VecEnv,
        replay: PrioritizedReplay,
        returns: EpisodeReturns,
        obs: torch.Tensor,
        seed: int,
        eps_start: float,
        eps_end: float,
        eps_decay_steps: float,
    ) -> None:
        if not capturable(env):
            raise ValueError(
                f"{type(env).__name__} is not capturable: it draws its own random numbers (no `step_uniforms`)"
            )
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if not isinstance(eps_decay_steps, (int, float)) or not (
            math.isfinite(eps_decay_steps) and eps_decay_steps >= 0
        ):
            raise ValueError(f"eps_decay_steps must be a finite number >= 0, got {eps_decay_steps!r}")
        n, device = env.num_envs, learner.device
        if tuple(obs.shape) != (n, env.obs_dim) or obs.dtype != torch.float32 or obs.device != replay.device:
            raise ValueError(
                f"obs must be ({n}, {env.obs_dim}) float32 on {replay.device}, got "
                f"{tuple(obs.shape)} {obs.dtype} on {obs.device}"
            )
        self.learner, self.env, self.replay, self.returns, self.obs = learner, env, replay, returns, obs
        self.seed = seed + ACTOR_SEED_OFFSET
        self.eps_start, self.eps_end = (eps_start, eps_end) if eps_decay_steps > 0 else (eps_end, eps_end)
        self.eps_decay_steps = max(float(eps_decay_steps), 1.0)
        self.branches = len(env.action_nvec)
        self.t = torch.zeros((), dtype=torch.int64, device=device)
        self.epsilon = torch.zeros((), device=device)
        self.uniforms = torch.empty(n, 1 + self.branches + env.step_uniforms, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_s = float("nan")
        self.eager_steps = 0
        self.acting_weights = learner.nets_tf32[0]
        self.tiles: tuple[int, int, int, int] | None = None  # the main launch's tiles (None: its defaults)
        self.fused = self._fused_buffers()

    def _fused_buffers(self) -> ActorBuffers | None:
        """The fused step's buffers when it can run this env (CartPole in float32, the synthetic env; N <= the
        replay's capacity), else None (`reference_step` then runs)."""
        env, rp, n = self.env, self.replay, self.env.num_envs
        if n > rp.capacity or rp.obs_dtype != torch.float32:
            return None
        if isinstance(env, CartPoleVec) and env.dtype == torch.float32:
            self._env_kind, self._time_limit, state = ENV_CARTPOLE, env.max_episode_steps, env.state
            start = env_a = env_b = env_c = self.obs
        elif isinstance(env, SyntheticBatchEnv):
            self._env_kind, self._time_limit, state = ENV_SYNTHETIC, env.episode_length, env._obs
            start, env_a, env_b, env_c = env._start, env._A, env._B, env._C
        else:
            return None
        self.net = ActingNet.from_layout(self.learner.layout, self.obs.device)
        dev = self.obs.device
        return ActorBuffers(
            t=self.t,
            pos=rp.pos_t,
            epsilon=self.epsilon,
            obs=self.obs,
            state=state,
            elapsed=env.elapsed_steps,
            start=start,
            env_a=env_a,
            env_b=env_b,
            env_c=env_c,
            replay_obs=rp.obs,
            replay_action=rp.action,
            replay_reward=rp.reward,
            replay_next_obs=rp.next_obs,
            replay_terminated=rp.terminated,
            running=self.returns.running,
            ended=torch.empty(n, dtype=torch.float64, device=dev),
            done=torch.empty(n, dtype=torch.int32, device=dev),
            ring=self.returns.ring,
            finished=self.returns.finished,
            ticket=torch.zeros((), dtype=torch.int32, device=dev),
            scratch=torch.empty(2, n, self.net.max_width, device=dev),
        )

    @torch.no_grad()
    def _body(self) -> None:
        if self.fused is None:
            self.reference_step()
            return
        self.launch_main()
        self.launch_tail()

    @torch.no_grad()
    def launch_main(self) -> None:
        """The fused step's main launch (`actor_step`: acting, env, replay storage, returns); it reads t and pos.
        With `launch_tail` after it, one step. RuntimeError without the fused step."""
        if self.fused is None:
            raise RuntimeError("DeviceActor.launch_main: this env runs the reference step (no fused step)")
        actor_step(
            self.net,
            self.acting_weights,
            self.fused,
            self.seed,
            self.eps_start,
            self.eps_end,
            self.eps_decay_steps,
            self._env_kind,
            self._time_limit,
            self.tiles,
        )

    @torch.no_grad()
    def launch_tail(self) -> None:
        """The fused step's last two launches: the sum tree's insert of the N new leaves at max priority, and the
        commit (episode ring, counters advanced). RuntimeError without the fused step."""
        if self.fused is None:
            raise RuntimeError("DeviceActor.launch_tail: this env runs the reference step (no fused step)")
        tree_insert(
            self.replay.tree.nodes,
            self.replay.pos_t,
            self.env.num_envs,
            self.replay.capacity,
            self.replay.tree.max_value,
        )
        actor_commit(self.fused)

    @torch.no_grad()
    def reference_step(self) -> None:
        """One step in stock torch ops (the plain-torch reference of the fused step, and the step of every env the
        fused kernels do not simulate): device work only, host counters untouched (`step` advances those)."""
        batch_uniforms(
            self.t, self.uniforms.view(-1), self.epsilon, self.seed, self.eps_start, self.eps_end, self.eps_decay_steps
        )
        d = self.branches
        actions = epsilon_greedy_from(
            self.learner.acting.greedy(self.acting_weights, self.obs),
            self.learner.action_nvec,
            self.epsilon,
            self.uniforms[:, :1],
            self.uniforms[:, 1 : 1 + d],
        )
        res = self.env.step(actions, self.uniforms[:, 1 + d :])
        self.replay.write(self.obs, actions, res.reward, res.final_obs, res.terminated)
        self.returns.update(res.reward, res.terminated | res.truncated)
        self.obs.copy_(res.obs)
        self.t.add_(1)

    def uniforms_at(self, t: int) -> torch.Tensor:
        """The uniform table (N, 1 + D + env.step_uniforms) float32 the step at counter `t` draws (both
        implementations: Philox keyed by (seed + t, i)), written into `uniforms` and returned; for tests and
        inspection (one launch, no host read). Raises ValueError for t not an int >= 0."""
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"t must be an int >= 0, got {t!r}")
        counter = torch.full((), t, dtype=torch.int64, device=self.t.device)
        batch_uniforms(
            counter,
            self.uniforms.view(-1),
            torch.empty((), device=self.t.device),
            self.seed,
            self.eps_start,
            self.eps_end,
            self.eps_decay_steps,
        )
        return self.uniforms

    def capture(self) -> float:
        """Capture one step into a CUDA graph; returns (and keeps in capture_s) its seconds. Nothing runs during the
        capture. Raises RuntimeError off CUDA, or before one eager `step` in this process (it compiles the kernels
        and allocates the buffers the graph keeps; a kernel compiled during a capture would break it)."""
        if self.eager_steps == 0:
            raise RuntimeError("DeviceActor.capture: run one eager step() first (it compiles the kernels)")
        if self.obs.device.type != "cuda":
            raise RuntimeError("DeviceActor.capture needs a CUDA device")
        start = time.perf_counter()
        torch.cuda.synchronize(self.obs.device)  # once, at capture time (outside the hot loop)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body()
        self.graph = graph
        self.capture_s = time.perf_counter() - start
        return self.capture_s

    def step(self) -> int:
        """One vectorized env step: the graph's replay once `capture` ran, else the same work launched eagerly.
        Advances the replay's host counters (`note_added`); returns the transitions added (N)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
            self.eager_steps += 1
        return self.note_step()

    def note_step(self) -> int:
        """The host half of one step, whoever launched its device work (`step`, or the learner's step with the actor
        attached, HotLearner.attach_actor): the replay's host counters advance by N (`note_added`); returns N."""
        n = self.env.num_envs
        self.replay.note_added(n)
        return n
