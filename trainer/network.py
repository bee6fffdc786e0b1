"""Dueling Q-network with action branches and spectral norm on every weight matrix (reference version).

Architecture (Wang et al. 2016, "Dueling Network Architectures"; Tavakoli et al. 2018, "Action Branching
Architectures for Deep RL", BDQ): a shared ReLU trunk, a value head V(s), and one advantage branch A_d(s, .) per
action dimension d, each head an MLP with one hidden layer. Branch d's Q-values are
Q_d(s, a) = V(s) + A_d(s, a) - mean_a' A_d(s, a'). A Discrete action space is one branch.

Every weight matrix is spectral-normalized (Miyato et al. 2018) with torch's parametrization and, when
`learned_gain` is set, multiplied by a learned scalar gain (sigma-reparam, Zhai et al. 2023), so that the network
can still represent Q-values of the size DQN needs while each matrix's direction stays normalized.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm as _spectral_norm


class ScaledLinear(nn.Linear):
    """`nn.Linear` whose (spectral-normalized) weight is multiplied by a learned scalar `gain` (init `gain_init`).

    Shapes as nn.Linear: input (..., in_features) float32 -> output (..., out_features).
    """

    def __init__(self, in_features: int, out_features: int, gain_init: float) -> None:
        super().__init__(in_features, out_features)
        self.gain = nn.Parameter(torch.tensor(float(gain_init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight * self.gain, self.bias)


def _linear(n_in: int, n_out: int, spectral_norm: bool, power_iterations: int) -> nn.Linear:
    if not spectral_norm:
        return nn.Linear(n_in, n_out)
    # The gain starts at 1 (the normalized matrix itself); Adam learns it with the other parameters.
    layer = ScaledLinear(n_in, n_out, gain_init=1.0)
    return _spectral_norm(layer, n_power_iterations=power_iterations)


class BranchingDuelingQNet(nn.Module):
    """Q(s, .) for every action branch.

    Args:
        obs_dim: observation length.
        action_nvec: size of each action branch, e.g. (2,) for CartPole.
        trunk_hidden: widths of the trunk's hidden layers.
        head_hidden: hidden width of the value head and of each advantage branch.
        spectral_norm: spectral-normalize every weight matrix (with a learned gain each).
        power_iterations: power-iteration steps per training forward of each spectral norm estimate.

    Weight matrices: len(trunk_hidden) + 2 + 2 * len(action_nvec).
    Raises ValueError for empty or non-positive sizes.
    """

    def __init__(
        self,
        obs_dim: int,
        action_nvec: tuple[int, ...],
        trunk_hidden: tuple[int, ...],
        head_hidden: int,
        spectral_norm: bool = True,
        power_iterations: int = 1,
    ) -> None:
        super().__init__()
        if obs_dim < 1 or not action_nvec or min(action_nvec) < 1 or not trunk_hidden or min(trunk_hidden) < 1:
            raise ValueError(
                f"BranchingDuelingQNet: bad sizes obs_dim={obs_dim}, action_nvec={action_nvec}, "
                f"trunk_hidden={trunk_hidden}"
            )
        self.action_nvec = tuple(action_nvec)

        def lin(n_in: int, n_out: int) -> nn.Linear:
            return _linear(n_in, n_out, spectral_norm, power_iterations)

        widths = (obs_dim, *trunk_hidden)
        self.trunk = nn.Sequential(*[m for a, b in zip(widths, widths[1:]) for m in (lin(a, b), nn.ReLU())])
        feat = widths[-1]
        self.value = nn.Sequential(lin(feat, head_hidden), nn.ReLU(), lin(head_hidden, 1))
        self.branch_hidden = nn.ModuleList(nn.Sequential(lin(feat, head_hidden), nn.ReLU()) for _ in action_nvec)
        self.branch_out = nn.ModuleList(lin(head_hidden, n) for n in action_nvec)

    def forward_with_features(self, obs: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """obs (B, obs_dim) float32 -> ([Q_d (B, n_d) for each branch], [branch hidden features (B, head_hidden)])."""
        h = self.trunk(obs)
        v = self.value(h)
        feats = [hid(h) for hid in self.branch_hidden]
        qs = []
        for f, out in zip(feats, self.branch_out):
            adv = out(f)
            qs.append(v + adv - adv.mean(dim=1, keepdim=True))
        return qs, feats

    def forward(self, obs: torch.Tensor) -> list[torch.Tensor]:
        """obs (B, obs_dim) float32 -> list of Q_d (B, n_d) float32, one per action branch."""
        return self.forward_with_features(obs)[0]

    def weight_matrices(self) -> list[torch.Tensor]:
        """The effective (normalized, gained) weight matrices, trunk first; for inspection and tests."""
        mats = []
        for m in self.modules():
            if isinstance(m, nn.Linear):
                w = m.weight
                mats.append(w * m.gain if isinstance(m, ScaledLinear) else w)
        return mats
