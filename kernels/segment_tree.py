"""Triton sum (segment) tree for proportional prioritized replay: batched update, insert, sample and rebuild.

Source: Schaul, Quan, Antonoglou & Silver, "Prioritized Experience Replay", ICLR 2016 (arXiv:1511.05952), Sec. 3.3
(proportional priorities), Sec. 3.4 (importance weights), App. B.2.1 (sum tree, stratified sampling). The kernels
work in place on the layout of the plain-torch reference `hotloop.kernels.sum_tree.SumTree` (its `nodes`,
`max_value`, `bad_priority_count` tensors), so the trainer can swap them in: `nodes` is float32 (2P,), P = the
next power of two >= capacity, node 1 the root, node i's children 2i and 2i+1, leaf j at P + j, padding leaves 0.

Design (every launcher: fixed grids from shapes, >= 2 programs, no host syncs, no memsets):
- `tree_update` / `tree_insert`: one launch; element e swaps its leaf with an atomic exchange (bit pattern as int32,
  which the interpreter supports and is the same `atom.exch.b32` on the GPU) and adds delta = new - old to every
  ancestor with atomic adds. No thread writes node = left + right (that races between blocks). Duplicates chain:
  the exchanges of one leaf are serialized, so their deltas telescope to final - initial. All atomics are relaxed:
  adds commute and nothing in the launch reads a node back. The TOP_LEVELS top levels (nodes 1..127, where
  hundreds to thousands of elements would hit one address, and same-address atomics serialize in L2) get one
  atomic add per program and node hit, of the block's summed deltas: the deltas are summed onto level TOP-1 with
  a one-hot reduction, then pairwise up to the root. The levels below them do the same within a window of BLOCK
  nodes from the block's smallest node on the level (elements past it add alone): the sampler's indices arrive
  sorted, so when the filled slots crowd one region of the tree (a replay filled 1/32 of the way: thousands of
  updates under each of a few level-7 nodes) each node still gets about one add per program. Bad priorities
  cannot raise inside a captured graph: they are sanitized (the reference's rule, see `tree_update`) and counted
  in a device-side counter that the host reads later, asynchronously.
- Drift: every atomic add rounds (error <= 2^-24 of the node's value); k adds on a node give a random-walk error of
  typically sqrt(k) * 2^-24 * |node| (worst case ~2k * 2^-24 * max |node|). Measured as max over internal nodes of
  |node - exact sum of its leaves| / exact total: ~1e-6 after 5*10^4 updates on 1000 leaves (interpreter), ~4e-6
  in a float32 simulation of the GPU add order after filling 2^20 leaves plus 10^6 updates. Stated bounds, tested:
  1e-5 (CPU, 5*10^4 updates) and 2e-5 (GPU, 2^20 + 10^6 updates), for priorities exp(2 N(0, 1)). Call
  `tree_rebuild` now and then (e.g. once per epoch) to return to float-sum rounding.
- `tree_sample`: launch 1 descends all samples in parallel (the reference's find rule) and writes each sample's
  leaf priority plus one partial minimum per program (of the batch, or of the stored leaves for "global");
  launch 2 (multi-block) reduces the few partials redundantly in every program and turns the priorities into
  weights in place. The partials buffer is fully overwritten each call.
- Zero priorities: the rule of `hotloop.kernels.sum_tree` (module docstring), inside the same launches: the
  update/insert kernel floors every value it writes at `floor` (PRIORITY_FLOOR = 2^-126 by default); the sampling
  kernel's partial minima take only priorities > 0 (+inf if none) and, when the stored root is not > 0, it picks
  the uniform stratified index over the N filled slots; the weights kernel clamps into [MIN_WEIGHT, 1].
- `tree_rebuild`: each program rebuilds a 2^10-leaf subtree in registers (exact pairwise fl(left + right), bit for
  bit the reference's level-by-level sums); ceil(log2(P) / 10) launches. The last launch covers the top (a single
  subtree): 2 programs compute it redundantly and each stores a disjoint half (nodes alternate between them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor, interpreting
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs
from hotloop.kernels.replay_batch import AnnealedBeta, CounterUniforms, annealed_beta, counter_uniforms
from hotloop.kernels.sum_tree import (
    MIN_WEIGHT,
    PRIORITY_FLOOR,
    check_floor,
    importance_weights,
    positive_min,
    stratified_indices,
)

TOP_LEVELS = 7  # tree levels 0..6 (nodes 1..127) get block-reduced atomic adds in the update kernel
REBUILD_LEVELS = 10  # levels per rebuild launch: one program reduces a tile of 2^10 nodes


def _grid(n: int, block: int) -> int:
    """Programs covering n items in blocks, at least 2 (no (1,1,1) grid, even for one item)."""
    return max(2, triton.cdiv(n, block))


def _block() -> int:
    """Elements per program for update/sample/weights: 32 on the GPU (8192 -> 256 programs on 132 SMs); larger
    on the interpreter, which runs programs one after another."""
    return 256 if interpreting() else 32


def _tree_shape(capacity: object) -> tuple[int, int]:
    """(P, depth) for a capacity; ValueError unless capacity is an int >= 1."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    num_leaves = 1 << (capacity - 1).bit_length()
    return num_leaves, num_leaves.bit_length() - 1


def _check_nodes(nodes: object, capacity: object) -> tuple[int, int]:
    """Validate `nodes` for `capacity`; return (P, depth)."""
    num_leaves, depth = _tree_shape(capacity)
    check_tensor("nodes", nodes, dtype=torch.float32, shape=(2 * num_leaves,))
    return num_leaves, depth


def _device_or_int(name: str, value: object, device: torch.device, minimum: int) -> tuple[torch.Tensor | None, int]:
    """A 0-dim int64 device tensor -> (tensor, 0); a python int >= minimum -> (None, value); else ValueError."""
    if isinstance(value, torch.Tensor):
        return check_tensor(name, value, dtype=torch.int64, shape=(), device=device), 0
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum} or a 0-dim int64 tensor, got {value!r}")
    return None, value


@triton.jit
def _tree_update_kernel(
    nodes_ptr,
    idx_ptr,
    val_ptr,
    n,
    capacity,
    start_ptr,
    start_val,
    first,
    max_ptr,
    bad_ptr,
    floor,
    DEPTH: tl.constexpr,
    INSERT: tl.constexpr,
    START_ON_DEVICE: tl.constexpr,
    TOP: tl.constexpr,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    if INSERT:
        if START_ON_DEVICE:
            start = tl.load(start_ptr)
        else:
            start = start_val
        slot = (start + first + offs.to(tl.int64)) % capacity
        value = tl.zeros([BLOCK], tl.float32) + tl.load(max_ptr)
        ok = live
    else:
        slot = tl.load(idx_ptr + offs, mask=live, other=0)
        ok = live & (slot >= 0) & (slot < capacity)
        raw = tl.load(val_ptr + offs, mask=live, other=0.0)
        good = (raw >= 0.0) & (raw <= 3.4028234663852886e38)  # excludes NaN, +-inf and negatives
        block_max = tl.max(tl.where(good & live, raw, 0.0), 0)
        tl.atomic_max(
            max_ptr.to(tl.pointer_type(tl.int32), bitcast=True), block_max.to(tl.int32, bitcast=True), sem="relaxed"
        )
        bad = live & ~good
        n_err = tl.sum(((bad & ok) | (live & ~ok)).to(tl.int64), 0)  # sanitized values + skipped indices
        tl.atomic_add(bad_ptr, n_err, mask=n_err > 0, sem="relaxed")
        value = raw
        if n_err > 0:  # rare: replace by max(max_value, max valid value of the WHOLE batch), as the reference
            repl = tl.maximum(tl.load(max_ptr), block_max)
            for s in range(0, n, BLOCK):
                o = s + tl.arange(0, BLOCK)
                v = tl.load(val_ptr + o, mask=o < n, other=0.0)
                repl = tl.maximum(repl, tl.max(tl.where((v >= 0.0) & (v <= 3.4028234663852886e38), v, 0.0), 0))
            value = tl.where(bad, repl, raw)
    value = tl.where(value < floor, floor, value)  # the floor (after the sanitize rule): no written leaf below it
    leaf = slot + (1 << DEPTH)
    old = tl.atomic_xchg(
        (nodes_ptr + leaf).to(tl.pointer_type(tl.int32), bitcast=True),
        value.to(tl.int32, bitcast=True),
        mask=ok,
        sem="relaxed",
    )
    delta = tl.where(ok, value - old.to(tl.float32, bitcast=True), 0.0)
    node = leaf
    # levels DEPTH-1 .. TOP: the deltas of elements that share a node within a window of BLOCK nodes (from the
    # block's smallest one) are summed first, one add per node hit; elements past the window add alone. Sampled
    # indices arrive sorted (stratified sampling), so a block's are close together: without the window a tree
    # filled in one region got up to 2048 same-node adds per level from 8192 updates, serialized in L2
    lowest = tl.min(tl.where(ok, leaf, (2 << DEPTH) - 1), 0)  # the default: the last leaf (a valid address)
    for level in range(DEPTH - TOP):
        node = node >> 1
        window = lowest >> (level + 1)  # the block's smallest node on this level (the shift keeps the order)
        local = node - window
        near = ok & (local < BLOCK)
        sums = tl.sum(
            tl.where(near[:, None] & (local[:, None] == tl.arange(0, BLOCK)[None, :]), delta[:, None], 0.0), 0
        )
        tl.atomic_add(nodes_ptr + window + tl.arange(0, BLOCK), sums, mask=sums != 0.0, sem="relaxed")
        tl.atomic_add(nodes_ptr + node, delta, mask=ok & ~near, sem="relaxed")
    if TOP > 0:  # levels TOP-1 .. 0: one add per program and node hit, of the block's summed deltas
        width: tl.constexpr = 1 << (TOP - 1)
        local = (leaf >> (DEPTH - TOP + 1)) - width  # ancestor on level TOP-1, numbered from that level's first node
        sums = tl.sum(tl.where(local[:, None] == tl.arange(0, width)[None, :], delta[:, None], 0.0), 0)
        for i in tl.static_range(TOP):  # each level's sums are its children's, summed in pairs
            if i > 0:
                sums = tl.sum(tl.reshape(sums, [width >> i, 2]), 1)
            tl.atomic_add(nodes_ptr + (width >> i) + tl.arange(0, width >> i), sums, mask=sums != 0.0, sem="relaxed")


@triton.jit
def _tree_sample_kernel(
    nodes_ptr,
    u_ptr,
    counter_ptr,
    seed,
    idx_out_ptr,
    p_out_ptr,
    partial_ptr,
    batch,
    batch_f,
    capacity,
    size_ptr,
    size_val,
    n_sample_progs,
    DEPTH: tl.constexpr,
    GLOBAL: tl.constexpr,
    SIZE_ON_DEVICE: tl.constexpr,
    PHILOX: tl.constexpr,
    BLOCK: tl.constexpr,
    LEAF_BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    if pid < n_sample_progs:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        live = offs < batch
        if PHILOX:  # CounterUniforms: the stream hotloop.kernels.replay_batch.batch_uniforms writes
            u = counter_uniforms(counter_ptr, seed, offs)
        else:
            u = tl.load(u_ptr + offs, mask=live, other=0.0)
        root = tl.load(nodes_ptr + 1)
        mass = (offs.to(tl.float32) + u) * tl.math.div_rn(root, batch_f)
        node = tl.full([BLOCK], 1, tl.int64)
        for _ in range(DEPTH):
            left = 2 * node
            left_sum = tl.load(nodes_ptr + left)
            right_sum = tl.load(nodes_ptr + left + 1)
            go_right = ((mass >= left_sum) & (right_sum > 0.0)) | (left_sum <= 0.0)
            mass = tl.where(go_right, mass - left_sum, mass)
            node = left + go_right.to(tl.int64)
        idx = tl.minimum(node - (1 << DEPTH), capacity - 1)
        # no mass (root not > 0: all leaves 0): the uniform stratified index over the N filled slots
        if SIZE_ON_DEVICE:
            n_filled = tl.minimum(tl.load(size_ptr), capacity)
        else:
            n_filled = tl.minimum(size_val, capacity)
        flat = ((offs.to(tl.float32) + u) * tl.math.div_rn(n_filled.to(tl.float32), batch_f)).to(tl.int64)
        flat = tl.maximum(tl.minimum(flat, n_filled - 1), 0)
        idx = tl.where(root > 0.0, idx, flat)
        p = tl.load(nodes_ptr + (1 << DEPTH) + idx)
        tl.store(idx_out_ptr + offs, idx, mask=live)
        tl.store(p_out_ptr + offs, p, mask=live)
        if not GLOBAL:  # p_min candidates: the batch's priorities > 0 (+inf if none)
            tl.store(partial_ptr + pid, tl.min(tl.where(live & (p > 0.0), p, float("inf")), 0))
    else:
        leaf_block = pid - n_sample_progs  # names differ from the other branch's: no merged types
        slots = leaf_block * LEAF_BLOCK + tl.arange(0, LEAF_BLOCK)
        if SIZE_ON_DEVICE:
            size = tl.load(size_ptr)
        else:
            size = size_val
        stored = (slots < size) & (slots < capacity)
        leaves = tl.load(nodes_ptr + (1 << DEPTH) + slots, mask=stored, other=float("inf"))
        tl.store(partial_ptr + leaf_block, tl.min(tl.where(leaves > 0.0, leaves, float("inf")), 0))  # leaves > 0


@triton.jit
def _tree_weights_kernel(
    w_ptr,
    partial_ptr,
    n_partials,
    beta_ptr,
    counter_ptr,
    beta_start,
    beta_end,
    anneal_steps,
    batch,
    ANNEAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PBLOCK: tl.constexpr,
    MIN_W: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    lo = tl.full([PBLOCK], float("inf"), tl.float32)
    for s in range(0, n_partials, PBLOCK):  # every program reduces the (few) partials redundantly
        o = s + tl.arange(0, PBLOCK)
        lo = tl.minimum(lo, tl.load(partial_ptr + o, mask=o < n_partials, other=float("inf")))
    p_min = tl.min(lo, 0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    live = offs < batch
    p = tl.load(w_ptr + offs, mask=live, other=1.0)
    if ANNEAL:  # AnnealedBeta: the formula of hotloop.kernels.replay_batch.batch_uniforms
        beta = annealed_beta(counter_ptr, beta_start, beta_end, anneal_steps)
    else:
        beta = tl.load(beta_ptr)
    ratio = tl.math.div_rn(p_min, p)  # p = 0 or p_min = +inf: +inf, a weight clamped to 1 below
    # a ratio below 2^-126 (subnormal or 0) goes through the difference of logs, which reads no subnormal (the
    # maxima only keep the branch not taken off log2(0))
    lg = tl.where(ratio >= MIN_W, tl.log2(tl.maximum(ratio, MIN_W)), tl.log2(p_min) - tl.log2(tl.maximum(p, MIN_W)))
    w = tl.exp2(beta * lg)
    w = tl.minimum(tl.maximum(w, MIN_W), 1.0)  # into [MIN_WEIGHT, 1]: an underflow to 0 is raised to MIN_WEIGHT
    tl.store(w_ptr + offs, tl.where(beta == 0.0, 1.0, w), mask=live)  # x^0 = 1, as torch.pow (even 0^0, nan^0)


@triton.jit
def _tree_rebuild_kernel(nodes_ptr, in_start, n_sub, LEVELS: tl.constexpr):
    pid = tl.program_id(0)
    sub = pid % n_sub
    writer = pid // n_sub
    n_writers = tl.num_programs(0) // n_sub
    x = tl.load(nodes_ptr + in_start + sub * (1 << LEVELS) + tl.arange(0, 1 << LEVELS))
    out_start = in_start
    for _ in tl.static_range(LEVELS):  # unrolled: x halves each level (shapes stay inline: constexpr)
        left, right = tl.split(tl.reshape(x, [x.shape[0] // 2, 2]))
        x = left + right
        out_start = out_start // 2
        loc = tl.arange(0, x.shape[0])
        tl.store(nodes_ptr + out_start + sub * x.shape[0] + loc, x, mask=(loc % n_writers) == writer)


def tree_update(
    nodes: torch.Tensor,
    indices: torch.Tensor,
    values: torch.Tensor,
    capacity: int,
    max_value: torch.Tensor,
    bad_count: torch.Tensor,
    floor: float = PRIORITY_FLOOR,
) -> None:
    """Set leaf priorities in place and propagate the changes to every ancestor, in one launch.

    Args:
        nodes: (2P,) float32 tree (`SumTree.nodes` layout), on the CUDA device (or CPU under TRITON_INTERPRET=1).
        indices: (B,) int64 leaf indices, nominally in [0, capacity). Duplicates allowed: the leaf ends as ONE
            of the duplicates' values (which one is unspecified, unlike the reference's last-occurrence rule) and
            every ancestor still equals the sum of its leaves up to float rounding. An index outside
            [0, capacity) is skipped (memory-safe) and counted in `bad_count`.
        values: (B,) float32 priorities. Sanitize rule, as `SumTree.update`: NaN, +-inf or negative values are
            replaced by max(max_value, largest finite non-negative value of the whole batch) and counted in
            `bad_count` (a graph-safe error counter for the host to read later, asynchronously); 0 is valid.
            Then floored, as `SumTree.update`: a value below `floor` is written as `floor` (in the same launch).
        capacity: number of real leaves (int >= 1).
        max_value: 0-dim float32, raised in place to the batch's largest finite non-negative value (atomic max on
            the int32 bit pattern, which orders non-negative floats like their values).
        bad_count: 0-dim int64, incremented in place by the sanitized values plus the skipped indices.
        floor: finite float >= 0, the smallest value written (default PRIORITY_FLOOR = 2^-126, the smallest normal
            float32, so no written leaf is 0; 0.0: no floor, a 0 is stored and makes the leaf unsampleable).

    Raises:
        ValueError: a wrong type, dtype, shape or device (naming the argument), capacity not an int >= 1, or a
            bad floor.
    """
    _, depth = _check_nodes(nodes, capacity)
    check_tensor("indices", indices, dtype=torch.int64, ndim=1, device=nodes.device)
    check_tensor("values", values, dtype=torch.float32, shape=(indices.shape[0],), device=nodes.device)
    check_tensor("max_value", max_value, dtype=torch.float32, shape=(), device=nodes.device)
    check_tensor("bad_count", bad_count, dtype=torch.int64, shape=(), device=nodes.device)
    floor = check_floor(floor)
    n = indices.shape[0]
    if n == 0:
        return
    block = _block()
    _tree_update_kernel[(_grid(n, block),)](
        nodes,
        indices,
        values,
        n,
        capacity,
        nodes,
        0,
        0,
        max_value,
        bad_count,
        floor,
        DEPTH=depth,
        INSERT=False,
        START_ON_DEVICE=False,
        TOP=min(TOP_LEVELS, depth),
        BLOCK=block,
        num_warps=1,
        **pdl_kwargs(),
    )


@triton.jit
def _tree_insert_kernel(
    nodes_ptr,
    n,
    capacity,
    start_ptr,
    start_val,
    first,
    max_ptr,
    floor,
    DEPTH: tl.constexpr,
    START_ON_DEVICE: tl.constexpr,
    TOP: tl.constexpr,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    """The update kernel's insert path under its own name: the actor's tree insert (kernels/actor_step.py) is told
    apart from the learner's priority update by kernel name in a trace (the gate's phase attribution); its first
    statement is the update kernel's gdc_prologue."""
    _tree_update_kernel(
        nodes_ptr,
        nodes_ptr,
        nodes_ptr,
        n,
        capacity,
        start_ptr,
        start_val,
        first,
        max_ptr,
        max_ptr,
        floor,
        DEPTH,
        True,
        START_ON_DEVICE,
        TOP,
        BLOCK,
        GDC,
    )


def tree_insert(
    nodes: torch.Tensor,
    start_pos: torch.Tensor | int,
    count: int,
    capacity: int,
    max_value: torch.Tensor,
    floor: float = PRIORITY_FLOOR,
) -> None:
    """Give `count` new ring slots the current max priority (read on the device), in one launch.

    As `PrioritizedReplay.add`: the slots are (start_pos + i) % capacity for i in [0, count); when count >
    capacity only the last `capacity` of them are written (each slot once). Runs the update kernel's path.

    Args:
        nodes: (2P,) float32 tree, as in `tree_update`.
        start_pos: the ring's write position: a python int >= 0 or a 0-dim int64 device tensor (>= 0, unchecked).
        count: number of transitions added (python int >= 0; a fixed shape, not a per-step value).
        capacity: number of real leaves (int >= 1).
        max_value: 0-dim float32, the priority the new leaves get (not modified), floored at `floor`.
        floor: finite float >= 0 (default PRIORITY_FLOOR = 2^-126), as in `tree_update`.

    Raises:
        ValueError: a wrong type, dtype, shape or device, capacity < 1, count < 0, start_pos < 0 or a bad floor.
    """
    _, depth = _check_nodes(nodes, capacity)
    start_t, start_v = _device_or_int("start_pos", start_pos, nodes.device, 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    check_tensor("max_value", max_value, dtype=torch.float32, shape=(), device=nodes.device)
    floor = check_floor(floor)
    kept = min(count, capacity)
    if kept == 0:
        return
    block = _block()
    _tree_insert_kernel[(_grid(kept, block),)](
        nodes,
        kept,
        capacity,
        nodes if start_t is None else start_t,
        start_v,
        count - kept,
        max_value,
        floor,
        DEPTH=depth,
        START_ON_DEVICE=start_t is not None,
        TOP=min(TOP_LEVELS, depth),
        BLOCK=block,
        num_warps=1,
        **pdl_kwargs(),
    )


def tree_sample(
    nodes: torch.Tensor,
    capacity: int,
    size: torch.Tensor | int,
    batch_size: int,
    uniforms: torch.Tensor | CounterUniforms,
    beta: torch.Tensor | AnnealedBeta,
    out_indices: torch.Tensor,
    out_weights: torch.Tensor,
    weight_norm: str = "batch",
) -> None:
    """Stratified proportional sampling with importance weights, as `PrioritizedReplay.sample` (two launches).

    Sample k's mass is (k + u_k) * (root / B) (the stored root, as the reference), and its leaf is found by the
    reference's descent: go right when mass >= left sum and the right subtree has weight, or when the left one
    has none. So the index is always < capacity and of a non-zero leaf whenever any leaf is non-zero, also for
    masses within rounding of the total or a root that differs from the sum of the leaves. A stored root that is
    not > 0 (no mass: all leaves 0) gives the uniform stratified index min(floor((k + u_k) * (N / B)), N - 1)
    instead (`hotloop.kernels.sum_tree.stratified_indices`).
    Weights w_i = (N P(i))^-beta / max_j w_j = (p_min / p_i)^beta, p_min the smallest priority > 0 of the batch
    ("batch", the reference default) or of leaves [0, size) ("global"), +inf if there is none; computed as
    exp2(beta log2(p_min / p_i)) (a few float32 ulp from torch.pow; exp2(beta (log2 p_min - log2 p_i)) where the
    ratio is below 2^-126) and clamped into [MIN_WEIGHT, 1] (x / 0 = +inf), so each is finite and in (0, 1]
    whatever the leaves: 1 for a zero leaf and on a tree with no mass (`hotloop.kernels.sum_tree.importance_weights`).

    Args:
        nodes: (2P,) float32 tree.
        capacity: number of real leaves (int >= 1).
        size: N, the filled slots: python int in [1, capacity] or 0-dim int64 device tensor (unchecked; clamped
            to [1, capacity] where read); read by "global" (p_min over [0, N)) and by the no-mass fallback (for
            "batch", N cancels out of the normalized weights).
        batch_size: B (int >= 1).
        uniforms: (B,) float32 in [0, 1), one per stratum; or a `hotloop.kernels.replay_batch.CounterUniforms`, drawn by
            the sampling kernel itself (the `batch_uniforms` stream, without its launch).
        beta: 0-dim float32 device tensor, the importance-sampling exponent in [0, 1] (unchecked: no host sync);
            or a `hotloop.kernels.replay_batch.AnnealedBeta`, computed by the weights kernel itself.
        out_indices: (B,) int64, written with the sampled slots.
        out_weights: (B,) float32, written with the importance weights in (0, 1].
        weight_norm: "batch" or "global".

    Raises:
        ValueError: a wrong type, dtype, shape or device, or a bad capacity, size, batch_size or weight_norm.
    """
    _, depth = _check_nodes(nodes, capacity)
    size_t, size_v = _device_or_int("size", size, nodes.device, 1)
    if size_t is None and size_v > capacity:
        raise ValueError(f"size must be <= capacity ({capacity}), got {size_v}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if weight_norm not in ("batch", "global"):
        raise ValueError(f"weight_norm must be 'batch' or 'global', got {weight_norm!r}")
    philox, anneal = isinstance(uniforms, CounterUniforms), isinstance(beta, AnnealedBeta)
    if philox:
        uniforms.check(nodes.device)
    else:
        check_tensor("uniforms", uniforms, dtype=torch.float32, shape=(batch_size,), device=nodes.device)
    if anneal:
        beta.check(nodes.device)
    else:
        check_tensor("beta", beta, dtype=torch.float32, shape=(), device=nodes.device)
    check_tensor("out_indices", out_indices, dtype=torch.int64, shape=(batch_size,), device=nodes.device)
    check_tensor("out_weights", out_weights, dtype=torch.float32, shape=(batch_size,), device=nodes.device)
    block, leaf_block = _block(), 1024
    n_sample = _grid(batch_size, block)
    n_leaf = triton.cdiv(capacity, leaf_block) if weight_norm == "global" else 0
    n_partials = n_leaf if weight_norm == "global" else n_sample
    partials = torch.empty(n_partials, dtype=torch.float32, device=nodes.device)
    _tree_sample_kernel[(n_sample + n_leaf,)](
        nodes,
        nodes if philox else uniforms,
        uniforms.counter if philox else out_indices,
        uniforms.seed if philox else 0,
        out_indices,
        out_weights,
        partials,
        batch_size,
        float(batch_size),
        capacity,
        nodes if size_t is None else size_t,
        size_v,
        n_sample,
        DEPTH=depth,
        GLOBAL=weight_norm == "global",
        SIZE_ON_DEVICE=size_t is not None,
        PHILOX=philox,
        BLOCK=block,
        LEAF_BLOCK=leaf_block,
        num_warps=1,
        **pdl_kwargs(),
    )
    _tree_weights_kernel[(_grid(batch_size, block),)](
        out_weights,
        partials,
        n_partials,
        nodes if anneal else beta,
        beta.counter if anneal else out_indices,
        float(beta.start) if anneal else 0.0,
        float(beta.end) if anneal else 0.0,
        float(beta.anneal_steps) if anneal else 1.0,
        batch_size,
        ANNEAL=anneal,
        BLOCK=block,
        PBLOCK=256,
        MIN_W=MIN_WEIGHT,
        num_warps=1,
        **pdl_kwargs(),
    )


def tree_rebuild(nodes: torch.Tensor) -> None:
    """Recompute every internal node from the leaves in place: node = fl(left + right), bottom-up.

    The result equals `SumTree.rebuild` bit for bit, so afterwards |node - exact sum of its leaves| <=
    depth * 2^-24 * exact (float32 summation rounding) and the drift of `tree_update`'s atomic adds is gone.
    Launches ceil(log2(P) / 10): each program reduces a tile of 2^10 nodes through 10 levels in registers; the
    last launch (a single tile at the top) runs 2 programs that compute it redundantly and store disjoint halves.

    Args:
        nodes: (2P,) float32 tree with P a power of two (leaves [P, 2P) are read, never written).

    Raises:
        ValueError: nodes not a contiguous float32 1-D tensor of size 2P, P a power of two, on the kernel device.
    """
    check_tensor("nodes", nodes, dtype=torch.float32, ndim=1)
    num_leaves = nodes.shape[0] // 2
    if num_leaves < 1 or nodes.shape[0] != 2 * num_leaves or num_leaves & (num_leaves - 1):
        raise ValueError(f"nodes must have size 2P with P a power of two, got shape {tuple(nodes.shape)}")
    level = num_leaves.bit_length() - 1
    while level > 0:
        levels = min(REBUILD_LEVELS, level)
        n_sub = 1 << (level - levels)
        _tree_rebuild_kernel[(max(n_sub, 2),)](
            nodes, 1 << level, n_sub, LEVELS=levels, num_warps=4 if levels >= 8 else 1
        )
        level -= levels


def sample_reference(
    tree, size: int, uniforms: torch.Tensor, beta: float, weight_norm: str = "batch"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of `tree_sample`: the index and weight lines of `PrioritizedReplay.sample`, with the
    uniforms given instead of drawn (`hotloop.kernels.sum_tree.stratified_indices`, `positive_min`,
    `importance_weights`). `tree` is a `hotloop.kernels.sum_tree.SumTree`, size an int in [1, capacity], uniforms
    (B,) float32 on its device; returns ((B,) int64, (B,) float32 in (0, 1]). ValueError as `stratified_indices`."""
    idx = stratified_indices(tree, uniforms, size)
    p = tree.leaves()[idx]
    p_min = positive_min(p if weight_norm == "batch" else tree.leaves()[:size])
    return idx, importance_weights(p, p_min, beta)
