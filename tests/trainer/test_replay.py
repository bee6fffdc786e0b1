"""Unit tests of `hotloop.trainer.replay.PrioritizedReplay` (CPU, seeded random non-zero inputs)."""

from __future__ import annotations

import io

import pytest
import torch
from scipy.stats import chisquare

from hotloop.trainer.replay import PrioritizedBatch, PrioritizedReplay

OBS_DIM, BRANCHES = 3, 2


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _transitions(n: int, g: torch.Generator, branches: int = BRANCHES) -> dict[str, torch.Tensor]:
    """n random transitions with no zero entries (so a slot that was never written is recognizable)."""
    return {
        "obs": torch.rand(n, OBS_DIM, generator=g) + 1.0,
        "action": torch.randint(1, 6, (n, branches), generator=g),
        "reward": torch.rand(n, generator=g) + 0.1,
        "next_obs": torch.rand(n, OBS_DIM, generator=g) + 1.0,
        "terminated": torch.rand(n, generator=g) < 0.5,
    }


def _filled(capacity: int, n: int, seed: int, alpha: float = 0.6) -> tuple[PrioritizedReplay, torch.Tensor]:
    """A replay holding n transitions whose priorities were set from random TD errors (returned, float32)."""
    g = _gen(seed)
    replay = PrioritizedReplay(capacity, OBS_DIM, BRANCHES, alpha=alpha, generator=_gen(seed + 1))
    replay.add(**_transitions(n, g))
    td = (torch.rand(n, generator=g) * 5 + 0.05) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    replay.update_priorities(torch.arange(n), td)
    return replay, td


def _assert_slot_holds(replay: PrioritizedReplay, slot: int, data: dict[str, torch.Tensor], i: int) -> None:
    assert torch.equal(replay.obs[slot], data["obs"][i])
    assert torch.equal(replay.action[slot], data["action"][i])
    assert torch.equal(replay.reward[slot], data["reward"][i])
    assert torch.equal(replay.next_obs[slot], data["next_obs"][i])
    assert replay.terminated[slot].item() == float(data["terminated"][i])


@pytest.mark.smoke
def test_add_stores_transitions_and_new_items_get_max_priority() -> None:
    g = _gen(0)
    replay = PrioritizedReplay(8, OBS_DIM, BRANCHES)
    assert replay.max_priority.item() == 1.0 and len(replay) == 0
    first = _transitions(3, g)
    replay.add(**first)
    assert len(replay) == 3 and replay.pos == 3
    assert replay.tree.leaves().tolist() == [1.0] * 3 + [0.0] * 5
    for i in range(3):
        _assert_slot_holds(replay, i, first, i)
    assert replay.terminated.dtype == torch.float32 and replay.action.dtype == torch.int64
    replay.update_priorities(torch.tensor([1]), torch.tensor([-9.0]))
    top = (9.0 + 1e-6) ** 0.6
    assert replay.max_priority.item() == pytest.approx(top, rel=1e-6)
    replay.add(**_transitions(2, g))
    torch.testing.assert_close(replay.tree.leaves()[3:5], replay.max_priority.expand(2), rtol=0, atol=0)
    assert replay.tree.leaves()[5:].tolist() == [0.0] * 3


def test_ring_wraparound_overwrites_oldest() -> None:
    g = _gen(1)
    replay = PrioritizedReplay(5, OBS_DIM, BRANCHES)
    first, second = _transitions(3, g), _transitions(4, g)
    replay.add(**first)
    replay.add(**second)  # slots 3, 4, 0, 1
    assert replay.pos == 2 and len(replay) == 5
    for slot, i in zip([3, 4, 0, 1], range(4)):
        _assert_slot_holds(replay, slot, second, i)
    _assert_slot_holds(replay, 2, first, 2)
    assert torch.all(replay.tree.leaves() == 1.0)


def test_write_follows_the_device_position_and_note_added_the_host_counters() -> None:
    g = _gen(3)
    replay = PrioritizedReplay(5, OBS_DIM, BRANCHES)
    first, second = _transitions(3, g), _transitions(4, g)
    replay.add(**first)
    assert replay.write(**second) == 4  # slots 3, 4, 0, 1: the device position moved, the host counters did not
    assert int(replay.pos_t) == 2 and (replay.pos, len(replay)) == (3, 3)
    for slot, i in zip([3, 4, 0, 1], range(4)):
        _assert_slot_holds(replay, slot, second, i)
    replay.note_added(4)
    assert (replay.pos, len(replay)) == (2, 5)
    state = replay.state_dict()
    fresh = PrioritizedReplay(5, OBS_DIM, BRANCHES)
    fresh.load_state_dict(state)
    assert int(fresh.pos_t) == fresh.pos == 2  # a resumed buffer writes on where the saved one stopped
    kept = replay._aranges[4]
    replay.add(**_transitions(2, g))  # another batch size: the first size's slot offsets stay (a graph reads them)
    replay.add(**_transitions(4, g))  # and the same size reuses them
    assert replay._aranges[4] is kept and set(replay._aranges) == {2, 3, 4}


def test_add_more_than_capacity_keeps_the_last_capacity() -> None:
    g = _gen(2)
    replay = PrioritizedReplay(5, OBS_DIM, BRANCHES)
    replay.add(**_transitions(2, g))
    big = _transitions(12, g)
    replay.add(**big)  # as if added one by one from pos 2: item j lands in slot (2 + j) % 5
    assert replay.pos == (2 + 12) % 5 and len(replay) == 5
    for j in range(7, 12):
        _assert_slot_holds(replay, (2 + j) % 5, big, j)
    assert torch.all(replay.tree.leaves() == 1.0)


def test_single_branch_accepts_flat_actions() -> None:
    data = _transitions(4, _gen(3), branches=1)
    data["action"] = data["action"][:, 0].to(torch.int32)
    replay = PrioritizedReplay(6, OBS_DIM, 1)
    replay.add(**data)
    assert torch.equal(replay.action[:4, 0], data["action"].to(torch.int64))


def test_sampling_frequencies_match_priorities_chi_square() -> None:
    alpha, capacity = 0.6, 64
    replay, td = _filled(capacity, capacity, seed=4, alpha=alpha)
    counts = torch.zeros(capacity, dtype=torch.float64)
    for _ in range(100):
        counts += torch.bincount(replay.sample(2000, beta=0.5).indices, minlength=capacity).double()
    p = td.double().abs() + replay.eps

    def expected(a: float) -> torch.Tensor:
        return p**a / (p**a).sum() * counts.sum()

    assert chisquare(counts.numpy(), expected(alpha).numpy()).pvalue > 1e-3
    assert chisquare(counts.numpy(), expected(0.5).numpy()).pvalue < 1e-10  # the test can tell a wrong alpha


def test_importance_weights_match_float64_formula() -> None:
    alpha, beta, n = 0.6, 0.4, 20
    replay, td = _filled(32, n, seed=5, alpha=alpha)  # partly filled: N = 20 < capacity
    batch = replay.sample(256, beta=beta)
    assert isinstance(batch, PrioritizedBatch) and batch.weights.dtype == torch.float32
    assert torch.all(batch.indices < n)
    prob = (td.double().abs() + replay.eps) ** alpha
    prob = prob / prob.sum()
    w = (n * prob[batch.indices]) ** -beta
    torch.testing.assert_close(batch.weights.double(), w / w.max(), rtol=1e-5, atol=0)
    replay.generator.manual_seed(99)
    global_batch = replay.sample(256, beta=beta, weight_norm="global")
    w_global = (n * prob[global_batch.indices]) ** -beta / (n * prob.min()) ** -beta
    torch.testing.assert_close(global_batch.weights.double(), w_global, rtol=1e-5, atol=0)
    assert torch.all(replay.sample(64, beta=0.0).weights == 1.0)


def test_sampled_batch_gathers_storage() -> None:
    replay, _ = _filled(16, 16, seed=6)
    batch = replay.sample(32, beta=1.0)
    idx = batch.indices
    assert batch.obs.shape == (32, OBS_DIM) and batch.action.shape == (32, BRANCHES) and idx.dtype == torch.int64
    stored = (replay.obs, replay.action, replay.reward, replay.next_obs, replay.terminated)
    for got, store in zip(batch[:5], stored):
        assert torch.equal(got, store[idx])


def test_update_priorities_formula_max_and_sanitize() -> None:
    replay, td = _filled(10, 10, seed=7, alpha=0.5)
    expected = (td.abs() + 1e-6) ** 0.5
    torch.testing.assert_close(replay.tree.leaves(), expected, rtol=1e-6, atol=0)
    assert replay.max_priority.item() == pytest.approx(max(1.0, expected.max().item()), rel=1e-6)
    replay.update_priorities(torch.tensor([0, 3, 3]), torch.tensor([float("nan"), 2.0, float("inf")]))
    assert replay.bad_priority_count.item() == 2
    assert replay.tree.leaves()[0] == replay.max_priority and replay.tree.leaves()[3] == replay.max_priority


def test_state_dict_round_trip_reproduces_sampling() -> None:
    replay, _ = _filled(12, 9, seed=8)
    buffer = io.BytesIO()
    torch.save(replay.state_dict(), buffer)
    buffer.seek(0)
    other = PrioritizedReplay(12, OBS_DIM, BRANCHES, generator=_gen(0))
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert (other.pos, other.size) == (replay.pos, replay.size)
    assert torch.equal(other.tree.nodes, replay.tree.nodes)
    replay.generator.manual_seed(5)
    other.generator.manual_seed(5)
    for a, b in zip(replay.sample(16, 0.5), other.sample(16, 0.5)):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"obs": torch.ones(13, OBS_DIM)}, "obs"),
        ({"alpha": 0.7}, "alpha"),
        ({"pos": 12}, "pos"),
        ({"size": -1}, "size"),
        ({"tree.nodes": torch.ones(16, dtype=torch.float64)}, "tree.nodes"),
    ],
)
def test_load_state_dict_rejects_bad_state(patch: dict, match: str) -> None:
    replay, _ = _filled(12, 9, seed=9)
    state = {**replay.state_dict(), **patch}
    fresh = PrioritizedReplay(12, OBS_DIM, BRANCHES)
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(state)
    assert len(fresh) == 0 and torch.all(fresh.obs == 0)  # nothing was changed
    with pytest.raises(ValueError, match="missing"):
        fresh.load_state_dict({})


def _add_with(**overrides) -> None:
    replay = PrioritizedReplay(8, OBS_DIM, BRANCHES)
    replay.add(**{**_transitions(4, _gen(10)), **overrides})


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: PrioritizedReplay(0, OBS_DIM, BRANCHES), "capacity"),
        (lambda: PrioritizedReplay(8, 0, BRANCHES), "obs_dim"),
        (lambda: PrioritizedReplay(8, OBS_DIM, 1.5), "num_branches"),
        (lambda: PrioritizedReplay(8, OBS_DIM, BRANCHES, alpha=-0.1), "alpha"),
        (lambda: PrioritizedReplay(8, OBS_DIM, BRANCHES, alpha=float("nan")), "alpha"),
        (lambda: PrioritizedReplay(8, OBS_DIM, BRANCHES, eps=0.0), "eps"),
        (lambda: PrioritizedReplay(8, OBS_DIM, BRANCHES, obs_dtype="float32"), "obs_dtype"),
        (lambda: PrioritizedReplay(8, OBS_DIM, BRANCHES, device="meta", generator=_gen(0)), "generator"),
        (lambda: _add_with(obs=torch.ones(4, OBS_DIM + 1)), "obs"),
        (lambda: _add_with(obs=torch.ones(4, OBS_DIM, dtype=torch.float64)), "obs"),
        (lambda: _add_with(obs=torch.ones(4, OBS_DIM, device="meta")), "obs"),
        (lambda: _add_with(action=torch.ones(4, BRANCHES)), "action"),
        (lambda: _add_with(action=torch.ones(4, dtype=torch.int64)), "action"),
        (lambda: _add_with(reward=torch.ones(4, 1)), "reward"),
        (lambda: _add_with(reward=torch.ones(4, dtype=torch.int64)), "reward"),
        (lambda: _add_with(next_obs=torch.ones(3, OBS_DIM)), "next_obs"),
        (lambda: _add_with(terminated=torch.ones(5)), "terminated"),
        (lambda: _add_with(terminated=torch.ones(4, dtype=torch.int64)), "terminated"),
        (lambda: PrioritizedReplay(8, OBS_DIM, BRANCHES).sample(4, 0.5), "empty"),
        (lambda: _filled(8, 4, 11)[0].sample(0, 0.5), "batch_size"),
        (lambda: _filled(8, 4, 11)[0].sample(4, -0.1), "beta"),
        (lambda: _filled(8, 4, 11)[0].sample(4, 1.1), "beta"),
        (lambda: _filled(8, 4, 11)[0].sample(4, 0.5, weight_norm="max"), "weight_norm"),
        (lambda: _filled(8, 4, 11)[0].update_priorities(torch.tensor([0.0]), torch.ones(1)), "indices"),
        (lambda: _filled(8, 4, 11)[0].update_priorities(torch.tensor([0, 1]), torch.ones(3)), "td_errors"),
        (lambda: _filled(8, 4, 11)[0].update_priorities(torch.tensor([0]), torch.ones(1, device="meta")), "td_errors"),
    ],
)
def test_value_errors(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()
