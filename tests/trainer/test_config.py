import json

import pytest

from hotloop.trainer.config import PRESETS, Config, field_docs, field_names, parse_override, preset
from hotloop.trainer.network import BranchingDuelingQNet


@pytest.mark.smoke
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trip_dict_and_json(name, tmp_path):
    cfg = preset(name, seed=7)
    assert Config.from_dict(cfg.to_dict()) == cfg
    path = tmp_path / "config.json"
    cfg.save(path)
    assert Config.load(path) == cfg
    assert json.loads(path.read_text())["seed"] == 7


def test_every_field_has_a_docstring():
    docs = field_docs()
    assert set(docs) == set(field_names())
    assert all(len(d) > 10 for d in docs.values())


def test_seed_scale_matches_design_numbers():
    cfg = preset("seed-scale")
    assert (cfg.batch_size, cfg.obs_dim, cfg.replay_capacity, cfg.learner_steps_per_epoch) == (8192, 64, 2**20, 1000)
    net = BranchingDuelingQNet(cfg.obs_dim, cfg.action_nvec, cfg.trunk_hidden, cfg.head_hidden)
    assert len(net.weight_matrices()) == 10
    n_params = sum(p.numel() for p in net.parameters())
    assert 230_000 <= n_params <= 270_000, n_params


@pytest.mark.parametrize("key,value,match", [
    ("batch_size", 0, "batch_size must be a positive int"),
    ("gamma", 1.5, r"gamma must be in \[0, 1\]"),
    ("loss", "l1", "loss must be 'huber' or 'mse'"),
    ("tau", 0.0, r"tau must be in \(0, 1\]"),
    ("trunk_hidden", (), "trunk_hidden must be non-empty"),
    ("batch_size", 10**7, "exceeds config.replay_capacity"),
    ("lr", -1.0, "lr must be > 0"),
])
def test_bad_values_name_the_field(key, value, match):
    with pytest.raises(ValueError, match=match):
        preset("cartpole", **{key: value})


def test_unknown_keys_and_presets_are_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config keys \['bogus'\]"):
        Config.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        preset("nope")
    bad = tmp_path / "c.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        Config.load(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="c.json"):
        Config.load(bad)


def test_parse_override():
    assert parse_override("lr=0.001") == ("lr", 0.001)
    assert parse_override("lr=1") == ("lr", 1.0)
    assert parse_override("trunk-hidden=[32, 32]") == ("trunk_hidden", (32, 32))
    assert parse_override("env=gym:CartPole-v1") == ("env", "gym:CartPole-v1")
    with pytest.raises(ValueError, match="not of the form key=value"):
        parse_override("lr")
    with pytest.raises(ValueError, match="unknown config key 'nope'"):
        parse_override("nope=1")
    with pytest.raises(ValueError, match="batch_size takes a int, got str"):
        parse_override("batch_size=big")
