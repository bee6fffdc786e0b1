"""Zero priorities and PER importance weights (issue 22, item 7), on both paths of `PrioritizedReplay`: the torch
tree (use_kernels=False) and the Triton kernels (use_kernels=True; the interpreter on CPU).

The rule (hotloop.kernels.sum_tree, module docstring): written priorities are floored at PRIORITY_FLOOR = 2^-126;
p_min is the smallest priority > 0 of the batch / of the stored leaves; weights are clamped into [MIN_WEIGHT, 1];
a tree with no mass samples uniformly over the filled slots with weights 1; Config refuses per_eps / per_alpha
whose eps^alpha is not a normal float32. Zero leaves are made by writing the tree's leaves directly and rebuilding
(as a loaded old checkpoint would hold them): the replay's own API can no longer write one. Every other priority
is fresh seeded random input.
"""

from __future__ import annotations

import math

import pytest
import torch

from hotloop.kernels.sum_tree import MIN_WEIGHT, PRIORITY_FLOOR
from hotloop.trainer.config import Config, preset
from hotloop.trainer.replay import PrioritizedReplay

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CAPACITY, FILLED, OBS_DIM, BRANCHES, BATCH = 200, 150, 3, 2, 96
PATHS = [pytest.param(False, id="torch"), pytest.param(True, id="kernels")]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def _replay(
    use_kernels: bool, seed: int, alpha: float = 0.6, eps: float = 1e-6, n: int = FILLED, td: torch.Tensor | None = None
) -> PrioritizedReplay:
    """A replay of CAPACITY slots holding n random transitions whose priorities were set from random TD errors
    (or from `td`) through `update_priorities`."""
    g = _gen(seed)
    replay = PrioritizedReplay(
        CAPACITY, OBS_DIM, BRANCHES, alpha=alpha, eps=eps, device=DEV, generator=_gen(seed + 1), use_kernels=use_kernels
    )
    replay.add(
        torch.randn(n, OBS_DIM, generator=g, device=DEV),
        torch.randint(0, 4, (n, BRANCHES), generator=g, device=DEV),
        torch.randn(n, generator=g, device=DEV),
        torch.randn(n, OBS_DIM, generator=g, device=DEV),
        torch.rand(n, generator=g, device=DEV) < 0.2,
    )
    if td is None:
        td = torch.randn(n, generator=g, device=DEV) * 2
    replay.update_priorities(torch.arange(n, device=DEV), td)
    return replay


def _set_leaves(replay: PrioritizedReplay, slots: torch.Tensor, value: float) -> None:
    """Write leaves directly (bypassing the floor, as an old checkpoint's tree would hold them) and rebuild."""
    tree = replay.tree
    tree.nodes[tree.num_leaves + slots] = value
    tree.rebuild()


def _uniforms(replay: PrioritizedReplay, batch: int) -> torch.Tensor:
    """The uniforms the next `sample(batch, ...)` draws (the generator is left where it was)."""
    state = replay.generator.get_state()
    u = torch.rand(batch, generator=replay.generator, device=DEV)
    replay.generator.set_state(state)
    return u


def _assert_valid_weights(w: torch.Tensor) -> None:
    assert w.dtype == torch.float32 and w.shape == (BATCH,)
    assert torch.all(torch.isfinite(w)) and torch.all(w > 0) and torch.all(w <= 1), w


@pytest.mark.parametrize("use_kernels", PATHS)
@pytest.mark.parametrize("beta", [0.4, 1.0])
def test_one_zero_leaf_with_global_norm_keeps_weights_finite_positive_and_not_all_zero(use_kernels, beta) -> None:
    replay = _replay(use_kernels, seed=3)
    zero = torch.tensor([17], device=DEV)
    _set_leaves(replay, zero, 0.0)
    batch = replay.sample(BATCH, beta=beta, weight_norm="global")
    _assert_valid_weights(batch.weights)
    assert not torch.any(batch.indices == 17)  # a zero leaf is not sampled
    assert torch.all(batch.indices < FILLED)
    # the standard formula with p_min over the stored leaves > 0: w_i = (p_min / p_i)^beta
    leaves = replay.tree.leaves()[:FILLED].double()
    p_min = leaves[leaves > 0].min()
    want = (p_min / leaves[batch.indices]) ** beta
    torch.testing.assert_close(batch.weights.double(), want, rtol=2e-5, atol=0)
    assert batch.weights.min() < 1  # real (not flattened) weights


@pytest.mark.parametrize("weight_norm", ["batch", "global"])
def test_zero_leaf_weights_are_the_same_on_both_paths(weight_norm: str) -> None:
    pair = [_replay(k, seed=9) for k in (False, True)]
    zeros = torch.tensor([0, 5, 77, FILLED - 1], device=DEV)
    for replay in pair:
        _set_leaves(replay, zeros, 0.0)
    torch.testing.assert_close(pair[0].tree.nodes, pair[1].tree.nodes, rtol=1e-6, atol=0)
    a, b = (replay.sample(BATCH, beta=0.6, weight_norm=weight_norm) for replay in pair)
    assert torch.equal(a.indices, b.indices)
    torch.testing.assert_close(a.weights, b.weights, rtol=1e-5, atol=0)
    _assert_valid_weights(a.weights)
    _assert_valid_weights(b.weights)


@pytest.mark.parametrize("use_kernels", PATHS)
@pytest.mark.parametrize("weight_norm", ["batch", "global"])
def test_all_zero_tree_samples_uniformly_over_the_filled_slots_with_unit_weights(use_kernels, weight_norm) -> None:
    replay = _replay(use_kernels, seed=5)
    _set_leaves(replay, torch.arange(CAPACITY, device=DEV), 0.0)
    assert float(replay.tree.total()) == 0.0
    u = _uniforms(replay, BATCH)
    batch = replay.sample(BATCH, beta=0.7, weight_norm=weight_norm)
    assert torch.equal(batch.weights, torch.ones(BATCH, device=DEV))
    assert torch.all((batch.indices >= 0) & (batch.indices < FILLED))  # valid: filled slots only
    # stratified uniform: index_k = min(floor((k + u_k) * N / B), N - 1)
    k = torch.arange(BATCH, device=DEV, dtype=torch.float64)
    want = ((k + u.double()) * FILLED / BATCH).floor().long().clamp(max=FILLED - 1)
    assert torch.equal(batch.indices, want)
    assert torch.equal(batch.obs, replay.obs[want])


@pytest.mark.parametrize(
    "eps,alpha", [(1e-30, 2.0), (1e-20, 2.0), (1e-39, 0.5), (1e-10, 4.0), (10.0, 40.0), (1e300, 0.5)]
)
def test_config_refuses_per_eps_and_alpha_whose_power_is_not_a_normal_float32(eps: float, alpha: float) -> None:
    with pytest.raises(ValueError, match="config.per_eps"):
        Config(per_eps=eps, per_alpha=alpha)
    with pytest.raises(ValueError, match="config.per_eps"):
        preset("seed-scale", per_eps=eps, per_alpha=alpha)


def test_config_names_both_fields_and_the_value_of_eps_to_the_alpha() -> None:
    with pytest.raises(ValueError, match=r"config\.per_eps \*\* config\.per_alpha = 1e-30 \*\* 2\.0 = 1\.0+\d*e-60"):
        Config(per_eps=1e-30, per_alpha=2.0)


@pytest.mark.parametrize(
    "eps,alpha", [(1e-6, 0.6), (1e-30, 1.0), (2.0**-126, 1.0), (1e-30, 0.0), (1e-12, 3.0), (3.0, 80.0)]
)
def test_config_accepts_per_eps_and_alpha_within_float32(eps: float, alpha: float) -> None:
    assert eps**alpha >= PRIORITY_FLOOR
    cfg = Config(per_eps=eps, per_alpha=alpha)
    assert (cfg.per_eps, cfg.per_alpha) == (eps, alpha)


def test_config_bounds_are_the_tree_floor() -> None:
    from hotloop.trainer import config

    assert config._F32_TINY == PRIORITY_FLOOR == MIN_WEIGHT == torch.finfo(torch.float32).tiny
    assert config._F32_MAX == torch.finfo(torch.float32).max


@pytest.mark.parametrize("use_kernels", PATHS)
def test_zero_td_error_through_update_priorities_never_writes_a_zero_leaf(use_kernels) -> None:
    """eps=1e-30, alpha=2 (which Config refuses): (0 + 1e-30)^2 = 1e-60 underflows float32 to 0; the tree stores
    the floor 2^-126 instead, and sampling stays finite."""
    g = _gen(21)
    td = torch.randn(FILLED, generator=g, device=DEV) * 2
    zero_slots = torch.randperm(FILLED, generator=g, device=DEV)[:20]
    td[zero_slots] = 0.0
    td[zero_slots[:5]] = -0.0
    replay = _replay(use_kernels, seed=21, alpha=2.0, eps=1e-30, td=td)
    leaves = replay.tree.leaves()
    assert torch.all(leaves[:FILLED] > 0)
    assert torch.all(leaves[zero_slots] == PRIORITY_FLOOR)
    others = torch.ones(FILLED, dtype=torch.bool, device=DEV)
    others[zero_slots] = False
    want = (td.abs() + 1e-30).pow(2.0)  # the float32 formula, where it does not underflow
    torch.testing.assert_close(leaves[:FILLED][others], want[others], rtol=1e-6, atol=0)
    assert int(replay.bad_priority_count) == 0  # a zero TD error is valid, not sanitized
    # the same through a second update of sampled slots
    batch = replay.sample(BATCH, beta=0.5)
    replay.update_priorities(batch.indices, torch.zeros(BATCH, device=DEV))
    assert torch.all(replay.tree.leaves()[batch.indices] == PRIORITY_FLOOR)
    assert torch.all(replay.tree.leaves()[:FILLED] > 0)
    for weight_norm in ("batch", "global"):
        w = replay.sample(BATCH, beta=0.5, weight_norm=weight_norm).weights
        _assert_valid_weights(w)


@pytest.mark.parametrize("use_kernels", PATHS)
def test_every_td_error_zero_still_samples_with_unit_weights(use_kernels) -> None:
    """All leaves floored (the tree has mass 150 * 2^-126 > 0): proportional sampling among equal leaves, weights 1."""
    replay = _replay(use_kernels, seed=8, alpha=2.0, eps=1e-30, td=torch.zeros(FILLED, device=DEV))
    assert torch.all(replay.tree.leaves()[:FILLED] == PRIORITY_FLOOR)
    for weight_norm in ("batch", "global"):
        batch = replay.sample(BATCH, beta=1.0, weight_norm=weight_norm)
        assert torch.all(batch.indices < FILLED)
        assert torch.equal(batch.weights, torch.ones(BATCH, device=DEV))


@pytest.mark.parametrize("use_kernels", PATHS)
def test_extreme_priority_ratio_weights_stay_in_the_unit_interval(use_kernels) -> None:
    """Leaves 2^-126 next to 1e38: (p_min / p)^1 underflows float32; the weight is clamped to MIN_WEIGHT, not 0."""
    g = _gen(13)
    td = torch.rand(FILLED, generator=g, device=DEV) * 1e18 + 1e17  # priorities (|td| + eps)^2 in [1e34, 1.2e36]
    td[::7] = 0.0
    replay = _replay(use_kernels, seed=13, alpha=2.0, eps=1e-30, td=td)
    assert math.isfinite(float(replay.tree.total()))
    for beta in (0.4, 1.0):
        w = replay.sample(BATCH, beta=beta, weight_norm="global").weights
        _assert_valid_weights(w)
        if beta == 1.0:
            assert torch.all(w == MIN_WEIGHT)  # every sampled leaf is >= 1e34 / 2^-126 times p_min
