"""`hotloop report`: one run's table, two runs compared (medians, ratios), and every bad input -> exit 2."""

import math

import pandas as pd
import pytest

from hotloop.guards.cli import main
from hotloop.profiles.epoch_table import EPOCH_COLUMNS, epoch_frame, write_table
from hotloop.profiles.report import compare_runs


def make_run(path, wall_s, extra=None):
    path.mkdir(parents=True)
    rows = [
        {
            **{c: 1.0 for c in EPOCH_COLUMNS},
            "epoch": e,
            "learner_steps": 100,
            "wall_s": w,
            "learner_steps_per_s": 100 / w,
            **(extra or {}),
        }
        for e, w in enumerate(wall_s, 1)
    ]
    write_table(epoch_frame(rows), path, "epochs")
    return path


@pytest.mark.smoke
def test_report_prints_one_run_plain_and_markdown(tmp_path, capsys):
    run = make_run(tmp_path / "a", [2.0, 4.0])
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"Per-epoch table of {run} (2 epochs)" in out and "learner_steps_per_s" in out and "|" not in out
    assert main(["report", str(run / "epochs.csv"), "--markdown"]) == 0
    assert "\n|   epoch |" in capsys.readouterr().out


def test_report_compares_medians_with_ratios(tmp_path, capsys):
    a = make_run(tmp_path / "a", [2.0, 4.0, 3.0], {"gpu_ms_per_step": 5.0, "clocks_event_reasons": "none"})
    b = make_run(
        tmp_path / "b", [1.0, 2.0], {"gpu_ms_per_step": 2.5, "only_b": 7.0, "clocks_event_reasons": "sw_power_cap"}
    )
    cmp = compare_runs(pd.read_csv(a / "epochs.csv"), pd.read_csv(b / "epochs.csv")).set_index("column")
    assert list(cmp.columns) == ["run1_median", "run2_median", "run2_run1_ratio"]
    assert "epoch" not in cmp.index and "clocks_event_reasons" not in cmp.index
    assert cmp.loc["wall_s"].tolist() == [3.0, 1.5, 0.5]
    assert cmp.loc["gpu_ms_per_step", "run2_run1_ratio"] == 0.5
    assert cmp.loc["learner_steps_per_s", "run2_run1_ratio"] == pytest.approx(75 / (100 / 3.0))  # median of 100, 50
    assert math.isnan(cmp.loc["only_b", "run1_median"]) and math.isnan(cmp.loc["only_b", "run2_run1_ratio"])
    assert main(["report", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "run2_run1_ratio" in out and "(3 epochs)" in out and "(2 epochs)" in out


def _write(path, text):
    path.mkdir(parents=True, exist_ok=True)
    (path / "epochs.csv").write_bytes(text)
    return path


@pytest.mark.parametrize(
    "case,problem",
    [
        ("missing", "no such run folder or file"),
        ("no csv", "no epochs.csv in this folder"),
        ("empty", "not a readable CSV"),
        ("binary", "not a readable CSV"),
        ("ragged", "not a readable CSV"),
        ("columns", "missing columns ['env_steps'"),
        ("no rows", "no epoch rows"),
        ("text", "non-numeric values in columns ['wall_s']"),
    ],
)
@pytest.mark.parametrize("position", [0, 1])
def test_bad_input_exits_2_naming_the_path_and_problem(tmp_path, capsys, case, problem, position):
    good = make_run(tmp_path / "good", [1.0])
    header = ",".join(EPOCH_COLUMNS)
    bad = {
        "missing": lambda p: p,
        "no csv": lambda p: p.mkdir() or p,
        "empty": lambda p: _write(p, b""),
        "binary": lambda p: _write(p, b"\xff\xfe\x00\x81" * 50),
        "ragged": lambda p: _write(p, f"{header}\n1,2\n1,2,3,4,5,6,7,8,9,10,11,12,13\n".encode()),
        "columns": lambda p: _write(p, b"epoch,learner_steps\n1,2\n"),
        "no rows": lambda p: _write(p, f"{header}\n".encode()),
        "text": lambda p: _write(p, f"{header}\n1,2,3,fast,5,6,7,8,9,10\n".encode()),
    }[case](tmp_path / "bad")
    before = sorted(tmp_path.rglob("*"))
    argv = ["report", str(bad), str(good)] if position == 0 else ["report", str(good), str(bad)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(bad) in captured.err and problem in captured.err
    assert sorted(tmp_path.rglob("*")) == before
