"""The learner's loss terms, each a plain-torch function of tensors (the reference the fused kernels match).

Shapes: B = batch size, D = number of action branches, n_d = size of branch d.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


def double_dqn_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    next_q_online: list[torch.Tensor],
    next_q_target: list[torch.Tensor],
    target_max: float = 0.0,
) -> torch.Tensor:
    """Double DQN target with the branching "mean" operator, optionally clipped from above.

    y = min(r + gamma * (1 - terminated) * mean_d Q_d^target(s', argmax_a Q_d^online(s', a)), target_max)

    (van Hasselt et al. 2016, "Deep RL with Double Q-learning"; the mean over branches is Tavakoli et al. 2018,
    BDQ; with one branch it is plain Double DQN.) The clip is the bound every discounted return obeys when each
    reward is at most r_max: target_max = r_max / (1 - gamma) (100 for CartPole's reward of 1 per step at gamma
    0.99). Clipping the target to a bound that Q* itself satisfies keeps Q* the fixed point (min(., c) is
    non-expansive) and cuts the overestimation feedback past the bound (H7 of results/cpu/learning_causes/README.md;
    Q-value bounds as in He et al. 2017, "Learning to Play in a Day").

    Args:
        reward: (B,) float32. terminated: (B,) float32 or bool, 1 where s' is terminal (no bootstrap).
        next_q_online / next_q_target: one (B, n_d) tensor per branch, evaluated on s'.
        target_max: the clip, > 0; 0 (the default) = no clip.
    Returns: (B,) float32 targets, detached.
    """
    picks = [qt.gather(1, qo.argmax(dim=1, keepdim=True)).squeeze(1) for qo, qt in zip(next_q_online, next_q_target)]
    bootstrap = torch.stack(picks, dim=1).mean(dim=1)
    y = reward + gamma * (1.0 - terminated.to(reward.dtype)) * bootstrap
    return (y.clamp(max=target_max) if target_max > 0 else y).detach()


def chosen_q(q: list[torch.Tensor], action: torch.Tensor) -> torch.Tensor:
    """Q_d(s, a_d) for each branch: q is one (B, n_d) per branch, action (B, D) int64 -> (B, D)."""
    return torch.stack([qd.gather(1, action[:, d : d + 1]).squeeze(1) for d, qd in enumerate(q)], dim=1)


def td_loss(td: torch.Tensor, weights: torch.Tensor, kind: str = "huber", delta: float = 1.0) -> torch.Tensor:
    """Importance-weighted TD loss: mean_b w_b * mean_d rho(td_bd), rho = Huber(delta) or 0.5 * td^2.

    td: (B, D) TD errors (target - Q); weights: (B,) importance-sampling weights. Returns a 0-dim tensor.
    Raises ValueError for an unknown `kind`.
    """
    zeros = torch.zeros_like(td)
    if kind == "huber":
        per = F.huber_loss(td, zeros, reduction="none", delta=delta)
    elif kind == "mse":
        per = 0.5 * td.square()
    else:
        raise ValueError(f"td_loss: kind must be 'huber' or 'mse', got {kind!r}")
    return (weights * per.mean(dim=1)).mean()


def cql_term(q: list[torch.Tensor], action: torch.Tensor) -> torch.Tensor:
    """Discrete CQL(H) regularizer (Kumar et al. 2020), averaged over branches and batch:
    mean_b mean_d [logsumexp_a Q_d(s_b, a) - Q_d(s_b, a_bd)]. Returns a 0-dim tensor."""
    lse = torch.stack([qd.logsumexp(dim=1) for qd in q], dim=1)
    return (lse - chosen_q(q, action)).mean()


def branch_diversity_term(features: list[torch.Tensor]) -> torch.Tensor:
    """Mean over branch pairs of the squared cosine similarity of their hidden features (hotloop's definition).

    features: one (B, H) tensor per branch. Minimizing it pushes branches toward different features.
    Returns a 0-dim tensor (0 with a single branch).
    """
    if len(features) < 2:
        return features[0].new_zeros(())
    sims = [F.cosine_similarity(a, b, dim=1).square().mean() for a, b in itertools.combinations(features, 2)]
    return torch.stack(sims).mean()
