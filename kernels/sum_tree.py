"""Array-backed binary sum tree for proportional prioritized replay.

Source: Schaul, Quan, Antonoglou & Silver, "Prioritized Experience Replay", ICLR 2016 (arXiv:1511.05952),
Appendix B.2.1: a sum tree whose leaves hold the priorities p_i, so that sampling and updating are O(log N).

Layout: `SumTree.nodes` holds 2P values, P = the smallest power of two >= capacity. Node 1 is the root, node i
has children 2i and 2i+1, and leaf j (the priority of item j) is node P + j. Leaves [capacity, P) are padding
with weight 0 and node 0 is unused. Every method is a fixed number of vectorized tensor ops (one step per tree
level) on fixed shapes, so it runs on any device and never reads a tensor value back to the host.

Zero priorities (the rule both the reference here and the Triton kernels of kernels/segment_tree.py follow):
- every priority written through `SumTree.update` (and `tree_update` / `tree_insert`) is floored at
  PRIORITY_FLOOR = 2^-126, the smallest normal float32, after the sanitize rule: a 0 (or a value that underflowed,
  e.g. (0 + 1e-30)^2 in float32) is stored as 2^-126, so no written leaf is 0. `floor=0.0` turns the floor off
  (a generic sum tree whose zero leaves are unsampleable; the tests of the descent use it).
- importance weights (`importance_weights`) normalize by p_min = the smallest POSITIVE priority of the batch or of
  the stored leaves (`positive_min`; +inf when there is none) and are clamped into [MIN_WEIGHT, 1], MIN_WEIGHT =
  2^-126, with x / 0 = +inf: so every weight is finite and in (0, 1] whatever the leaves (a zero leaf sampled,
  weights that underflow float32, a p_min taken over leaves the sampled one is not among).
- a tree whose stored root is not > 0 (all leaves 0: no mass) samples uniformly over the N filled slots,
  index_k = min(floor((k + u_k) * N / B), N - 1) (`stratified_indices`); its weights are all 1.

This is the reference implementation: correctness first; faster kernels are tested against it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hotloop.kernels._common import check_torch_input

PRIORITY_FLOOR = 2.0**-126
"""Smallest priority a leaf is written with (the smallest normal float32, torch.finfo(torch.float32).tiny)."""
MIN_WEIGHT = 2.0**-126
"""Smallest importance weight returned (the smallest normal float32): weights are clamped into [MIN_WEIGHT, 1]."""


class SumTree:
    """Binary sum tree over `capacity` non-negative weights (priorities), resident on one device.

    Args:
        capacity: number of leaves (int >= 1); padded internally to the next power of two with weight 0.
        device: where every tensor of the tree lives (CPU or CUDA).
        dtype: floating dtype of the weights and sums (default float32).

    Attributes:
        nodes: (2P,) `dtype`, the whole tree (node 1 = root, children of i are 2i, 2i+1, leaf j = node P + j).
        max_value: 0-dim `dtype`, max(1.0, every finite non-negative weight ever written); starts at 1.0.
        bad_priority_count: 0-dim int64, how many NaN, +-inf or negative weights `update` has replaced.

    Sanitize rule: a NaN, +-inf or negative weight passed to `update` is replaced by `max_value` (taken after
    including the finite, non-negative weights of the same batch) and counted in `bad_priority_count`. The item
    thus stays sampleable, with the highest priority, until its next update; it is never silently dropped.
    Floor rule (after sanitizing): a weight below `update`'s `floor` (default PRIORITY_FLOOR = 2^-126) is
    written as `floor`, so a 0 (valid, not counted) leaves the item sampleable with a negligible probability;
    with floor=0.0 a weight of exactly 0 is stored and makes the leaf unsampleable.

    Raises:
        ValueError: capacity not an int >= 1, or dtype not a floating torch.dtype.
    """

    def __init__(self, capacity: int, device: torch.device | str, dtype: torch.dtype = torch.float32) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.capacity = capacity
        self.num_leaves = 1 << (capacity - 1).bit_length()  # P
        self.depth = self.num_leaves.bit_length() - 1  # log2(P) levels between root and leaves
        self.dtype = dtype
        self.nodes = torch.zeros(2 * self.num_leaves, dtype=dtype, device=device)
        self.device = self.nodes.device
        self.max_value = torch.ones((), dtype=dtype, device=self.device)
        self.bad_priority_count = torch.zeros((), dtype=torch.int64, device=self.device)

    def total(self) -> torch.Tensor:
        """The root, i.e. the sum of all weights: a 0-dim `dtype` view on the tree's device."""
        return self.nodes[1]

    def leaves(self) -> torch.Tensor:
        """The (capacity,) `dtype` weights, a view into `nodes` (write through `update`, not this view)."""
        return self.nodes[self.num_leaves : self.num_leaves + self.capacity]

    def update(self, indices: torch.Tensor, values: torch.Tensor, floor: float = PRIORITY_FLOOR) -> None:
        """Set leaf weights, then recompute every ancestor of a changed leaf from its two children.

        Args:
            indices: (B,) int64 leaf indices on the tree's device; each must lie in [0, capacity) (not checked:
                checking would read values back to the host). Duplicates are allowed: the LAST occurrence in
                the batch wins, deterministically on every device.
            values: (B,) floating weights on the tree's device (cast to `dtype`); sanitized per the class rule,
                then floored: a value below `floor` is written as `floor` (`max_value` is raised by the values
                before the floor).
            floor: a finite float >= 0 (default PRIORITY_FLOOR = 2^-126, the smallest normal float32; 0.0: no floor).

        Internal nodes are recomputed level by level (log2(P) vectorized steps) as exactly left + right, so the
        tree never accumulates drift from incremental deltas.

        Raises:
            ValueError: wrong type, dtype, shape or device of `indices` or `values`, or a bad `floor`.
        """
        check_torch_input("indices", indices, device=self.device, dtype=torch.int64, ndim=1)
        check_torch_input("values", values, device=self.device, kind="float", shape=(indices.shape[0],))
        check_floor(floor)
        if indices.shape[0] == 0:
            return
        values = values.to(self.dtype)
        bad = ~torch.isfinite(values) | (values < 0)
        self.bad_priority_count.add_(bad.sum())
        torch.maximum(self.max_value, torch.where(bad, 0.0, values).max(), out=self.max_value)
        values = torch.where(bad, self.max_value, values)
        if floor > 0:
            values = torch.where(values < floor, floor, values)
        # Last occurrence wins: a stable sort keeps equal indices in batch order, so the last of each run of
        # equal sorted indices is the batch's last occurrence; every duplicate then writes that same value.
        sorted_idx, perm = torch.sort(indices, stable=True)
        last = torch.searchsorted(sorted_idx, sorted_idx, right=True) - 1
        node = sorted_idx + self.num_leaves
        self.nodes[node] = values[perm[last]]
        for _ in range(self.depth):
            node = node >> 1
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]

    def find(self, masses: torch.Tensor) -> torch.Tensor:
        """Leaf index of each prefix-sum mass: all samples descend from the root in parallel, one step a level.

        At each node a sample goes right (subtracting the left sum) when its mass >= the left sum and the right
        subtree has weight, or when the left subtree has no weight; otherwise it goes left. So it only ever
        enters a subtree of non-zero weight: masses >= total (or inf), within rounding of total, or negative
        still land on a non-zero leaf (the last resp. first one), as do left/right choices skewed by float error.

        Args:
            masses: (B,) floating masses on the tree's device, nominally in [0, total()); cast to `dtype`.

        Returns:
            (B,) int64 leaf indices in [0, capacity), each with non-zero weight whenever total() > 0 (the stored
            root itself is never read, so a stale or perturbed root does not matter). If every weight is 0 the
            result is an in-range index of a zero leaf.

        Raises:
            ValueError: wrong type, dtype, shape or device of `masses`.
        """
        check_torch_input("masses", masses, device=self.device, kind="float", ndim=1)
        mass = masses.to(self.dtype)
        node = torch.ones(masses.shape[0], dtype=torch.int64, device=self.device)
        for _ in range(self.depth):
            left = 2 * node
            left_sum = self.nodes[left]
            right_sum = self.nodes[left + 1]
            go_right = ((mass >= left_sum) & (right_sum > 0)) | (left_sum <= 0)
            mass = torch.where(go_right, mass - left_sum, mass)
            node = left + go_right
        return (node - self.num_leaves).clamp_(max=self.capacity - 1)

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves, level by level (bottom-up, vectorized per level).

        Restores the invariant node == left + right after `nodes` was modified other than through `update`
        (e.g. a loaded checkpoint or a faster kernel under test).
        """
        for level in reversed(range(self.depth)):
            lo, hi = 1 << level, 2 << level
            self.nodes[lo:hi] = self.nodes[2 * lo : 2 * hi : 2] + self.nodes[2 * lo + 1 : 2 * hi : 2]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tree's state: {"nodes": (2P,), "max_value": (), "bad_priority_count": ()} tensors (not copies)."""
        return {"nodes": self.nodes, "max_value": self.max_value, "bad_priority_count": self.bad_priority_count}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a `state_dict` (from any device) into this tree, which must have the same capacity and dtype.

        Raises:
            ValueError: a key missing, or a tensor of the wrong type, shape or dtype (nothing is changed then).
        """
        _load_tensors(self.state_dict(), state)


def check_floor(floor: object) -> float:
    """`floor` as a float; ValueError unless it is a finite int or float >= 0 (not a bool)."""
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (math.isfinite(floor) and floor >= 0):
        raise ValueError(f"floor must be a finite float >= 0, got {floor!r}")
    return float(floor)


def positive_min(values: torch.Tensor) -> torch.Tensor:
    """The smallest element > 0 of `values` (any shape, floating, any device) as a 0-dim tensor of its dtype on its
    device; +inf when no element is > 0 (an empty tensor, all zeros). No host sync. p_min of the weight rule."""
    return torch.where(values > 0, values, torch.inf).amin() if values.numel() else values.new_full((), torch.inf)


def importance_weights(p: torch.Tensor, p_min: torch.Tensor, beta: float) -> torch.Tensor:
    """PER importance weights, Schaul et al. 2016 Sec. 3.4: w_i = (N P(i))^-beta / max_j w_j = (p_min / p_i)^beta,
    computed in p's dtype (as 2^(beta (log2 p_min - log2 p_i)) where p_min / p_i < 2^-126, so that no subnormal
    ratio loses precision), then cast to float32 and clamped into [MIN_WEIGHT, 1] (the module's zero-priority rule).

    Args:
        p: (B,) floating, the sampled leaves' priorities (>= 0; a 0 gives p_min / 0 = +inf -> weight 1).
        p_min: 0-dim, the normalizer from `positive_min` (> 0, or +inf when there is no positive priority: weight 1).
        beta: the exponent in [0, 1] (unchecked; 0 gives all weights 1, as torch.pow(x, 0) = 1 for every x).

    Returns:
        (B,) float32 weights on p's device, each finite and in (0, 1].
    """
    ratio = p_min / p
    small = torch.exp2(beta * (torch.log2(p_min) - torch.log2(p)))
    return torch.where(ratio >= MIN_WEIGHT, ratio.pow(beta), small).to(torch.float32).clamp_(MIN_WEIGHT, 1.0)


def stratified_indices(tree: SumTree, uniforms: torch.Tensor, size: int) -> torch.Tensor:
    """Stratified proportional sampling (Schaul et al. 2016, App. B.2.1): sample k of B gets the leaf
    `tree.find((k + u_k) * total / B)`; a tree whose stored root is not > 0 (no mass) gets the uniform stratified
    index min(floor((k + u_k) * (N / B)), N - 1) over the N = size filled slots instead (N / B a float32 quotient).

    Args:
        tree: the SumTree. uniforms: (B,) floating in [0, 1) on the tree's device. size: N, int in [1, capacity].

    Returns:
        (B,) int64 indices in [0, min(size, capacity)) when the tree has no mass, else as `SumTree.find`.
        No host sync (the no-mass case is a torch.where).

    Raises:
        ValueError: `uniforms` not a 1-D floating tensor on the tree's device, or size not an int >= 1.
    """
    check_torch_input("uniforms", uniforms, device=tree.device, kind="float", ndim=1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    batch = uniforms.shape[0]
    strata = torch.arange(batch, device=tree.device, dtype=tree.dtype)
    found = tree.find((strata + uniforms) * (tree.total() / batch))
    n = min(size, tree.capacity)
    # N / B as the float32 quotient the kernel computes (div_rn of two float32), made on the host: a host tensor
    # copied to the device would break a CUDA graph capture of the sampling
    scale = float(np.float32(n) / np.float32(batch))
    mass = (strata.to(torch.float32) + uniforms.to(torch.float32)) * scale
    uniform = mass.to(torch.int64).clamp_(0, n - 1)
    return torch.where(tree.total() > 0, found, uniform)


def _load_tensors(targets: dict[str, torch.Tensor], state: dict) -> None:
    """Copy state[key] into targets[key] for every key, after checking them all (ValueError naming the key)."""
    for key, target in targets.items():
        src = state.get(key)
        if not isinstance(src, torch.Tensor) or src.shape != target.shape or src.dtype != target.dtype:
            got = f"{src.dtype} {tuple(src.shape)}" if isinstance(src, torch.Tensor) else type(src).__name__
            want = f"a {target.dtype} tensor of shape {tuple(target.shape)}"
            raise ValueError(f"state[{key!r}] must be {want}, got {got}")
    for key, target in targets.items():
        target.copy_(state[key])
