"""The run keeps its best greedy-evaluated policy: best.pt holds the parameters the evaluation of its epoch scored
(a fresh trainer loaded with them scores the same), the table's best_epoch says which epoch, a later worse epoch
does not replace it, a resume keeps it, and a bad file is refused before anything changes."""

import math

import pandas as pd
import pytest
import torch

from hotloop.guards.run import run_training
from hotloop.trainer.best_policy import BEST_FILE, improves, load_best, read_best, save_best
from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer

TINY = dict(
    device="cpu",
    learner="reference",
    epochs=4,
    learner_steps_per_epoch=30,
    learning_starts=64,
    batch_size=16,
    eval_episodes=3,
    replay_capacity=600,
    trunk_hidden=(16,),
    head_hidden=8,
)


def _cumulative_best(evals: list[float]) -> list[float]:
    best, out = None, []
    for epoch, r in enumerate(evals, start=1):
        if improves(r, None if best is None else evals[best - 1]):
            best = epoch
        out.append(math.nan if best is None else best)
    return out


def test_best_pt_holds_the_parameters_its_epoch_evaluated(tmp_path, monkeypatch):
    cfg = preset("cartpole", **TINY)
    evaluated, real = [], Trainer.evaluate

    def recording(self, seed, max_steps=10_000):  # the real evaluation, and the parameters it scored
        evaluated.append({k: v.clone() for k, v in self.learner.online.state_dict().items()})
        return real(self, seed, max_steps) + [0.0, 30.0, 60.0, 5.0][len(evaluated) - 1]  # best: epoch 3

    monkeypatch.setattr(Trainer, "evaluate", recording)
    table, _ = run_training(cfg, tmp_path, epoch_limit_s=120, show_progress=False)
    evals = table.eval_return.tolist()
    assert table.best_epoch.tolist() == _cumulative_best(evals) == [1, 2, 3, 3]
    meta = read_best(tmp_path / BEST_FILE)
    assert meta["epoch"] == 3 and meta["eval_return"] == evals[2] == max(evals)
    fresh = Trainer(cfg)
    load_best(fresh, tmp_path / BEST_FILE)
    loaded = fresh.learner.online.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in evaluated[2].items())  # epoch 3's, not the last epoch's
    assert not all(torch.equal(loaded[k], v) for k, v in evaluated[3].items())
    # the run's own evaluation of that epoch: same eval env seed (Trainer.run_epoch), same greedy policy
    assert real(fresh, seed=cfg.seed * 100_003 + 3) + 60.0 == evals[2]


def test_a_worse_epoch_keeps_the_best_and_a_resume_continues_from_it(tmp_path, monkeypatch):
    cfg = preset("cartpole", **{**TINY, "epochs": 2})
    scores = iter([50.0, 20.0, 10.0, 80.0])  # epochs 1-2, then 3-4 after the resume

    def scored(self, seed, max_steps=10_000):
        return next(scores)

    monkeypatch.setattr(Trainer, "evaluate", scored)
    table, _ = run_training(cfg, tmp_path, epoch_limit_s=120, show_progress=False)
    assert table.best_epoch.tolist() == [1, 1] and read_best(tmp_path / BEST_FILE)["epoch"] == 1
    table, _ = run_training(
        preset("cartpole", **{**TINY, "epochs": 4}), tmp_path, epoch_limit_s=120, show_progress=False, resume=True
    )
    assert table.best_epoch.tolist() == [1, 1, 1, 4]
    assert read_best(tmp_path / BEST_FILE)["eval_return"] == 80.0
    assert pd.read_csv(tmp_path / "epochs.csv").best_epoch.tolist() == [1, 1, 1, 4]


def test_without_evaluation_there_is_no_best(tmp_path):
    table, _ = run_training(
        preset("cartpole", **{**TINY, "epochs": 1, "eval_episodes": 0}),
        tmp_path,
        epoch_limit_s=120,
        show_progress=False,
    )
    assert table.best_epoch.isna().all() and not (tmp_path / BEST_FILE).exists()
    assert not improves(math.nan, None) and improves(1.0, None) and not improves(1.0, 1.0)


def test_load_best_refuses_another_learner_or_shape_and_changes_nothing(tmp_path):
    small = Trainer(preset("cartpole", **TINY))
    path = save_best(tmp_path / BEST_FILE, small, 1, 9.0)
    wider = Trainer(preset("cartpole", **{**TINY, "trunk_hidden": (32,)}))
    before = {k: v.clone() for k, v in wider.learner.online.state_dict().items()}
    with pytest.raises(ValueError, match="trunk_hidden"):
        load_best(wider, path)
    assert all(torch.equal(before[k], v) for k, v in wider.learner.online.state_dict().items())
    (tmp_path / "other.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="other.pt"):
        load_best(small, tmp_path / "other.pt")


def test_hotloop_learner_best_policy_round_trip(tmp_path):
    # CUDA when present, else the Triton interpreter on CPU (tests/conftest.py): the tiniest sizes
    hot = dict(
        TINY,
        learner="hotloop",
        trunk_hidden=(16,),
        head_hidden=16,
        batch_size=16,
        learner_steps_per_epoch=2,
        learning_starts=32,
        num_envs=4,
        eval_episodes=2,
        replay_capacity=128,
        log_interval=1,
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    a = Trainer(preset("cartpole", **hot))
    a.run_epoch(1)
    save_best(tmp_path / BEST_FILE, a, 1, 3.0)
    b = Trainer(preset("cartpole", **{**hot, "seed": 2}))
    assert not torch.equal(a.learner.params, b.learner.params)
    address = b.learner.params.data_ptr()
    assert load_best(b, tmp_path / BEST_FILE)["epoch"] == 1
    assert torch.equal(a.learner.params, b.learner.params) and b.learner.params.data_ptr() == address
    reference = Trainer(preset("cartpole", **TINY))
    with pytest.raises(ValueError, match="'hotloop' learner"):
        load_best(reference, tmp_path / BEST_FILE)


def test_a_best_file_from_an_epoch_after_the_checkpoint_is_not_counted_at_resume(tmp_path, monkeypatch, capsys):
    """checkpoint_interval 2: the run ends after epoch 3 with its best at epoch 3 but (were it killed then) the
    checkpoint of epoch 2; resumed from epoch 2, the re-run epoch 3 must not be named by a best of the dropped one."""
    cfg = preset("cartpole", **{**TINY, "epochs": 2, "checkpoint_interval": 2})
    monkeypatch.setattr(Trainer, "evaluate", lambda self, seed, max_steps=10_000: 10.0 * self.epochs_done)
    run_training(cfg, tmp_path, epoch_limit_s=120, show_progress=False)
    assert read_best(tmp_path / BEST_FILE)["epoch"] == 2
    kept = (tmp_path / "checkpoint.pt").read_bytes()
    table_kept = (tmp_path / "epochs.csv").read_text()
    run_training(
        preset("cartpole", **{**TINY, "epochs": 3, "checkpoint_interval": 2}),
        tmp_path,
        epoch_limit_s=120,
        show_progress=False,
        resume=True,
    )
    assert read_best(tmp_path / BEST_FILE)["epoch"] == 3
    (tmp_path / "checkpoint.pt").write_bytes(kept)  # as if killed after epoch 3's best, before its checkpoint
    (tmp_path / "epochs.csv").write_text(table_kept)
    monkeypatch.setattr(Trainer, "evaluate", lambda self, seed, max_steps=10_000: 1.0)  # worse than every earlier
    capsys.readouterr()
    table, _ = run_training(
        preset("cartpole", **{**TINY, "epochs": 3, "checkpoint_interval": 2}),
        tmp_path,
        epoch_limit_s=120,
        show_progress=False,
        resume=True,
    )
    assert "after the checkpoint's epoch 2" in capsys.readouterr().err
    assert table.best_epoch.tolist()[-1] == 3  # the re-run epoch 3 is the new best (no earlier best counted)
    assert read_best(tmp_path / BEST_FILE)["eval_return"] == 1.0  # best.pt now holds the epoch the table names
