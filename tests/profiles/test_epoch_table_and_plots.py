"""Optional per-epoch columns, the EpochTimer's host path, and the PNG plot."""

import math
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from hotloop.profiles.epoch_table import EPOCH_COLUMNS, OPTIONAL_COLUMNS, epoch_frame
from hotloop.profiles.epoch_timer import EpochTimer
from hotloop.profiles.plots import plot_epochs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rows(n=3, gpu=True):
    out = []
    for e in range(1, n + 1):
        row = {
            "extra_z": e,
            **{c: float(e) for c in EPOCH_COLUMNS},
            "learner_steps": 100,
            "wall_s": 0.5 + 0.1 * e,
            "learner_steps_per_s": 100 / (0.5 + 0.1 * e),
            "sm_clock_mhz": 1980.0 - e if gpu else math.nan,
            "gpu_ms_per_step": 4.0 + e if gpu else math.nan,
            "clocks_event_reasons": "none" if gpu else "",
        }
        row["epoch"] = e
        out.append(row)
    return out


def test_optional_columns_follow_epoch_columns_in_order_then_the_rest():
    df = epoch_frame(rows())
    assert list(df.columns) == EPOCH_COLUMNS + ["gpu_ms_per_step", "sm_clock_mhz", "clocks_event_reasons", "extra_z"]
    assert set(OPTIONAL_COLUMNS) >= {"kernels_per_step", "syncs_per_step", "power_w", "gpu_mem_used_gib"}
    assert list(epoch_frame([{c: 1 for c in EPOCH_COLUMNS}]).columns) == EPOCH_COLUMNS  # absent: not added


@pytest.mark.smoke
def test_epoch_timer_on_cpu_measures_host_ms_between_start_and_stop():
    timer = EpochTimer(torch.device("cpu"))
    assert not timer.uses_cuda_events
    with pytest.raises(RuntimeError, match="before start"):
        timer.stop()
    timer.start()
    with pytest.raises(RuntimeError, match="start\\(\\) and then stop\\(\\)"):
        timer.elapsed_ms()
    time.sleep(0.02)
    timer.stop()
    assert 15 <= timer.elapsed_ms() < 2000


@pytest.mark.gpu
def test_epoch_timer_on_cuda_times_the_stream():
    timer = EpochTimer("cuda")
    x = torch.randn(2048, 2048, device="cuda")
    timer.start()
    for _ in range(10):
        x = x @ x / 2048
    timer.stop()
    assert timer.uses_cuda_events and timer.elapsed_ms() > 0


@pytest.mark.parametrize("gpu", [True, False])
def test_plot_epochs_writes_a_png(tmp_path, gpu):
    path = plot_epochs(epoch_frame(rows(gpu=gpu)), tmp_path / "epochs.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_epochs_names_missing_columns(tmp_path):
    with pytest.raises(ValueError, match="learner_steps_per_s"):
        plot_epochs(pd.DataFrame({"epoch": [1], "learner_steps": [1], "wall_s": [1.0]}), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_solved_at_sums_the_epochs_up_to_the_first_that_reached_the_threshold():
    from hotloop.profiles.epoch_table import solved_at

    root = Path(__file__).resolve().parents[1] / "data" / "cartpole_fast"
    summary = pd.read_csv(root / "summary.csv").set_index("run")
    for run in ("hot_s1", "hot_s3", "ref_s4"):  # the committed H200 table was computed from these epochs.csv
        got = solved_at(pd.read_csv(root / run / "epochs.csv"))
        want = summary.loc[run]
        assert (got["learner_steps"], got["env_steps"]) == (want.learner_steps_to_475, want.env_steps_to_475)
        assert round(got["wall_s"], 2) == want.train_wall_s_to_475
    t = pd.DataFrame(
        {
            "epoch": [1, 2, 3],
            "learner_steps": [10, 10, 10],
            "env_steps": [80, 80, 80],
            "wall_s": [1.5, 0.5, 0.5],
            "mean_return_100": [20.0, 475.0, 500.0],
        }
    )
    assert solved_at(t) == {"epoch": 2, "learner_steps": 20, "env_steps": 160, "wall_s": 2.0}
    assert solved_at(t, threshold=501) is None
