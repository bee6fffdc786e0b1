"""Unit tests of `hotloop.trainer.replay.SumTree` (CPU, seeded random non-zero inputs)."""

from __future__ import annotations

import io

import pytest
import torch

from hotloop.kernels.sum_tree import MIN_WEIGHT, PRIORITY_FLOOR, importance_weights, positive_min, stratified_indices
from hotloop.trainer.replay import SumTree

CAPACITIES = [1, 3, 5, 1000, 1023, 1025]
U32 = 2.0**-24  # unit roundoff of float32


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _exact_sums(tree: SumTree) -> torch.Tensor:
    """Float64 sum of the leaves under every node (same layout as tree.nodes), from the leaves alone."""
    sums = torch.zeros(2 * tree.num_leaves, dtype=torch.float64)
    sums[tree.num_leaves :] = tree.nodes[tree.num_leaves :].double()
    p = tree.num_leaves
    while p > 1:
        sums[p // 2 : p] = sums[p : 2 * p].view(-1, 2).sum(1)
        p //= 2
    return sums


def _assert_invariants(tree: SumTree) -> None:
    """Every internal node equals the sum of its two children (float64, rtol 1e-6); padding leaves are 0."""
    nodes = tree.nodes.double()
    internal = torch.arange(1, tree.num_leaves)
    torch.testing.assert_close(nodes[internal], nodes[2 * internal] + nodes[2 * internal + 1], rtol=1e-6, atol=0)
    assert torch.all(tree.nodes[tree.num_leaves + tree.capacity :] == 0)


def _tree_with(leaves: list[float]) -> SumTree:
    """A tree holding exactly `leaves` (floor=0.0: zero leaves stay 0, unsampleable)."""
    tree = SumTree(len(leaves), "cpu")
    tree.update(torch.arange(len(leaves)), torch.tensor(leaves), floor=0.0)
    return tree


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_layout_padding_and_levels(capacity: int) -> None:
    tree = SumTree(capacity, "cpu")
    p = tree.num_leaves
    assert p >= capacity and p & (p - 1) == 0 and (p == 1 or p // 2 < capacity)
    assert tree.nodes.shape == (2 * p,) and tree.leaves().shape == (capacity,) and tree.depth == p.bit_length() - 1
    assert tree.max_value.item() == 1.0 and tree.bad_priority_count.dtype == torch.int64


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_random_batched_updates_with_duplicates_keep_invariants(capacity: int) -> None:
    g = _gen(capacity)
    tree = SumTree(capacity, "cpu")
    reference = [0.0] * capacity
    for _ in range(10):
        batch = int(torch.randint(1, 2 * capacity + 3, (1,), generator=g))  # > capacity: many duplicates
        indices = torch.randint(0, capacity, (batch,), generator=g)
        values = torch.rand(batch, generator=g) * 10 + 0.01
        tree.update(indices, values)
        for i, v in zip(indices.tolist(), values.tolist()):  # sequential semantics: later writes win
            reference[i] = v
        _assert_invariants(tree)
        assert torch.equal(tree.leaves(), torch.tensor(reference, dtype=torch.float32))
    exact_total = torch.tensor(reference, dtype=torch.float64).sum()
    torch.testing.assert_close(tree.total().double(), exact_total, rtol=1e-6, atol=0)


def test_duplicates_last_occurrence_wins() -> None:
    tree = SumTree(4, "cpu")
    tree.update(torch.tensor([2, 0, 2, 2, 1, 0, 3]), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]))
    assert tree.leaves().tolist() == [6.0, 5.0, 4.0, 7.0]
    tree.update(torch.full((1000,), 1), torch.arange(1.0, 1001.0))
    assert tree.leaves().tolist() == [6.0, 1000.0, 4.0, 7.0]
    assert tree.total().item() == 1017.0
    _assert_invariants(tree)


def test_find_equal_priorities_capacity_3() -> None:
    tree = _tree_with([1.0, 1.0, 1.0])
    assert tree.find(torch.tensor([0.5, 1.5, 2.5])).tolist() == [0, 1, 2]


def test_find_masses_at_or_beyond_total_and_negative() -> None:
    tree = _tree_with([1.0, 0.0, 2.0, 0.0, 0.0])  # last non-zero leaf is 2, first is 0
    total = tree.total().item()
    masses = torch.tensor(
        [
            0.99,
            1.0,
            total,
            torch.nextafter(torch.tensor(total), torch.tensor(0.0)).item(),
            total * 1.5,
            float("inf"),
            -1.0,
        ]
    )
    assert tree.find(masses).tolist() == [0, 2, 2, 2, 2, 2, 0]


def test_find_never_enters_empty_subtree_at_rounding_boundaries() -> None:
    g = _gen(7)
    capacity = 1025
    leaves = torch.exp(torch.randn(capacity, generator=g) * 3) * (torch.rand(capacity, generator=g) < 0.3)
    tree = SumTree(capacity, "cpu")
    tree.update(torch.arange(capacity), leaves, floor=0.0)
    total = tree.total()
    edges = torch.cumsum(tree.leaves(), 0)  # float32 prefix sums: the left/right decision boundaries
    masses = torch.cat(
        [
            edges,
            torch.nextafter(edges, edges + 1),
            torch.nextafter(edges, edges - 1),
            torch.linspace(0, float(total) * (1 + 1e-5), 5001),
            total.reshape(1) * torch.tensor([1.0, 2.0]),
            torch.rand(5000, generator=g) * total,
        ]
    )
    found = tree.find(masses)
    assert torch.all((found >= 0) & (found < capacity))
    assert torch.all(tree.leaves()[found] > 0)
    # Away from the boundaries the descent must agree with an exact float64 prefix-sum search.
    edges64 = torch.cumsum(tree.leaves().double(), 0)
    m64 = masses.double()
    clear = (torch.cdist(m64[:, None], edges64[:, None]).min(1).values > 1e-4 * float(total)) & (m64 < edges64[-1])
    expected = torch.searchsorted(edges64, m64[clear], right=True)
    assert torch.equal(found[clear], expected)
    assert int(clear.sum()) > 5000


def test_find_with_perturbed_root_then_rebuild() -> None:
    g = _gen(11)
    tree = SumTree(1000, "cpu")
    tree.update(torch.arange(0, 1000, 2), torch.rand(500, generator=g) + 0.1)  # odd leaves stay empty
    true_total = tree.total().clone()
    tree.nodes[1] = true_total * 1.25  # a stale root larger than the sum of the leaves
    found = tree.find(torch.linspace(0, float(tree.total()), 4001))
    assert torch.all((found >= 0) & (found < 1000)) and torch.all(tree.leaves()[found] > 0)
    tree.rebuild()
    assert torch.equal(tree.total(), true_total)
    _assert_invariants(tree)


def test_find_on_empty_tree_stays_in_range() -> None:
    found = SumTree(5, "cpu").find(torch.tensor([0.0, 1.0, -1.0]))
    assert torch.all((found >= 0) & (found < 5))


def test_drift_after_1e5_float32_updates_is_bounded_and_rebuild_restores() -> None:
    """No drift accumulates: each node is recomputed as fl(left + right), so its error is only the rounding of
    the summation below it, |node - exact| <= depth * u * exact(node) (u = 2^-24), however many updates ran."""
    g = _gen(3)
    tree = SumTree(10_000, "cpu")
    for _ in range(100):  # 100 batches x 1000 = 1e5 updates with a wide dynamic range
        tree.update(torch.randint(0, 10_000, (1000,), generator=g), torch.exp(torch.randn(1000, generator=g) * 3))
    exact = _exact_sums(tree)
    internal = slice(1, tree.num_leaves)
    err = (tree.nodes[internal].double() - exact[internal]).abs()
    bound = tree.depth * U32
    assert float(err.max() / exact[1]) < bound
    assert torch.all(err <= bound * exact[internal])
    snapshot = tree.nodes.clone()
    tree.rebuild()
    assert torch.equal(tree.nodes, snapshot)  # incremental updates already equal a full rebuild bit for bit
    tree.nodes[internal] *= 1 + 1e-3 * torch.randn(tree.num_leaves - 1, generator=g)  # simulate drifted sums
    assert float((tree.nodes[internal].double() - exact[internal]).abs().max() / exact[1]) > 1e-5
    tree.rebuild()
    assert torch.equal(tree.nodes, snapshot)


def test_sanitize_replaces_bad_priorities_by_max_and_counts_them() -> None:
    tree = SumTree(5, "cpu")
    nan, inf = float("nan"), float("inf")
    tree.update(torch.arange(5), torch.tensor([0.5, nan, inf, -inf, -2.0]))
    assert tree.leaves().tolist() == [0.5, 1.0, 1.0, 1.0, 1.0]  # max_value starts at 1.0
    assert tree.bad_priority_count.item() == 4
    tree.update(torch.tensor([0, 1]), torch.tensor([3.0, nan]))  # max includes the same batch's valid 3.0
    assert tree.leaves().tolist() == [3.0, 3.0, 1.0, 1.0, 1.0] and tree.max_value.item() == 3.0
    tree.update(torch.tensor([2]), torch.tensor([0.0]))  # zero is valid, not counted: stored as the floor
    assert tree.leaves()[2].item() == 2.0**-126 and tree.bad_priority_count.item() == 5
    tree.update(torch.tensor([2]), torch.tensor([0.0]), floor=0.0)  # without the floor: stored as 0
    assert tree.leaves()[2].item() == 0.0 and tree.bad_priority_count.item() == 5
    _assert_invariants(tree)


def test_state_dict_round_trip() -> None:
    tree = _tree_with([0.25, 4.0, float("nan")])
    buffer = io.BytesIO()
    torch.save(tree.state_dict(), buffer)
    buffer.seek(0)
    other = SumTree(3, "cpu")
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(other.nodes, tree.nodes) and other.max_value.item() == 4.0
    assert other.bad_priority_count.item() == 1
    with pytest.raises(ValueError, match="nodes"):
        SumTree(5, "cpu").load_state_dict(tree.state_dict())


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: SumTree(0, "cpu"), "capacity"),
        (lambda: SumTree(2.5, "cpu"), "capacity"),
        (lambda: SumTree(True, "cpu"), "capacity"),
        (lambda: SumTree(4, "cpu", dtype=torch.int64), "dtype"),
        (lambda: SumTree(4, "cpu").update(torch.tensor([0, 1], dtype=torch.int32), torch.ones(2)), "indices"),
        (lambda: SumTree(4, "cpu").update(torch.zeros(2, 1, dtype=torch.int64), torch.ones(2)), "indices"),
        (lambda: SumTree(4, "cpu").update(torch.zeros(2, dtype=torch.int64, device="meta"), torch.ones(2)), "indices"),
        (lambda: SumTree(4, "cpu").update([0, 1], torch.ones(2)), "indices"),
        (lambda: SumTree(4, "cpu").update(torch.tensor([0, 1]), torch.ones(3)), "values"),
        (lambda: SumTree(4, "cpu").update(torch.tensor([0, 1]), torch.ones(2, dtype=torch.int64)), "values"),
        (lambda: SumTree(4, "cpu").update(torch.tensor([0, 1]), torch.ones(2, device="meta")), "values"),
        (lambda: SumTree(4, "cpu").find(torch.tensor([1, 2])), "masses"),
        (lambda: SumTree(4, "cpu").find(torch.ones(2, 2)), "masses"),
        (lambda: SumTree(4, "cpu").find(torch.ones(2, device="meta")), "masses"),
        (lambda: SumTree(4, "cpu").load_state_dict({}), "nodes"),
        (lambda: SumTree(4, "cpu").update(torch.tensor([0, 1]), torch.ones(2), floor=-1e-3), "floor"),
        (lambda: SumTree(4, "cpu").update(torch.tensor([0, 1]), torch.ones(2), floor=float("nan")), "floor"),
        (lambda: SumTree(4, "cpu").update(torch.tensor([0, 1]), torch.ones(2), floor=True), "floor"),
        (lambda: stratified_indices(SumTree(4, "cpu"), torch.rand(3), 0), "size"),
        (lambda: stratified_indices(SumTree(4, "cpu"), torch.rand(3, dtype=torch.float64).long(), 2), "uniforms"),
    ],
)
def test_value_errors(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_update_floors_zero_subnormal_and_underflowed_values() -> None:
    """Zero-priority rule: every written value below the floor (0, -0.0, a subnormal, a float32 underflow) is
    stored as the floor (default 2^-126); max_value and bad_priority_count see the values before the floor."""
    g = _gen(31)
    capacity = 1025
    tree = SumTree(capacity, "cpu")
    values = torch.exp(torch.randn(capacity, generator=g) * 3)
    special = torch.randperm(capacity, generator=g)[:40]
    values[special[:10]] = 0.0
    values[special[10:20]] = -0.0
    values[special[20:30]] = 1e-40  # subnormal float32
    values[special[30:]] = torch.tensor(1e-30) ** 2  # underflows float32 to 0
    tree.update(torch.arange(capacity), values)
    want = torch.where(values < PRIORITY_FLOOR, PRIORITY_FLOOR, values)
    assert torch.equal(tree.leaves(), want) and torch.all(tree.leaves() > 0)
    assert tree.leaves()[special].eq(PRIORITY_FLOOR).all() and tree.bad_priority_count.item() == 0
    assert tree.max_value.item() == max(1.0, float(values.max()))
    _assert_invariants(tree)
    tree.update(special, torch.zeros(40), floor=0.25)  # another floor
    assert torch.all(tree.leaves()[special] == 0.25)
    tree.update(special, torch.zeros(40), floor=0.0)  # no floor: zeros stored, leaves unsampleable
    assert torch.all(tree.leaves()[special] == 0.0)
    found = tree.find(torch.rand(4000, generator=g) * tree.total())
    assert torch.all(tree.leaves()[found] > 0)
    _assert_invariants(tree)


def test_floored_float64_tree_stores_the_same_floor() -> None:
    tree = SumTree(4, "cpu", dtype=torch.float64)
    tree.update(torch.arange(4), torch.tensor([0.0, 1e-300, 2.5, 1e-38], dtype=torch.float64))
    assert tree.leaves().tolist() == [PRIORITY_FLOOR, PRIORITY_FLOOR, 2.5, PRIORITY_FLOOR]


def test_positive_min_ignores_zero_and_is_inf_without_positive_values() -> None:
    g = _gen(32)
    x = torch.rand(500, generator=g) + 0.01
    x[torch.randperm(500, generator=g)[:50]] = 0.0
    assert positive_min(x).item() == x[x > 0].min().item()
    assert positive_min(torch.zeros(7)).item() == float("inf")
    assert positive_min(torch.zeros(0)).item() == float("inf")
    assert positive_min(torch.tensor([0.0, -0.0, 3.0])).item() == 3.0


def test_importance_weights_rule_is_finite_and_in_the_unit_interval() -> None:
    g = _gen(33)
    p = torch.exp(torch.randn(300, generator=g) * 2)
    p_min = positive_min(p)
    for beta in (0.0, 0.4, 1.0):  # the standard formula on positive priorities
        w = importance_weights(p, p_min, beta)
        torch.testing.assert_close(w.double(), (p_min.double() / p.double()) ** beta, rtol=1e-6, atol=0)
    special = torch.tensor([0.0, PRIORITY_FLOOR, 3e38, 1.0])
    ratio = torch.tensor([2.0**-100, 2.0**-140, 2.0**-149, 0.0])  # p_min / p: normal, subnormal, the least, 0
    w = importance_weights(torch.full((4,), 2.0**100), 2.0**100 * ratio, 0.25)  # logs where the ratio < 2^-126
    torch.testing.assert_close(
        w.double(),
        torch.tensor([2.0**-25, 2.0**-35, 2.0 ** (-149 / 4), MIN_WEIGHT], dtype=torch.float64),
        rtol=1e-5,
        atol=0,
    )
    for p_min_, beta, want in [
        (PRIORITY_FLOOR, 0.5, [1.0, 1.0, MIN_WEIGHT, 2.0**-63]),  # (2^-126 / 3e38)^0.5 < 2^-126
        (PRIORITY_FLOOR, 1.0, [1.0, 1.0, MIN_WEIGHT, PRIORITY_FLOOR]),
        (float("inf"), 0.7, [1.0, 1.0, 1.0, 1.0]),
        (2.0, 1.0, [1.0, 1.0, MIN_WEIGHT, 1.0]),  # p_i < p_min: 1; 2 / 3e38 subnormal
        (PRIORITY_FLOOR, 0.0, [1.0, 1.0, 1.0, 1.0]),
    ]:
        w = importance_weights(special, torch.tensor(p_min_), beta)
        assert w.dtype == torch.float32 and torch.all(torch.isfinite(w)) and torch.all((w > 0) & (w <= 1))
        torch.testing.assert_close(w, torch.tensor(want), rtol=1e-5, atol=0)


def test_stratified_indices_are_find_with_mass_and_uniform_without() -> None:
    g = _gen(34)
    tree = SumTree(1000, "cpu")
    tree.update(torch.arange(700), torch.rand(700, generator=g) + 0.05)
    u = torch.rand(333, generator=g)
    strata = torch.arange(333, dtype=torch.float32)
    assert torch.equal(stratified_indices(tree, u, 700), tree.find((strata + u) * (tree.total() / 333)))
    tree.update(torch.arange(700), torch.zeros(700), floor=0.0)
    assert tree.total().item() == 0.0
    idx = stratified_indices(tree, u, 700)
    assert torch.equal(idx, ((strata.double() + u.double()) * 700 / 333).floor().long().clamp(max=699))
    assert torch.all((idx >= 0) & (idx < 700)) and torch.bincount(idx // 100).min() >= 40  # spread over the slots
