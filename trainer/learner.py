"""The reference DQN learner: online + target network, Adam, grad clipping, one `update` per learner step.

Correct first: this is the plain-torch version (torch's spectral_norm parametrization, torch.optim.Adam,
clip_grad_norm_) that the optimized hot loop is measured against. `update` returns detached device tensors and
never reads a device value on the host, so it adds no host sync of its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import NamedTuple

import torch

from hotloop.kernels.losses import branch_diversity_term, chosen_q, cql_term, double_dqn_target, td_loss
from hotloop.profiles.ranges import phase_range
from hotloop.trainer.config import Config
from hotloop.trainer.network import BranchingDuelingQNet
from hotloop.trainer.schedules import LinearSchedule


def epsilon_greedy(
    greedy: torch.Tensor, action_nvec: torch.Tensor, epsilon: float, generator: torch.Generator
) -> torch.Tensor:
    """Epsilon-greedy actions (N, D) int64 from the greedy ones `greedy` (N, D) int64: with probability epsilon an
    env takes a uniformly random action in every branch (branch d in [0, action_nvec[d])), else the greedy one.
    action_nvec: (D,) int64 on greedy's device; generator: on that device. No host sync."""
    n, d = greedy.shape
    action_u = torch.rand(n, d, device=greedy.device, generator=generator)
    explore_u = torch.rand(n, 1, device=greedy.device, generator=generator)
    return epsilon_greedy_from(greedy, action_nvec, epsilon, explore_u, action_u)


def epsilon_greedy_from(
    greedy: torch.Tensor,
    action_nvec: torch.Tensor,
    epsilon: float | torch.Tensor,
    explore_u: torch.Tensor,
    action_u: torch.Tensor,
) -> torch.Tensor:
    """`epsilon_greedy` with its uniforms given: env n explores where explore_u[n] < epsilon, taking action
    floor(action_u[n, d] * action_nvec[d]) in branch d, else greedy[n]. greedy (N, D) int64; explore_u (N, 1) and
    action_u (N, D) floats in [0, 1); epsilon a float or a 0-dim device tensor (the actor's, trainer/actor.py).
    Returns (N, D) int64. No host sync."""
    return torch.where(explore_u < epsilon, (action_u * action_nvec).long(), greedy)


class UpdateMetrics(NamedTuple):
    """Detached 0-dim float32 device tensors from one learner step (td_abs is (B,): new priorities' input)."""

    loss: torch.Tensor
    q_mean: torch.Tensor
    grad_norm: torch.Tensor
    cql: torch.Tensor
    diversity: torch.Tensor
    td_abs: torch.Tensor


class DQNLearner:
    """Double DQN with a dueling branching Q-network, importance-weighted TD loss, Adam and grad-norm clipping.

    Args:
        cfg: the run's Config (network sizes, gamma, lr and its linear decay, loss, clip, target update, CQL/diversity
            weights).
        obs_dim: observation length; action_nvec: action-branch sizes; device: where everything lives.
        grad_sync: None (one process), or a function that averages a flat float32 gradient buffer over the ranks in
            place (hotloop.trainer.distributed.GradientAverager): `update` then copies every parameter's gradient
            into one contiguous buffer, calls it once (one all-reduce) and copies the average back, after the
            backward and before grad-norm, clip and Adam (`sync_gradients`).
    """

    def __init__(
        self,
        cfg: Config,
        obs_dim: int,
        action_nvec: tuple[int, ...],
        device: torch.device,
        grad_sync: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.grad_sync = grad_sync
        self.online = BranchingDuelingQNet(
            obs_dim, action_nvec, cfg.trunk_hidden, cfg.head_hidden, cfg.spectral_norm, cfg.sn_power_iterations
        ).to(device)
        self.target = copy.deepcopy(self.online)
        self.target.requires_grad_(False)
        self.target.eval()
        self.optimizer = torch.optim.Adam(
            self.online.parameters(), lr=cfg.lr, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
        self.steps = 0
        self.lr_factor = LinearSchedule(1.0, cfg.lr_end_factor, cfg.total_learner_steps())
        self.action_nvec = torch.tensor(action_nvec, device=device)

    @torch.no_grad()
    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """argmax_a Q_d(obs, a) per branch: (N, D) int64 for obs (N, obs_dim). Runs in eval mode (no
        power-iteration update of the spectral norms)."""
        self.online.eval()
        actions = torch.stack([q.argmax(dim=1) for q in self.online(obs)], dim=1)
        self.online.train()
        return actions

    @torch.no_grad()
    def act(self, obs: torch.Tensor, epsilon: float, generator: torch.Generator) -> torch.Tensor:
        """Epsilon-greedy actions (N, D) int64 for obs (N, obs_dim): with probability epsilon an env takes a
        uniformly random action in every branch, else the greedy one."""
        return epsilon_greedy(self.greedy(obs), self.action_nvec, epsilon, generator)

    def update(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        weights: torch.Tensor,
    ) -> UpdateMetrics:
        """One learner step on a sampled batch; returns detached metrics. Shapes: obs/next_obs (B, obs_dim),
        action (B, D) int64, reward/terminated/weights (B,) float32."""
        cfg = self.cfg
        with phase_range("ddqn_forward"), torch.no_grad():
            next_online = self.online(next_obs)
            next_target = self.target(next_obs)
            y = double_dqn_target(reward, terminated, cfg.gamma, next_online, next_target, cfg.td_target_max)
        with phase_range("forward"):
            q, feats = self.online.forward_with_features(obs)
            q_taken = chosen_q(q, action)
        with phase_range("loss"):
            td = y.unsqueeze(1) - q_taken
            loss = td_loss(td, weights, cfg.loss, cfg.huber_delta)
            cql = cql_term(q, action) if cfg.cql_weight > 0 else loss.new_zeros(())
            div = branch_diversity_term(feats) if cfg.diversity_weight > 0 else loss.new_zeros(())
            total = loss + cfg.cql_weight * cql + cfg.diversity_weight * div
        with phase_range("backward"):
            self.optimizer.zero_grad(set_to_none=True)
            total.backward()
        if self.grad_sync is not None:
            with phase_range("grad_allreduce"):
                self.sync_gradients()
        with phase_range("optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), cfg.max_grad_norm)
            for group in self.optimizer.param_groups:  # FusedAdam's linear decay, keyed by the updates done
                group["lr"] = cfg.lr * self.lr_factor.value(self.steps)
            self.optimizer.step()
            self.steps += 1
            if self.steps % cfg.target_update_interval == 0:
                with phase_range("target_update"):
                    self.update_target()
        return UpdateMetrics(
            loss.detach(),
            q_taken.detach().mean(),
            grad_norm.detach(),
            cql.detach(),
            div.detach(),
            td.detach().abs().mean(dim=1),
        )

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """Average the online net's gradients over the ranks with one `grad_sync` call on one flat buffer (a
        parameter without a gradient counts as zeros, and gets the average); RuntimeError without grad_sync."""
        if self.grad_sync is None:
            raise RuntimeError("sync_gradients: this learner has no grad_sync (a single-process run)")
        params = list(self.online.parameters())
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params])
        self.grad_sync(flat)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p).clone()

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor a rank's learner must share with the others at the start (online and target parameters
        and buffers), for hotloop.trainer.distributed.broadcast_."""
        return [*self.online.parameters(), *self.online.buffers(), *self.target.parameters(), *self.target.buffers()]

    @torch.no_grad()
    def update_target(self) -> None:
        """Hard copy (tau = 1) or Polyak average (tau < 1) of the online parameters into the target network;
        buffers (the spectral norms' power-iteration vectors) are copied."""
        for t, o in zip(self.target.parameters(), self.online.parameters()):
            t.lerp_(o, self.cfg.tau)
        for t, o in zip(self.target.buffers(), self.online.buffers()):
            t.copy_(o)
