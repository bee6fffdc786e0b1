"""Proportional prioritized experience replay on one device (reference implementation).

Source: Schaul, Quan, Antonoglou & Silver, "Prioritized Experience Replay", ICLR 2016 (arXiv:1511.05952):
item i is sampled with P(i) = p_i^alpha / sum_k p_k^alpha, p_i = |delta_i| + eps (proportional variant, Sec. 3.3),
new items get the maximum priority so far (Algorithm 1), and the sampling bias is corrected by importance weights
w_i = (N * P(i))^-beta normalized by the maximum weight (Sec. 3.4). Sampling is stratified (App. B.2.1): the total
mass is split into B equal segments and one mass is drawn uniformly from each.

Transitions live in preallocated ring-buffer tensors and the priorities in a `SumTree`; add, sample and
update_priorities are fixed-shape tensor ops with no host syncs. Only the write position and the fill count are
host-side Python ints (bookkeeping of what was added, never read from the device).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from hotloop.kernels._common import check_torch_input
from hotloop.kernels.sum_tree import SumTree, _load_tensors, importance_weights, positive_min, stratified_indices


class PrioritizedBatch(NamedTuple):
    """A sampled batch; every tensor is on the replay's device and B = batch_size.

    Fields:
        obs: (B, obs_dim) `obs_dtype`, the observations s.
        action: (B, num_branches) int64, the actions taken in s.
        reward: (B,) float32, the rewards.
        next_obs: (B, obs_dim) `obs_dtype`, the observations s' the actions led to.
        terminated: (B,) float32, 1.0 where s' is terminal (no bootstrapping), else 0.0.
        indices: (B,) int64 buffer slots of the samples; pass them to `update_priorities`.
        weights: (B,) float32 importance-sampling weights in (0, 1] (see `PrioritizedReplay.sample`).
    """

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    indices: torch.Tensor
    weights: torch.Tensor


def _check_int(name: str, value: object, minimum: int) -> None:
    """Raise ValueError naming `name` unless `value` is an int (not bool) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


class PrioritizedReplay:
    """Ring buffer of transitions with proportional prioritized sampling (Schaul et al. 2016).

    Args:
        capacity: number of transitions kept (int >= 1); once full, the oldest are overwritten.
        obs_dim: length of one flat observation (int >= 1).
        num_branches: action columns per transition (int >= 1).
        alpha: priority exponent (float >= 0); 0 gives uniform sampling.
        eps: added to |TD error| so every priority is > 0 (float > 0). A priority that still underflows float32
            (eps^alpha < 2^-126, e.g. eps=1e-30, alpha=2 with a zero TD error) is written as the tree's floor
            PRIORITY_FLOOR = 2^-126 (hotloop.kernels.sum_tree), never as 0; Config validation refuses such
            per_eps / per_alpha.
        device: where storage, tree and every returned tensor live.
        obs_dtype: dtype of stored observations (obs and next_obs passed to `add` must have it).
        generator: torch.Generator on `device` for the sampling uniforms; None uses the global generator.
        use_kernels: run the tree's update, insert and sampling as the Triton kernels of kernels/segment_tree.py
            (one or two launches each instead of one per tree level). None (default): on CUDA devices only.
            Same sampling rule and weights; with duplicate indices in one update the leaf gets one of their
            values (not necessarily the last).

    Priority space: the tree's leaves and `max_priority` hold p^alpha = (|delta| + eps)^alpha, i.e. the values
    that are proportional to the sampling probability, floored at 2^-126 (the zero-priority rule of
    hotloop.kernels.sum_tree, the same on both paths: no written leaf is 0, weights are finite and in (0, 1]).
    `max_priority` (0-dim float32, starts at 1.0, only grows, device-side) is the largest such value written so
    far; new transitions get it as their leaf.

    Attributes:
        tree: the `SumTree` of priorities (float32); its sanitize rule applies (NaN/inf/negative -> max_priority).
        obs, action, reward, next_obs, terminated: the (capacity, ...) storage tensors.
        pos: next slot to write (host int). size: number of filled slots (host int), also `len(buffer)`.
        pos_t: the same write position as a 0-dim int64 device tensor, which `write` reads and advances, so that a
            CUDA graph replaying `write` keeps adding at the right slots (`pos` and `size` are then advanced on the
            host by `note_added`).

    Raises:
        ValueError: a bad capacity, obs_dim, num_branches, alpha (< 0 or not finite), eps (<= 0 or not finite),
            obs_dtype, or a generator on another device.
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        num_branches: int,
        alpha: float = 0.6,
        eps: float = 1e-6,
        device: torch.device | str = "cpu",
        obs_dtype: torch.dtype = torch.float32,
        generator: torch.Generator | None = None,
        use_kernels: bool | None = None,
    ) -> None:
        _check_int("capacity", capacity, 1)
        _check_int("obs_dim", obs_dim, 1)
        _check_int("num_branches", num_branches, 1)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be a finite float >= 0, got {alpha!r}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"eps must be a finite float > 0, got {eps!r}")
        if not isinstance(obs_dtype, torch.dtype):
            raise ValueError(f"obs_dtype must be a torch.dtype, got {obs_dtype!r}")
        self.tree = SumTree(capacity, device)
        self.device = self.tree.device
        if generator is not None and (
            generator.device.type != self.device.type
            or generator.device.index not in (None, self.device.index)  # Generator(device="cuda") has no index
        ):
            raise ValueError(f"generator is on {generator.device}, expected {self.device}")
        self.capacity, self.obs_dim, self.num_branches = capacity, obs_dim, num_branches
        self.alpha, self.eps = float(alpha), float(eps)
        self.obs_dtype, self.generator = obs_dtype, generator
        self.obs = torch.zeros(capacity, obs_dim, dtype=obs_dtype, device=self.device)
        self.action = torch.zeros(capacity, num_branches, dtype=torch.int64, device=self.device)
        self.reward = torch.zeros(capacity, dtype=torch.float32, device=self.device)
        self.next_obs = torch.zeros(capacity, obs_dim, dtype=obs_dtype, device=self.device)
        self.terminated = torch.zeros(capacity, dtype=torch.float32, device=self.device)
        self.pos = 0
        self.size = 0
        self.pos_t = torch.zeros((), dtype=torch.int64, device=self.device)
        self._aranges: dict[int, torch.Tensor] = {}  # kept for good: a captured graph reads them by address
        self.use_kernels = self.device.type == "cuda" if use_kernels is None else bool(use_kernels)
        if self.use_kernels:
            from hotloop.kernels import segment_tree

            self._kernels = segment_tree

    @property
    def max_priority(self) -> torch.Tensor:
        """0-dim float32 on the device: the largest p^alpha written so far (starts at 1.0)."""
        return self.tree.max_value

    @property
    def bad_priority_count(self) -> torch.Tensor:
        """0-dim int64 on the device: how many NaN/inf/negative priorities the tree has sanitized."""
        return self.tree.bad_priority_count

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
    ) -> None:
        """Append N transitions at the ring position (wrapping); each gets leaf priority `max_priority`.

        Writing is as if the N transitions were added one by one: if N > capacity only the last `capacity`
        remain, and `pos` advances by N (mod capacity).

        Args:
            obs, next_obs: (N, obs_dim) `obs_dtype`.
            action: (N, num_branches) integer, or (N,) integer when num_branches == 1; stored as int64.
            reward: (N,) floating; stored as float32.
            terminated: (N,) bool or floating, true / 1.0 where s' is terminal; stored as float32.
            All on the replay's device.

        Raises:
            ValueError: naming the argument, for a wrong type, dtype, shape or device.
        """
        n = self.write(obs, action, reward, next_obs, terminated)
        self.note_added(n)

    def write(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
    ) -> int:
        """The device half of `add` (same arguments and checks): store the N transitions at the slots that follow
        the device-side position `pos_t`, give them the max priority, and advance `pos_t`. Reads no device value on
        the host and changes no host state, so a CUDA graph can capture it; call `note_added(N)` after each run
        (or graph replay). Returns N."""
        check_torch_input("obs", obs, device=self.device, dtype=self.obs_dtype, shape=(None, self.obs_dim))
        n = obs.shape[0]
        if isinstance(action, torch.Tensor) and action.ndim == 1 and self.num_branches == 1:
            action = action.unsqueeze(1)
        check_torch_input("action", action, device=self.device, kind="int", shape=(n, self.num_branches))
        check_torch_input("reward", reward, device=self.device, kind="float", shape=(n,))
        check_torch_input("next_obs", next_obs, device=self.device, dtype=self.obs_dtype, shape=(n, self.obs_dim))
        check_torch_input("terminated", terminated, device=self.device, shape=(n,))
        if not (terminated.dtype == torch.bool or terminated.dtype.is_floating_point):
            raise ValueError(f"terminated must be bool or floating, got {terminated.dtype}")
        if n == 0:
            return 0
        kept = min(n, self.capacity)
        start = n - kept
        if kept not in self._aranges:  # allocated on the first write of each size (an eager one, before a capture)
            self._aranges[kept] = torch.arange(kept, device=self.device)
        slots = (self.pos_t + start + self._aranges[kept]) % self.capacity
        self.obs.index_copy_(0, slots, obs[start:])
        self.action.index_copy_(0, slots, action[start:].to(torch.int64))
        self.reward.index_copy_(0, slots, reward[start:].to(torch.float32))
        self.next_obs.index_copy_(0, slots, next_obs[start:])
        self.terminated.index_copy_(0, slots, terminated[start:].to(torch.float32))
        if self.use_kernels:
            self._kernels.tree_insert(self.tree.nodes, self.pos_t, n, self.capacity, self.tree.max_value)
        else:
            self.tree.update(slots, self.tree.max_value.expand(kept))
        self.pos_t.add_(n).remainder_(self.capacity)
        return n

    def note_added(self, n: int) -> None:
        """The host half of `add`: advance `pos` and `size` by n transitions (`write` advanced `pos_t`).
        Raises ValueError for n not an int >= 0."""
        _check_int("n", n, 0)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, beta: float, weight_norm: str = "batch") -> PrioritizedBatch:
        """Draw a stratified prioritized batch with importance weights.

        Segment k in [0, B) of the total mass T gets one uniform u_k from `generator`: mass_k = (k + u_k) * T / B,
        and the sample is the leaf whose prefix-sum interval contains mass_k, so P(i) = p_i / T.

        Importance weights (Schaul et al. Sec. 3.4): w_i = (N * P(i))^-beta / max_j w_j with N = len(self),
        computed as the equal (p_min / p_i)^beta, where p_min is the smallest p_j > 0 over
          - weight_norm="batch" (default, as in Schaul et al. Algorithm 1 and most implementations): the batch;
          - weight_norm="global": all N stored items (one O(capacity) min reduction per call), so w_max is the
            weight of the least likely item in the buffer and weights are comparable across batches.
        Zero priorities (hotloop.kernels.sum_tree's rule, both paths): p_min ignores zero leaves (+inf if all are
        0), weights are clamped into [2^-126, 1] (a zero leaf's is 1), and a tree with no mass (root not > 0)
        samples uniformly over the N filled slots with all weights 1; so every weight is finite and in (0, 1].

        Args:
            batch_size: B, int >= 1.
            beta: importance-sampling exponent in [0, 1] (0: all weights 1; 1: full correction).
            weight_norm: "batch" or "global".

        Returns:
            A `PrioritizedBatch` of B transitions (with replacement) on the replay's device.

        Raises:
            ValueError: the buffer is empty, batch_size < 1, beta outside [0, 1], or an unknown weight_norm.
        """
        _check_int("batch_size", batch_size, 1)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be a float in [0, 1], got {beta!r}")
        if weight_norm not in ("batch", "global"):
            raise ValueError(f"weight_norm must be 'batch' or 'global', got {weight_norm!r}")
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer (add transitions first)")
        dtype = self.tree.dtype
        u = torch.rand(batch_size, generator=self.generator, device=self.device, dtype=dtype)
        if self.use_kernels:
            idx = torch.empty(batch_size, dtype=torch.int64, device=self.device)
            weights = torch.empty(batch_size, dtype=torch.float32, device=self.device)
            beta_t = torch.full((), float(beta), dtype=torch.float32, device=self.device)
            self._kernels.tree_sample(
                self.tree.nodes, self.capacity, self.size, batch_size, u, beta_t, idx, weights, weight_norm
            )
            stored = (self.obs, self.action, self.reward, self.next_obs, self.terminated)
            return PrioritizedBatch(*(t[idx] for t in stored), indices=idx, weights=weights)
        idx = stratified_indices(self.tree, u, self.size)
        p = self.tree.leaves()[idx]
        p_min = positive_min(p if weight_norm == "batch" else self.tree.leaves()[: self.size])
        weights = importance_weights(p, p_min, beta)
        stored = (self.obs, self.action, self.reward, self.next_obs, self.terminated)
        return PrioritizedBatch(*(t[idx] for t in stored), indices=idx, weights=weights)

    def update_priorities(self, indices: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set the priorities of sampled slots to p = max((|td_error| + eps)^alpha, 2^-126); raise max_priority to
        max(p).

        Args:
            indices: (B,) int64 slots from `PrioritizedBatch.indices` (must be filled slots; not checked, as that
                would need a host sync). With duplicates, the last occurrence wins.
            td_errors: (B,) floating TD errors on the replay's device. A NaN/inf one is sanitized by the tree
                (stored as max_priority, counted in `bad_priority_count`). A priority below 2^-126 (one that
                underflowed float32) is stored as 2^-126 (the tree's floor), never as 0.

        Raises:
            ValueError: naming the argument, for a wrong type, dtype, shape or device.
        """
        check_torch_input("indices", indices, device=self.device, dtype=torch.int64, ndim=1)
        check_torch_input("td_errors", td_errors, device=self.device, kind="float", shape=(indices.shape[0],))
        priorities = (td_errors.to(self.tree.dtype).abs() + self.eps).pow(self.alpha)
        if self.use_kernels:
            self._kernels.tree_update(
                self.tree.nodes,
                indices,
                priorities.contiguous(),
                self.capacity,
                self.tree.max_value,
                self.tree.bad_priority_count,
            )
        else:
            self.tree.update(indices, priorities)

    def state_dict(self) -> dict[str, torch.Tensor | int | float]:
        """Plain tensors (the live storage, not copies) and numbers: storage, tree state, pos, size, alpha, eps.

        The generator is not included; its owner checkpoints it.
        """
        state: dict[str, torch.Tensor | int | float] = {
            name: getattr(self, name) for name in ("obs", "action", "reward", "next_obs", "terminated")
        }
        state.update({f"tree.{key}": value for key, value in self.tree.state_dict().items()})
        state.update(pos=self.pos, size=self.size, alpha=self.alpha, eps=self.eps)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor | int | float]) -> None:
        """Load a `state_dict` (tensors from any device) into this buffer of the same shapes, alpha and eps.

        Raises:
            ValueError: a missing key, a tensor of the wrong shape or dtype, pos/size out of range, or a
                different alpha/eps. Nothing is changed when it raises.
        """
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        if missing:
            raise ValueError(f"state is missing {missing}")
        for key in ("alpha", "eps"):
            if state[key] != own[key]:
                raise ValueError(f"state[{key!r}] = {state[key]!r} differs from this buffer's {own[key]!r}")
        for key, bound in (("pos", self.capacity - 1), ("size", self.capacity)):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bound:
                raise ValueError(f"state[{key!r}] must be an int in [0, {bound}], got {value!r}")
        _load_tensors({key: value for key, value in own.items() if isinstance(value, torch.Tensor)}, state)
        self.pos, self.size = state["pos"], state["size"]
        self.pos_t.fill_(self.pos)
