"""The gate's window is K iterations of the training loop itself (`Trainer.iterate`), K derived from the loop's
periodic phases: hook hits in the loop body (env step, progress callback) are placed in their step and phase; the
window size and coverage on real CPU gate runs (the reference learner, and the hotloop learner on the Triton
interpreter, with a window too short for its readback)."""

from __future__ import annotations

import inspect
import json

import pandas as pd
import pytest
import torch

from hotloop.guards.cli import main
from hotloop.guards.gate import guard_loop, window_size
from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer, learner_phases, loop_periods, progress_period

SMALL = dict(
    device="cpu",
    epochs=1,
    learner_steps_per_epoch=20,
    learning_starts=64,
    batch_size=32,
    trunk_hidden=(16,),
    head_hidden=8,
    eval_episodes=0,
    replay_capacity=4096,
)
TINY_GATE = [
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
    "eval_episodes=0",
    "--set",
    "replay_capacity=4096",
    "--no-progress",
]


class FakeCudaTensor(torch.Tensor):
    is_cuda = property(lambda self: True)


def _trainer(on_progress=None, **over) -> Trainer:
    trainer = Trainer(preset("cartpole", **{**SMALL, **over}), on_progress=on_progress)
    trainer.run_epoch(1)
    return trainer


def test_loop_periods_and_the_default_window():
    cfg = preset("cartpole", device="cpu")  # log_interval 100, target update every step, 1000 steps per epoch
    assert loop_periods(cfg, "hotloop") == {"env_step": 1, "update": 1, "readback_publish": 100, "progress": 10}
    assert loop_periods(cfg, "reference")["target_update"] == 1 and progress_period(cfg) == 10
    hard = preset("cartpole", device="cpu", tau=1.0, target_update_interval=100)
    assert loop_periods(hard, "reference")["target_update"] == 100
    k, periods, why = window_size(cfg, "hotloop")
    assert k >= 100 and k >= max(periods.values()) and "readback_publish" in why
    k10, _, why10 = window_size(cfg, "hotloop", 10)
    assert k10 == 10 and why10 == (
        "K = --guard-steps 10; longer periods: readback_publish (every 100) may be missing from the window"
    )
    assert window_size(preset("seed-scale", device="cpu"), "reference")[0] == 1000  # target update every 1000
    assert "update" in learner_phases("hotloop") and "target_update" in learner_phases("reference")
    with pytest.raises(ValueError, match="learner kind"):
        loop_periods(cfg, "auto")


def test_iterate_is_the_epochs_loop_body():
    trainer = _trainer(target_update_interval=5)
    assert trainer.learner_steps == 20 and trainer.learner.steps == 20
    sums = trainer.iterate(3)
    assert sums.shape == (3,) and trainer.learner_steps == 23
    with pytest.raises(ValueError, match="n must be >= 0"):
        trainer.iterate(-1)


def test_a_sync_in_the_progress_callback_is_inside_a_step_and_counted(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # a stub: no CUDA here
    line = inspect.currentframe().f_lineno + 1
    trainer = _trainer(target_update_interval=2, on_progress=lambda done, total: torch.cuda.synchronize())
    report = guard_loop(trainer, steps=4, warmup=1)
    hits = report.hits
    assert list(hits["step"]) == [0, 1, 2, 3] and set(hits["phase"]) == {"progress"} and not hits["outside"].any()
    v = report.verdicts.set_index("id")
    assert (v.loc["no_event_sync", "verdict"], v.loc["no_event_sync", "measured"]) == ("FAIL", 1)
    assert v.loc["no_event_sync", "evidence"] == f"hook: torch.cuda.synchronize at {__file__}:{line} in progress x4"
    assert (v.loc["no_stream_sync", "verdict"], v.loc["no_stream_sync", "status"]) == (
        "-",
        "not applicable (no CUDA)",
    )  # every periodic phase ran; no CUDA, no hit: nothing to find
    cov = report.coverage.set_index("phase")
    assert cov.loc["progress", "sync_hook_hits"] == 4 and cov.loc["progress", "steps"] == 4
    assert cov.loc["target_update", "steps"] == 2 and cov.loc["target_update", "period"] == 2
    assert list(report.per_step["event_sync_hook_hits"]) == [1, 1, 1, 1]


def test_a_host_read_in_the_env_step_is_placed_in_its_step_and_phase():
    trainer = _trainer(target_update_interval=3)
    fake = torch.Tensor._make_subclass(FakeCudaTensor, torch.tensor(1.0))
    clean_env_step = trainer.env_step

    def env_step():
        clean_env_step()
        fake.item()

    trainer.env_step = env_step
    report = guard_loop(trainer, steps=3, warmup=0)
    assert list(report.hits["step"]) == [0, 1, 2] and set(report.hits["phase"]) == {"env_step"}
    v = report.verdicts.set_index("id")
    assert v.loc["no_stream_sync", "verdict"] == "FAIL" and " in env_step x3" in v.loc["no_stream_sync", "evidence"]
    assert report.window["form"] == "own step ranges" and report.window["missing"] == []


def test_the_gate_divides_the_env_kernels_by_the_configs_env_steps_per_update(monkeypatch):
    """guard_loop hands cfg.env_steps_per_update to the window's PhaseRoles (the env row's divisor); on a CPU run
    there is no trace, so the env row and the single-block row are "not measured (no CUDA)"."""
    import hotloop.guards.gate as gate_module

    seen, real = [], gate_module.guard_window

    def spy(*args, **kwargs):
        seen.append(kwargs["roles"])
        return real(*args, **kwargs)

    monkeypatch.setattr(gate_module, "guard_window", spy)
    trainer = _trainer(target_update_interval=1, env_steps_per_update=2)
    report = guard_loop(trainer, steps=3, warmup=0)
    assert [r.env_steps_per_update for r in seen] == [2] and seen[0].learner == learner_phases("reference")
    v = report.verdicts.set_index("id")
    for name in ("env_kernels_per_env_step", "no_single_block_kernels"):
        assert (v.loc[name, "status"], v.loc[name, "verdict"]) == ("not measured (no CUDA)", "-"), name


def test_a_window_without_the_target_update_leaves_the_sync_criteria_not_measured():
    trainer = _trainer(target_update_interval=100)
    report = guard_loop(trainer, steps=5, warmup=0)
    v = report.verdicts.set_index("id")
    assert v.loc["no_stream_sync", "status"] == "not measured (phase target_update not in window)"
    assert report.window["missing"] == ["target_update"]
    cov = report.coverage.set_index("phase")
    assert cov.loc["target_update", "status"] == "not in window (period 100 > window 5)"


def test_gate_default_window_covers_the_target_update(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["gate", *TINY_GATE, "--set", "target_update_interval=30", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "K = max(20, longest period 30 (target_update)) = 30" in printed and "30 guarded steps" in printed
    assert "Phase coverage" in printed and "gate wall time" in printed and "profiling" in printed
    cov = pd.read_csv(out / "coverage.csv").set_index("phase")
    assert cov.loc["target_update", "steps"] == 1 and cov.loc["env_step", "steps"] == 30
    assert (out / "coverage.md").exists()
    doc = json.loads((out / "guard.json").read_text())
    assert doc["window"]["steps"] == 30 and doc["window"]["missing"] == [] and len(doc["coverage"]) == len(cov)
    assert doc["gate"]["wall_s"] > doc["gate"]["profiling_s"] > 0
    verdicts = {v["id"]: v for v in json.loads((out / "criteria.json").read_text())}
    for name in ("no_stream_sync", "no_event_sync"):  # no CUDA: not applicable, never PASS
        assert (verdicts[name]["verdict"], verdicts[name]["status"]) == ("-", "not applicable (no CUDA)")


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="runs the hotloop learner on --device cpu, which needs the "
    "Triton CPU interpreter: tests/conftest.py sets TRITON_INTERPRET only where CUDA is absent",
)
def test_gate_with_a_window_shorter_than_the_readback_period_says_so(tmp_path, capsys):
    """The hotloop learner (Triton CPU interpreter) publishes its readback every log_interval = 100 steps; a
    10-step window cannot hold it, and the gate says so instead of passing the sync criteria."""
    out = tmp_path / "run"
    argv = [
        "gate",
        *TINY_GATE,
        "--set",
        "learner=hotloop",
        "--set",
        "learner_steps_per_epoch=5",
        "--set",
        "log_interval=100",
        "--guard-steps",
        "10",
        "--guard-warmup",
        "0",
        "--out",
        str(out),
    ]
    assert main(argv) == 0  # nothing failed; nothing about the readback passed either
    printed = capsys.readouterr().out
    assert "not in the window: readback_publish" in printed
    assert "longer periods: readback_publish (every 100) may be missing" in printed
    cov = pd.read_csv(out / "coverage.csv", keep_default_na=False).set_index("phase")
    assert cov.loc["readback_publish", "status"] == "not in window (period 100 > window 10)"
    assert cov.loc["update", "steps"] == 10 and cov.loc["env_step", "steps"] == 10
    verdicts = {v["id"]: v for v in json.loads((out / "criteria.json").read_text())}
    for name in ("no_stream_sync", "no_event_sync"):
        assert verdicts[name]["status"] == "not measured (phase readback_publish not in window)"
        assert verdicts[name]["verdict"] == "-"
