"""Issue 41 item 3, the CLI's side: a guarded window that cannot fit in the host's memory is refused with exit 2
naming --guard-steps and the estimate, before any run folder exists (nothing is trained: the run is stubbed to
fail loudly if it starts)."""

from __future__ import annotations

import pytest

import hotloop.guards.gate
from hotloop.guards.cli import main
from hotloop.trainer.memory_estimate import format_bytes, window_bytes_per_step

TINY = [
    "--epochs",
    "1",
    "--device",
    "cpu",
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
    "--no-baseline",
]


@pytest.fixture
def no_run(monkeypatch):
    """The gate's run, replaced: a window that is not refused fails at once instead of growing until killed."""

    def started(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr(hotloop.guards.gate, "run_training", started)


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--guard-steps", str(10**9)], "--guard-steps 1000000000 with --repeats 1"),
        (["--guard-steps", "3000"], "--guard-steps 3000 with --repeats 1"),
        (["--repeats", str(10**9)], "--guard-steps (default 20) with --repeats 1000000000"),
    ],
)
def test_a_guarded_window_that_cannot_fit_exits_2_naming_the_flag_and_the_estimate(
    tmp_path, capsys, monkeypatch, no_run, extra, named
):
    import hotloop.trainer.memory_estimate as mem

    monkeypatch.setattr(mem, "available_memory", lambda device: (24 * 10**9, "a 24 GB stub"))
    out = tmp_path / "run"
    assert main(["gate", *TINY, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    per_step = format_bytes(window_bytes_per_step("cpu", "reference")[0])
    assert f"hotloop gate: error: {named}" in err and "the guarded window does not fit in the host's memory" in err
    assert f"x {per_step} per step" in err and "an estimated " in err and "24 GB is available (a 24 GB stub)" in err
    assert not out.exists()
    if "--repeats" in extra:
        assert "not one step fits at 1000000000 repeats" in err


def test_a_window_that_fits_runs(tmp_path, capsys, monkeypatch, no_run):
    out = tmp_path / "run"
    assert main(["gate", *TINY, "--guard-steps", "2", "--out", str(out)]) == 70  # past every check, into the run
    assert "AssertionError: the run started" in capsys.readouterr().err
