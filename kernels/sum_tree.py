"""Array-backed binary sum tree for proportional prioritized replay.

Source: Schaul, Quan, Antonoglou & Silver, "Prioritized Experience Replay", ICLR 2016 (arXiv:1511.05952),
Appendix B.2.1: a sum tree whose leaves hold the priorities p_i, so that sampling and updating are O(log N).

Layout: `SumTree.nodes` holds 2P values, P = the smallest power of two >= capacity. Node 1 is the root, node i
has children 2i and 2i+1, and leaf j (the priority of item j) is node P + j. Leaves [capacity, P) are padding
with weight 0 and node 0 is unused. Every method is a fixed number of vectorized tensor ops (one step per tree
level) on fixed shapes, so it runs on any device and never reads a tensor value back to the host.

This is the reference implementation: correctness first; faster kernels are tested against it.
"""

from __future__ import annotations

import torch


def _check_tensor(
    name: str,
    t: object,
    device: torch.device,
    *,
    shape: tuple[int | None, ...] | None = None,
    ndim: int | None = None,
    dtype: torch.dtype | None = None,
    kind: str | None = None,
) -> None:
    """Raise ValueError naming `name` unless `t` is a tensor on `device` with the given shape/ndim/dtype.

    `shape` entries of None match any size; `kind` is "float" (any floating dtype) or "int" (any integer
    dtype, bool excluded). Only shapes, dtypes and devices are read, never values, so this never syncs.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if kind == "float" and not t.dtype.is_floating_point:
        raise ValueError(f"{name} must have a floating-point dtype, got {t.dtype}")
    if kind == "int" and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise ValueError(f"{name} must have an integer dtype, got {t.dtype}")
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if shape is not None and (
        t.ndim != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape))
    ):
        want_str = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want_str}, got {tuple(t.shape)}")


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
    A weight of exactly 0 is valid and makes the leaf unsampleable.

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

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaf weights, then recompute every ancestor of a changed leaf from its two children.

        Args:
            indices: (B,) int64 leaf indices on the tree's device; each must lie in [0, capacity) (not checked:
                checking would read values back to the host). Duplicates are allowed: the LAST occurrence in
                the batch wins, deterministically on every device.
            values: (B,) floating weights on the tree's device (cast to `dtype`); sanitized per the class rule.

        Internal nodes are recomputed level by level (log2(P) vectorized steps) as exactly left + right, so the
        tree never accumulates drift from incremental deltas.

        Raises:
            ValueError: wrong type, dtype, shape or device of `indices` or `values`.
        """
        _check_tensor("indices", indices, self.device, dtype=torch.int64, ndim=1)
        _check_tensor("values", values, self.device, kind="float", shape=(indices.shape[0],))
        if indices.shape[0] == 0:
            return
        values = values.to(self.dtype)
        bad = ~torch.isfinite(values) | (values < 0)
        self.bad_priority_count.add_(bad.sum())
        torch.maximum(self.max_value, torch.where(bad, 0.0, values).max(), out=self.max_value)
        values = torch.where(bad, self.max_value, values)
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
        _check_tensor("masses", masses, self.device, kind="float", ndim=1)
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
