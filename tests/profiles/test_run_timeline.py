"""profiles/run_timeline.py: spans on the process clock, per-epoch columns, the summary, timeline.csv."""

import time

import pandas as pd
import pytest

from hotloop.profiles.run_timeline import EPOCH_TIME_COLUMNS, TIMELINE_COLUMNS, RunTimeline, process_age_s


def test_the_process_age_is_the_time_since_this_process_started():
    age = process_age_s()
    assert age is not None and 0.0 < age < 3600.0  # pytest has been running a little
    time.sleep(0.05)
    assert process_age_s() >= age


def test_spans_time_their_body_and_nest_without_double_counting():
    tl = RunTimeline(origin=time.perf_counter())
    tl.add_startup(tl.origin + 0.25)
    with tl.span("loop", epoch=1):
        time.sleep(0.03)
        tl.add("warmup", 0.01, epoch=1)
    with tl.span("evaluate", epoch=1):
        time.sleep(0.02)
    tl.add("checkpoint_write", 0.5, epoch=1, overlapped=True)
    cols = tl.epoch_columns(1)
    assert tuple(cols) == EPOCH_TIME_COLUMNS
    assert cols["warmup_s"] == pytest.approx(0.01)
    assert cols["evaluate_s"] >= 0.02 and cols["checkpoint_write_s"] == pytest.approx(0.5)
    assert 0.05 <= cols["epoch_total_s"] < 0.5  # the overlapped write is not the epoch's main-thread time
    assert tl.epoch_columns(2)["epoch_total_s"] == 0.0
    df = tl.frame()
    assert tuple(df.columns) == TIMELINE_COLUMNS and list(df.phase) == [
        "startup",
        "warmup",
        "loop",
        "evaluate",
        "checkpoint_write",
    ]
    assert df.loc[0, "start_s"] == 0.0 and df.loc[0, "seconds"] == pytest.approx(0.25)


def test_a_span_is_recorded_when_its_body_raises():
    tl = RunTimeline()
    with pytest.raises(KeyError), tl.span("table", epoch=3):
        raise KeyError("x")
    assert [s.phase for s in tl.spans] == ["table"] and tl.spans[0].epoch == 3


def test_the_summary_gives_the_loop_share_and_where_the_rest_went():
    tl = RunTimeline(origin=0.0)
    tl.add("imports", 1.0, start_s=0.0)
    tl.add("loop", 6.0, epoch=1, start_s=1.0)
    tl.add("warmup", 2.0, epoch=1, start_s=1.0)
    tl.add("evaluate", 2.0, epoch=1, start_s=7.0)
    tl.add("checkpoint_write", 3.0, epoch=1, start_s=9.0, overlapped=True)
    lines = tl.summary(total_s=10.0)
    assert lines[0] == (
        "run 10.00 s: 6.00 s (60%) in the epochs' loops, of which 2.00 s compiling kernels and capturing graphs"
    )
    assert lines[1] == "  the rest: evaluate 2.00 s (20%), imports 1.00 s (10%), other 1.00 s"
    assert lines[2] == "  in the background (beside the loop): checkpoint writes 3.00 s"


def test_timeline_csv_round_trips(tmp_path):
    tl = RunTimeline()
    with tl.span("build"):
        pass
    tl.add("loop", 1.5, epoch=1)
    path = tl.write(tmp_path)
    assert path == tmp_path / "timeline.csv"
    back = pd.read_csv(path)
    assert list(back.columns) == list(TIMELINE_COLUMNS) and list(back.phase) == ["build", "loop"]
    assert back.loc[1, "seconds"] == 1.5 and back.loc[1, "epoch"] == 1


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(phase="", seconds=1.0), "phase"),
        (dict(phase="x", seconds=-1.0), "seconds"),
        (dict(phase="x", seconds=float("nan")), "seconds"),
        (dict(phase="x", seconds=float("inf")), "seconds"),
        (dict(phase="x", seconds=1.0, epoch=-1), "epoch"),
    ],
)
def test_bad_spans_are_refused_naming_the_input(kw, match):
    with pytest.raises(ValueError, match=match):
        RunTimeline().add(**kw)
