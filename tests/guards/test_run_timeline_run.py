"""A training run's timeline (guards/run.py with profiles/run_timeline.py, issue 37): timeline.csv, the per-epoch
*_s columns and epoch_total_s, the printed summary; a blocking phase shows up where it happened."""

import time

import pandas as pd
import pytest

from hotloop.guards import run as run_module
from hotloop.guards.run import run_training
from hotloop.profiles.run_timeline import EPOCH_TIME_COLUMNS
from hotloop.trainer.config import preset

TINY = dict(
    device="cpu",
    learner="reference",
    epochs=3,
    learner_steps_per_epoch=20,
    learning_starts=64,
    batch_size=16,
    eval_episodes=2,
    replay_capacity=500,
    trunk_hidden=(16,),
    head_hidden=8,
    num_envs=8,
)


def test_a_run_records_where_its_wall_time_went(tmp_path, capsys):
    table, _ = run_training(preset("cartpole", **TINY), tmp_path, epoch_limit_s=120, show_progress=False)
    for col in (*EPOCH_TIME_COLUMNS, "evaluate_s"):
        assert col in table.columns and table[col].notna().all(), col
    assert (table.epoch_total_s >= table.wall_s + table.evaluate_s).all()
    assert (table.checkpoint_s > 0).all() and (table.table_s > 0).all()
    on_disk = pd.read_csv(tmp_path / "epochs.csv")  # the final table holds the checkpoint's share too
    pd.testing.assert_series_equal(on_disk.epoch_total_s, table.epoch_total_s, check_exact=False, rtol=1e-6)
    tl = pd.read_csv(tmp_path / "timeline.csv")
    assert tl.phase.iloc[0] == "startup" and tl.start_s.iloc[0] == 0.0
    for phase in ("build", "loop", "evaluate", "table", "checkpoint_buffers", "checkpoint", "checkpoint_wait", "plot"):
        assert phase in set(tl.phase), phase
    assert sorted(tl[tl.phase == "loop"].epoch.tolist()) == [1, 2, 3]
    err = capsys.readouterr().err
    assert "in the epochs' loops" in err and "the rest: " in err


def test_a_blocking_phase_lands_in_its_own_column(tmp_path, monkeypatch):
    """The best-policy file made slow (a blocking write): best_policy_s and epoch_total_s carry it, wall_s not."""
    real = run_module.save_best

    def slow_save_best(*args, **kwargs):
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "save_best", slow_save_best)
    table, _ = run_training(
        preset("cartpole", **{**TINY, "epochs": 1}), tmp_path, epoch_limit_s=120, show_progress=False
    )
    row = table.iloc[0]
    assert row.best_policy_s == pytest.approx(0.3, abs=0.2)
    assert row.epoch_total_s - row.wall_s >= 0.3 and row.wall_s < row.epoch_total_s - 0.25


def test_the_trainer_times_the_step_that_compiles_the_actor_and_no_later_one(monkeypatch):
    """warmup_s (the run's `warmup` span, epoch 1's compile + capture) holds the actor's first eager step only."""
    from hotloop.trainer.actor import DeviceActor
    from hotloop.trainer.loop import Trainer

    tr = Trainer(preset("cartpole", **{**TINY, "learner": "hotloop", "learning_starts": 0}))
    assert tr.actor is not None and tr.warmup_s == 0.0
    real = DeviceActor.step

    def slow_first(self):
        if self.eager_steps == 0:
            time.sleep(0.2)  # what compiling the actor's kernels costs, here made visible
        return real(self)

    monkeypatch.setattr(DeviceActor, "step", slow_first)
    tr.env_step()
    first = tr.warmup_s
    assert first >= 0.2
    tr.env_step()
    assert tr.warmup_s == first
