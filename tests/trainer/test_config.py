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


def test_dependent_launch_is_off_by_default():
    """Config.dependent_launch (issue 38's PDL lever, measured at nothing) is opt-in in the default and every preset."""
    assert Config().dependent_launch is False
    assert not any(preset(name).dependent_launch for name in PRESETS)
    with pytest.raises(ValueError, match="dependent_launch must be a bool"):
        Config(dependent_launch="yes")


def test_the_grouped_forward_is_off_by_default():
    """Config.grouped_forward (one launch per layer for the step's three forwards) is opt-in: the default and every
    preset keep the two-stream forward the gate's baselines were measured with."""
    assert Config().grouped_forward is False
    assert not any(preset(name).grouped_forward for name in PRESETS)
    with pytest.raises(ValueError, match="grouped_forward must be a bool"):
        Config(grouped_forward=1)


def test_seed_scale_matches_design_numbers():
    cfg = preset("seed-scale")
    assert (cfg.batch_size, cfg.obs_dim, cfg.replay_capacity, cfg.learner_steps_per_epoch) == (8192, 64, 2**20, 1000)
    net = BranchingDuelingQNet(cfg.obs_dim, cfg.action_nvec, cfg.trunk_hidden, cfg.head_hidden)
    assert len(net.weight_matrices()) == 10
    n_params = sum(p.numel() for p in net.parameters())
    assert 230_000 <= n_params <= 270_000, n_params


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("batch_size", 0, "batch_size must be a positive int"),
        ("gamma", 1.5, r"gamma must be in \[0, 1\]"),
        ("loss", "l1", "loss must be 'huber' or 'mse'"),
        ("tau", 0.0, r"tau must be in \(0, 1\]"),
        ("trunk_hidden", (), "trunk_hidden must be non-empty"),
        ("batch_size", 10**7, "exceeds config.replay_capacity"),
        ("lr", -1.0, "lr must be > 0"),
        ("td_target_max", -100.0, "td_target_max must be >= 0"),
        ("lr_end_factor", 1.5, r"lr_end_factor must be in \[0, 1\]"),
    ],
)
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
    assert parse_override("grouped-forward=true") == ("grouped_forward", True)
    with pytest.raises(ValueError, match="not of the form key=value"):
        parse_override("lr")
    with pytest.raises(ValueError, match="unknown config key 'nope'"):
        parse_override("nope=1")
    with pytest.raises(ValueError, match="batch_size takes a int, got str"):
        parse_override("batch_size=big")


def test_integral_floats_are_taken_for_int_fields():
    assert parse_override("replay_capacity=1e12") == ("replay_capacity", 10**12)
    assert parse_override("trunk_hidden=[1e6, 1e6]") == ("trunk_hidden", (10**6, 10**6))
    assert parse_override("trunk_hidden=64.0") == ("trunk_hidden", (64,))
    with pytest.raises(ValueError, match="batch_size takes a int, got float"):
        parse_override("batch_size=1.5")
    with pytest.raises(ValueError, match="a list of ints"):
        preset("cartpole", **dict([parse_override("trunk_hidden=[1.5]")]))
    deep = "[" * 10_000 + "]" * 10_000  # too deep for Python's parser: taken as a string, refused as one
    with pytest.raises(ValueError, match="trunk_hidden takes a tuple, got str"):
        parse_override(f"trunk_hidden={deep}")


def test_learning_starts_beyond_the_replay_is_refused_for_a_run():
    from hotloop.trainer.config import validate_run

    cfg = preset("cartpole", learning_starts=1000, replay_capacity=999)  # a Config still (learner-only tests)
    with pytest.raises(ValueError, match=r"config.learning_starts \(1000\) exceeds config.replay_capacity \(999\)"):
        validate_run(cfg)
    validate_run(preset("cartpole", learning_starts=999, replay_capacity=999))
    for name in PRESETS:
        validate_run(preset(name))


@pytest.mark.parametrize("seed", [2**70, 2**64, 2**62, 2**47, -1])
def test_a_seed_out_of_range_is_refused_naming_seed(seed):
    """Issue 41 item 5: the range is checked up front (2**62 passed before and crashed the first evaluation with
    "Overflow when unpacking long long": its env is reseeded with seed * 100003 + epoch, beyond uint64)."""
    from hotloop.trainer.config import SEED_LIMIT

    assert SEED_LIMIT == 2**47
    with pytest.raises(
        ValueError,
        match=r"^config.seed must be in \[0, 2\*\*47\) = \[0, 140737488355327\], got "
        + str(seed)
        + ": the per-epoch evaluation seeds its env with seed \\* 100003",
    ):
        preset("cartpole", seed=seed)
    assert preset("cartpole", seed=SEED_LIMIT - 1).seed == SEED_LIMIT - 1 and preset("cartpole", seed=0).seed == 0


@pytest.mark.parametrize(
    "argv", [["train", "--seed", str(2**70)], ["gate", "--set", f"seed={2**70}"], ["bench", "--seed", str(2**70)]]
)
def test_the_cli_refuses_a_seed_out_of_range_naming_seed_not_the_env(argv, tmp_path, capsys):
    """Before: "config.env 'cartpole' cannot be used: Overflow when unpacking long long" (exit 2, the wrong blame)."""
    from hotloop.guards.cli import main

    out = tmp_path / "run"
    assert main([*argv, "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: config.seed must be in [0, 2**47) = [0, 140737488355327], got {2**70}" in err
    assert "config.env" not in err and not out.exists()


def test_the_largest_seed_trains_and_evaluates(tmp_path):
    """The bound is enough: seed 2**47 - 1 runs an epoch and its greedy evaluation (seed * 100003 + 1 < 2**64)."""
    from hotloop.guards.cli import main
    from hotloop.trainer.config import SEED_LIMIT

    assert (
        main(
            [
                "train",
                "--seed",
                str(SEED_LIMIT - 1),
                "--epochs",
                "1",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "run"),
                "--set",
                "learner_steps_per_epoch=20",
                "--set",
                "learning_starts=64",
                "--set",
                "batch_size=32",
                "--set",
                "trunk_hidden=[16]",
                "--set",
                "head_hidden=8",
                "--set",
                "eval_episodes=4",
                "--no-progress",
            ]
        )
        == 0
    )


def test_config_files_that_cannot_be_read_name_the_file(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text('{"lr": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ValueError, match=r"c\.json: nested too deep to read"):
        Config.load(bad)
    bad.write_bytes(b'{"lr": "\xff"}')
    with pytest.raises(ValueError, match=r"config file .*c\.json: 'utf-8' codec can't decode"):
        Config.load(bad)
    bad.write_text('{"replay_capacity": ' + "9" * 5000 + "}")
    with pytest.raises(ValueError, match=r"config file .*c\.json: .*(digits|integer string conversion)"):
        Config.load(bad)
    bad.write_text('{"replay_capacity": 1e400}')
    with pytest.raises(ValueError, match="replay_capacity must be an int, got inf"):
        Config.load(bad)


def test_type_errors_show_a_short_value():
    with pytest.raises(ValueError) as exc:
        preset("cartpole", env=["x" * 10_000] * 1000)
    assert len(str(exc.value)) < 300 and "config.env must be a str" in str(exc.value)
