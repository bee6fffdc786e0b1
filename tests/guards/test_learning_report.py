"""`hotloop learning`: one process per (learner, seed), the table computed from each run's own epochs.csv, the
summary counts, a failed run kept in the table with exit 1, and bad input refused before anything runs."""

import math

import pandas as pd
import pytest
import torch

from hotloop.guards.cli import main
from hotloop.guards.learning_report import parse_seeds, plan_runs
from hotloop.profiles.learning_table import LEARNING_COLUMNS, learning_row, summary

TINY = [
    "--set",
    "epochs=2",
    "--set",
    "learner_steps_per_epoch=20",
    "--set",
    "learning_starts=64",
    "--set",
    "batch_size=16",
    "--set",
    "eval_episodes=2",
    "--set",
    "replay_capacity=500",
    "--set",
    "trunk_hidden=[16]",
    "--set",
    "head_hidden=8",
]


def _epochs(returns, evals=None, wall=1.0):
    n = len(returns)
    return pd.DataFrame(
        dict(
            epoch=range(1, n + 1),
            learner_steps=[100] * n,
            env_steps=[400] * n,
            wall_s=[wall] * n,
            mean_return_100=returns,
            eval_return=evals or returns,
            best_epoch=range(1, n + 1),
        )
    )


def test_learning_row_reads_solved_held_and_collapse():
    row = learning_row(
        _epochs([100.0, 480.0, 500.0, 490.0]), seed=3, learner="hotloop", device="cuda", process_wall_s=9.0
    )
    assert (row["steps_to_475"], row["env_steps_to_475"], row["wall_s_to_475"]) == (200, 800, 2.0)
    assert row["solved"] and row["held"] and row["best"] == 500.0 and row["last3_mean"] == pytest.approx(490.0)
    collapsed = learning_row(_epochs([200.0, 478.0, 300.0, 27.0]), seed=2, learner="hotloop", device="cuda")
    assert collapsed["solved"] and not collapsed["held"] and collapsed["final_eval"] == 27.0
    never = learning_row(_epochs([10.0, 20.0]), seed=1, learner="reference", device="cpu")
    assert not never["solved"] and math.isnan(never["steps_to_475"])
    crashed = learning_row(pd.DataFrame(), seed=4, learner="hotloop", device="cuda", status="exit 70")
    assert crashed["epochs"] == 0 and crashed["status"] == "exit 70" and not crashed["solved"]
    table = pd.DataFrame([row, collapsed, never, crashed], columns=LEARNING_COLUMNS)
    s = summary(table).set_index("learner")
    assert (s.loc["hotloop", "runs"], s.loc["hotloop", "solved"], s.loc["hotloop", "held"]) == (3, 2, 1)
    assert s.loc["hotloop", "median_wall_s_to_475"] == 2.0 and s.loc["reference", "solved"] == 0
    with pytest.raises(ValueError, match="lacks columns"):
        learning_row(pd.DataFrame({"epoch": [1]}), seed=1, learner="x", device="cpu")


def test_the_hotloop_runs_name_the_device_they_resolve_to(tmp_path):
    import argparse

    args = argparse.Namespace(
        learners=None, device=None, reference_device="cpu", jobs=1, run_timeout=10.0, out=tmp_path / "out", seeds="1"
    )
    assert {(r.learner, r.device) for r in plan_runs(args, cuda=True)} == {("hotloop", "cuda"), ("reference", "cpu")}
    args.device = "auto"
    assert [r.device for r in plan_runs(args, cuda=True) if r.learner == "hotloop"] == ["cuda"]
    args.device, args.learners = "cuda:1", "hotloop"
    assert [r.device for r in plan_runs(args, cuda=True)] == ["cuda:1"]
    args.device, args.learners, args.reference_device = None, "reference", "auto"
    assert [r.device for r in plan_runs(args, cuda=True)] == ["cuda"]
    assert [r.device for r in plan_runs(args, cuda=False)] == ["cpu"]


def test_a_hotloop_run_off_cuda_is_refused_before_any_run(tmp_path):
    import argparse

    args = argparse.Namespace(
        learners="hotloop",
        device="cpu",
        reference_device="cpu",
        jobs=1,
        run_timeout=10.0,
        out=tmp_path / "out",
        seeds="1",
    )
    with pytest.raises(ValueError, match="--device is cpu"):  # a CUDA machine, the runs asked for on its CPU
        plan_runs(args, cuda=True)
    args.device = None
    with pytest.raises(ValueError, match="this machine has none"):
        plan_runs(args, cuda=False)


def test_parse_seeds():
    assert parse_seeds("1-3,9,2") == [1, 2, 3, 9]
    for bad in ("", "3-1", "a", "1,-2"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_the_report_runs_each_seed_in_its_own_process_and_tables_its_epochs(tmp_path, capsys):
    out = tmp_path / "report"
    assert (
        main(
            [
                "learning",
                "--preset",
                "cartpole",
                "--seeds",
                "1-2",
                "--learners",
                "reference",
                "--jobs",
                "2",
                *TINY,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = pd.read_csv(out / "learning.csv")
    assert list(table.columns) == LEARNING_COLUMNS and table.seed.tolist() == [1, 2]
    for _, row in table.iterrows():  # each row is its own run's epochs.csv, read back independently
        epochs = pd.read_csv(out / "runs" / f"reference_s{row.seed}" / "epochs.csv")
        assert row.epochs == len(epochs) == 2 and row.best == epochs.mean_return_100.max()
        assert row.final_eval == epochs.eval_return.iloc[-1] and row.process_wall_s > 0
    runs = [pd.read_csv(out / "runs" / f"reference_s{s}" / "epochs.csv") for s in (1, 2)]
    assert not runs[0].mean_return_100.equals(runs[1].mean_return_100)  # the seeds differ
    assert pd.read_csv(out / "summary.csv").runs.tolist() == [2] and (out / "learning.md").is_file()
    assert "learning tables in" in capsys.readouterr().out


def test_a_failed_run_stays_in_the_table_and_exits_1(tmp_path):
    out = tmp_path / "report"
    code = main(
        [
            "learning",
            "--preset",
            "cartpole",
            "--seeds",
            "5",
            "--learners",
            "reference",
            *TINY,
            "--run-timeout",
            "0.5",
            "--out",
            str(out),
        ]
    )
    table = pd.read_csv(out / "learning.csv")
    assert code == 1 and table.status.tolist() == ["timed out after 0.5 s"]


@pytest.mark.parametrize(
    "args, match",
    [
        (["--seeds", "x"], "--seeds"),
        (["--learners", "dqn"], "--learners"),
        (["--learners", "hotloop"], "needs a CUDA device"),
        (["--set", "seed=3"], "chosen by the report"),
        (["--set", "lr=-1"], "config.lr"),
        (["--preset", "nope"], "unknown preset"),
        (["--jobs", "0"], "--jobs"),
    ],
)
def test_bad_input_exits_2_before_any_run(tmp_path, capsys, monkeypatch, args, match):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU machine's answer, also on a GPU one
    out = tmp_path / "report"
    learners = [] if "--learners" in args else ["--learners", "reference"]
    assert main(["learning", *learners, *args, "--out", str(out)]) == 2
    assert match in capsys.readouterr().err and not out.exists()


def test_a_non_empty_out_is_refused_and_kept(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["learning", "--learners", "reference", "--out", str(tmp_path)]) == 2
    assert "new or empty" in capsys.readouterr().err and (tmp_path / "keep.txt").read_text() == "mine"
