"""results/h200/device/run_outcomes.py, the outcomes table both device scripts print for runs that shared one GPU,
on the committed H200 runs of results/h200/learning/tf32_rounded_forward/ (their seeds_11_22.csv was written from
the same epochs.csv files when they came back)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "results/h200/learning/tf32_rounded_forward/runs"


def _module():
    spec = importlib.util.spec_from_file_location("run_outcomes", ROOT / "results/h200/device/run_outcomes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_outcomes_match_the_table_recorded_from_the_same_runs(tmp_path):
    for name in ("copy_s11", "copy_s12", "ieee_s16", "ieee_s21"):
        shutil.copytree(RUNS / name, tmp_path / name)
    got = _module().outcomes(tmp_path).set_index(["learner", "seed"])
    assert list(got.index) == [("copy", 11), ("copy", 12), ("ieee", 16), ("ieee", 21)]
    want = pd.read_csv(RUNS.parent / "seeds_11_22.csv")
    want = (
        want.assign(learner=want.forward.map({"tf32_rounded": "copy", "ieee_fp32": "ieee"}))
        .set_index(["learner", "seed"])
        .loc[got.index]
    )
    assert got.solved.tolist() == want.reached.tolist() == [True, True, False, True]
    assert got.held.tolist() == want.held.tolist() == [False, True, False, True]
    for col in ("best", "last3_mean", "final_eval"):
        assert got[col].round(1).tolist() == pytest.approx(want[col].tolist(), abs=0.051), col
