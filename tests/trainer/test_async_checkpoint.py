"""Checkpoints written in the background (hotloop.trainer.async_checkpoint, issue 37 item 3): the snapshot is the
state at the epoch's end whatever the trainer does next, the period and the last epoch, a checkpoint due while one is
in flight is skipped and owed, a writer's failure is raised on the main thread naming the file, a stuck writer ends in
the watchdog's hang exit, and a `kill -9` during a background write resumes with each epoch in the table once."""

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import hotloop.trainer.async_checkpoint as ac
from hotloop.guards.cli import main
from hotloop.guards.run import run_training
from hotloop.guards.watchdog import HangWatchdog
from hotloop.profiles.disk_full import DiskFullError
from hotloop.trainer.async_checkpoint import AsyncCheckpointer, CheckpointWriteError
from hotloop.trainer.checkpoint import load_checkpoint, save_checkpoint
from hotloop.trainer.config import SEED_SCALE_CHECKPOINT_INTERVAL, Config, preset
from hotloop.trainer.loop import Trainer
from hotloop.trainer.resume import CHECKPOINT_FILE, config_hash

TINY = dict(
    device="cpu",
    learner="reference",
    epochs=5,
    learner_steps_per_epoch=10,
    learning_starts=64,
    batch_size=16,
    eval_episodes=0,
    replay_capacity=500,
    trunk_hidden=(16,),
    head_hidden=8,
    num_envs=8,
)
REPO = Path(__file__).resolve().parents[2]
KEPT = ["epoch", "learner_steps", "env_steps", "wall_s", "loss", "q_mean", "grad_norm", "episodes"]
"""Per-epoch table columns compared between a run's rows and the same rows after a resume."""


class _State:
    """A stand-in trainer state: a few tensors that `step` changes in place, and the epoch in meta."""

    def __init__(self, n: int = 1 << 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.tensors = {
            "big": torch.rand(n, 4, generator=g),
            "ids": torch.arange(n),
            "step": torch.zeros((), dtype=torch.int64),
        }
        self.epoch = 0

    def step(self) -> None:
        self.epoch += 1
        for t in self.tensors.values():
            t.add_(1)

    def __call__(self):
        return self.tensors, {"epoch": self.epoch}

    def copy(self):
        return {k: v.clone() for k, v in self.tensors.items()}


class _Gate:
    """Replaces write_host_checkpoint: each write waits until `release` (or fails with `fail`)."""

    def __init__(self, monkeypatch, fail: BaseException | None = None, block: bool = True) -> None:
        self.real, self.fail, self.open = ac.write_host_checkpoint, fail, threading.Event()
        self.started = []
        if not block:
            self.open.set()
        monkeypatch.setattr(ac, "write_host_checkpoint", self)

    def __call__(self, path, host, meta):
        self.started.append(meta["epoch"])
        self.open.wait(30)
        if self.fail is not None:
            raise self.fail
        return self.real(path, host, meta)

    def release(self) -> None:
        self.open.set()


def _idle(c: AsyncCheckpointer, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while c.busy:
        assert time.monotonic() < end, "the writer did not finish"
        c.poll()
        time.sleep(0.005)


def test_the_snapshot_is_the_state_at_the_call_and_the_file_the_usual_format(tmp_path):
    state = _State()
    state.step()
    expected = state.copy()
    path = tmp_path / CHECKPOINT_FILE
    with AsyncCheckpointer(path, 1, last_epoch=3) as c:
        record = c.checkpoint_epoch(1, state)
        state.step()  # the trainer goes on at once: the snapshot must not see it
        state.tensors["big"].mul_(-1)
        c.wait()
    tensors, meta = load_checkpoint(path)  # digests verified: written by save_checkpoint's format
    assert meta == {"epoch": 1} and sorted(tensors) == sorted(expected)
    assert all(torch.equal(tensors[k], expected[k]) for k in expected)
    assert record is c.records[0] and (record.epoch, record.skipped, record.mode, record.written) == (
        1,
        False,
        "host",
        True,
    )
    assert record.bytes == path.stat().st_size and record.tensor_bytes == sum(t.nbytes for t in expected.values())
    assert record.write_s > 0 and record.main_s > 0 and record.write_start > 0 and record.error == ""
    assert not list(tmp_path.glob(".*.tmp"))


def test_reserve_allocates_the_buffers_the_first_snapshot_then_uses(tmp_path):
    """`reserve` before the epochs: the first checkpoint writes from the buffers reserved (no allocation in its
    epoch) and the file holds the state at the call; a closed checkpointer refuses."""
    state = _State()
    state.step()
    path = tmp_path / CHECKPOINT_FILE
    with AsyncCheckpointer(path, 1, last_epoch=3) as c:
        assert c.reserve(state()[0]) == "host" and c.mode == "host"
        reserved = {name: t.data_ptr() for name, t in c._host.items()}
        assert sorted(reserved) == sorted(state.tensors)
        expected = state.copy()
        c.checkpoint_epoch(1, state)
        assert {name: t.data_ptr() for name, t in c._host.items()} == reserved  # the same buffers
        c.wait()
    tensors, meta = load_checkpoint(path)
    assert meta == {"epoch": 1} and all(torch.equal(tensors[k], expected[k]) for k in expected)
    with pytest.raises(RuntimeError, match="closed"):
        c.reserve(state()[0])


def test_due_every_interval_epochs_and_the_last_one_written_at_close(tmp_path, monkeypatch):
    state, path = _State(), tmp_path / CHECKPOINT_FILE
    with AsyncCheckpointer(path, 3, last_epoch=7) as c:
        done = []
        for epoch in range(1, 7):
            state.step()
            if c.checkpoint_epoch(epoch, state) is not None:
                done.append(epoch)
            _idle(c)
        gate = _Gate(monkeypatch)
        state.step()
        done.append(c.checkpoint_epoch(7, state).epoch)  # returns at once: the write runs after the epoch
        assert c.busy and gate.started == [7]
        threading.Timer(0.2, gate.release).start()
        c.close()  # waits for it
        assert not c.busy and load_checkpoint(path)[1]["epoch"] == 7
    assert done == [3, 6, 7] and [r.epoch for r in c.records if r.written] == [3, 6, 7]
    assert c.records[-1].wait_s >= 0.1 and c.records[0].wait_s == 0.0 and c.epochs_seen == 7
    assert c.summary().startswith("checkpoints: 3 written, every 3 epoch(s) and the last: ")
    assert " per epoch over 7), 0 skipped as busy;" in c.summary()
    with pytest.raises(ValueError, match="interval must be an int >= 1"):
        AsyncCheckpointer(path, 0)
    with pytest.raises(RuntimeError, match="is closed"):
        c.checkpoint_epoch(8, state)


def test_a_checkpoint_due_while_one_is_written_is_skipped_said_and_taken_at_the_next_free_epoch(tmp_path, monkeypatch):
    gate, notes = _Gate(monkeypatch), []
    state = _State()
    with AsyncCheckpointer(tmp_path / CHECKPOINT_FILE, 2, last_epoch=6, note=notes.append) as c:
        for epoch in (1, 2, 3, 4):  # 2 is taken and held by the writer; 4 falls due while it is
            state.step()
            c.checkpoint_epoch(epoch, state)
        assert c.busy and gate.started == [2]
        gate.release()
        _idle(c)
        state.step()
        assert c.due(5) and c.checkpoint_epoch(5, state).mode == "host"  # owed: taken although 5 % 2 != 0
        state.step()
        c.checkpoint_epoch(6, state)  # the last: never skipped (waits for 5 if still running), written at close
    assert [(r.epoch, r.skipped, r.written) for r in c.records] == [
        (2, False, True),
        (4, True, False),
        (5, False, True),
        (6, False, True),
    ]
    assert c.records[1].reason == "epoch 2's checkpoint was still in flight" and c.records[1].bytes == 0
    assert notes == [
        (
            "checkpoint of epoch 4 skipped: epoch 2's was still being written (the first epoch end after "
            "it takes one; later skips behind it are counted in the summary)"
        )
    ]
    assert gate.started == [2, 5, 6] and load_checkpoint(tmp_path / CHECKPOINT_FILE)[1]["epoch"] == 6


@pytest.mark.parametrize(
    "failure",
    [OSError(errno.EIO, "Input/output error"), DiskFullError("disk full: X could not be written", errno.ENOSPC)],
)
def test_a_writer_failure_is_raised_on_the_main_thread_naming_the_file_and_the_last_checkpoint_stays(
    tmp_path, monkeypatch, failure
):
    path, state = tmp_path / CHECKPOINT_FILE, _State()
    state.step()
    save_checkpoint(path, *state())  # epoch 1's, complete
    gate = _Gate(monkeypatch, fail=failure, block=False)
    c = AsyncCheckpointer(path, 1, last_epoch=5)
    state.step()
    c.checkpoint_epoch(2, state)
    _wait_thread(c)
    state.step()
    with pytest.raises(type(failure)) as info:
        c.checkpoint_epoch(3, state)  # the next call raises it
    if isinstance(failure, DiskFullError):
        assert info.value is failure  # as it is: it names the file and what is kept
    else:
        assert isinstance(info.value, CheckpointWriteError) and info.value.errno == errno.EIO
        assert str(info.value).startswith(
            f"checkpoint {path} of epoch 2 could not be written by the background "
            f"writer (OSError: [Errno 5] Input/output error); the last complete"
        )
        assert info.value.__cause__ is failure
    assert c.records[0].error and not c.records[0].written and gate.started == [2]
    assert load_checkpoint(path)[1]["epoch"] == 1 and not list(tmp_path.glob(".*.tmp"))
    c.close()


def _wait_thread(c: AsyncCheckpointer) -> None:
    if c._thread is not None:
        c._thread.join(30)


def test_a_writer_failure_during_another_error_is_added_to_it(tmp_path, monkeypatch):
    _Gate(monkeypatch, fail=OSError(errno.EIO, "Input/output error"), block=False)
    state = _State()
    with pytest.raises(KeyError) as info:
        with AsyncCheckpointer(tmp_path / CHECKPOINT_FILE, 1) as c:
            c.checkpoint_epoch(1, state)
            _wait_thread(c)
            raise KeyError("the run's own error")
    assert any("background write of" in n and "epoch 1) failed (OSError" in n for n in info.value.__notes__)


def test_a_stuck_writer_at_close_ends_in_the_watchdog_hang(tmp_path, monkeypatch):
    gate = _Gate(monkeypatch)
    exits = []
    report = tmp_path / "report.txt"
    with open(report, "w") as stream, HangWatchdog(0.3, stream=stream) as watchdog:
        watchdog._exit = lambda code: (exits.append(code), gate.release())  # os._exit in a real run: exit 3
        c = AsyncCheckpointer(tmp_path / CHECKPOINT_FILE, 1, watchdog=watchdog)
        c.checkpoint_epoch(1, _State())
        with pytest.raises(RuntimeError, match="watchdog"):  # the run would have ended at the expiry
            c.close()
    assert exits == [3]
    text = report.read_text()
    assert "HANG: checkpoint writer did not finish within 0.3 s" in text
    assert "async_checkpoint.py" in text and "in _write" in text  # the stuck writer's stack is shown


def test_a_stuck_final_write_in_a_run_exits_3(tmp_path):
    """run_training waits for the last epoch's write after the epochs, under the watchdog armed "checkpoint
    writer": a writer that never returns ends the process with the hang exit, every thread's stack shown."""
    code = (
        f"import threading, hotloop.trainer.async_checkpoint as ac\n"
        f"ac.write_host_checkpoint = lambda *a: threading.Event().wait()\n"
        f"from hotloop.guards.run import run_training\n"
        f"from hotloop.trainer.config import preset\n"
        f"from pathlib import Path\n"
        f"run_training(preset('cartpole', **{dict(TINY, epochs=1)!r}), Path({str(tmp_path)!r}), 1.0, False)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr[-3000:]
    assert "HANG: checkpoint writer did not finish within 1 s" in out.stderr
    assert "in _write" in out.stderr and "in close" in out.stderr  # the writer's stack and the main thread's wait


def test_checkpoint_interval_config_and_preset():
    assert Config().checkpoint_interval == 1
    assert preset("seed-scale").checkpoint_interval == SEED_SCALE_CHECKPOINT_INTERVAL == 10
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="config.checkpoint_interval must be"):
            Config(checkpoint_interval=bad)
    # not part of the config's hash: a checkpoint written before the field existed keeps its hash, and changing
    # it at resume is no config change
    plain = Config().to_dict()
    assert config_hash(plain) == config_hash({k: v for k, v in plain.items() if k != "checkpoint_interval"})


def test_a_run_with_a_checkpoint_interval_resumes_from_its_last_checkpoint_dropping_later_rows(tmp_path, monkeypatch):
    cfg = preset("cartpole", **{**TINY, "checkpoint_interval": 2})
    clean = Trainer.run_epoch

    def dies_in_epoch_4(self, epoch):
        if epoch == 4:
            raise RuntimeError("killed")
        return clean(self, epoch)

    monkeypatch.setattr(Trainer, "run_epoch", dies_in_epoch_4)
    with pytest.raises(RuntimeError, match="killed"):
        run_training(cfg, tmp_path, 60.0, show_progress=False)
    before = pd.read_csv(tmp_path / "epochs.csv")
    assert before.epoch.tolist() == [1, 2, 3] and load_checkpoint(tmp_path / CHECKPOINT_FILE)[1]["epoch"] == 2
    monkeypatch.setattr(Trainer, "run_epoch", clean)
    table, _ = run_training(cfg, tmp_path, 60.0, show_progress=False, resume=True)
    assert table.epoch.tolist() == [1, 2, 3, 4, 5]  # epoch 3's row was dropped and epoch 3 trained again
    pd.testing.assert_frame_equal(
        table.iloc[:2][KEPT].reset_index(drop=True), before.iloc[:2][KEPT], check_dtype=False
    )  # the rows of the checkpoint's epochs are kept as they were
    assert load_checkpoint(tmp_path / CHECKPOINT_FILE)[1]["epoch"] == 5


def _rows(table: Path) -> int:
    try:
        return len(pd.read_csv(table))
    except (OSError, ValueError):
        return 0


def test_kill_9_during_a_background_write_then_resume_keeps_each_epoch_once(tmp_path, capsys):
    """A real `hotloop train` process on the CPU with a 2M-transition replay (a ~110 MB checkpoint, so a write
    takes a while), killed with SIGKILL while a temp file of a background write exists and the main thread has
    trained two more epochs since it appeared; the folder resumes (`hotloop train --resume`) from its last complete
    checkpoint."""
    out, epochs = tmp_path / "run", 24
    sets = dict(
        replay_capacity=2_000_000,
        learner="reference",
        learner_steps_per_epoch=5,
        learning_starts=64,
        batch_size=16,
        eval_episodes=0,
        trunk_hidden=[16],
        head_hidden=8,
        num_envs=8,
    )
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "hotloop.guards.cli", "train"]
    with open(tmp_path / "first.err", "w") as err:
        proc = subprocess.Popen(
            [
                *cmd,
                "--preset",
                "cartpole",
                *args,
                "--epochs",
                str(epochs),
                "--out",
                str(out),
                "--device",
                "cpu",
                "--no-progress",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=REPO,
        )
        killed, deadline = None, time.monotonic() + 120
        try:
            while killed is None and proc.poll() is None and time.monotonic() < deadline:
                temps = list(out.glob(".checkpoint.pt.*.tmp")) if (out / CHECKPOINT_FILE).exists() else []
                if temps:  # a write after the first complete one is under way
                    rows = _rows(out / "epochs.csv")
                    while temps[0].exists() and proc.poll() is None:
                        if _rows(out / "epochs.csv") >= rows + 2:  # the loop went on beside the write
                            proc.send_signal(signal.SIGKILL)
                            killed = temps[0]
                            break
                        time.sleep(0.002)
                time.sleep(0.002)
        finally:
            if proc.poll() is None and killed is None:
                proc.kill()
            proc.wait(30)
    assert killed is not None, (
        f"no background write seen (exit {proc.returncode}): {(tmp_path / 'first.err').read_text()[-2000:]}"
    )
    assert proc.returncode == -signal.SIGKILL and killed.exists()  # the writer died mid-write: its temp file stays
    saved = load_checkpoint(out / CHECKPOINT_FILE)[1]["epoch"]  # the last complete checkpoint loads (digests)
    before = pd.read_csv(out / "epochs.csv")
    assert 1 <= saved < len(before) <= epochs
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0  # in this process: one start less
    err = capsys.readouterr().err
    assert f"removed {killed.name}, a temp file left by a killed write" in err and f"resumed after epoch {saved}" in err
    table = pd.read_csv(out / "epochs.csv")
    assert table.epoch.tolist() == list(range(1, epochs + 1))  # each epoch once: none lost, none duplicated
    pd.testing.assert_frame_equal(table.iloc[:saved][KEPT], before.iloc[:saved][KEPT], check_dtype=False)
    assert load_checkpoint(out / CHECKPOINT_FILE)[1]["epoch"] == epochs and not list(out.glob(".*.tmp"))


@pytest.mark.gpu
def test_cuda_snapshot_is_taken_without_a_host_sync_and_isolated_from_the_next_epoch(tmp_path):
    """Device mode: a D2D copy into device buffers the main stream waits for, then a D2H copy into pinned memory on
    a side stream; `checkpoint_epoch` and `poll` make no host sync (sync debug mode "error" raises on one); the
    writer runs while the main stream overwrites the live tensors. Direct mode (no device buffers) too."""
    for device_snapshot, mode in ((True, "device"), (False, "direct")):
        live = {
            "a": torch.rand(1 << 22, device="cuda"),
            "b": torch.arange(1 << 20, device="cuda"),
            "host": torch.ones(3),
        }
        path = tmp_path / f"{mode}.pt"
        with AsyncCheckpointer(path, 1, last_epoch=10, device_snapshot=device_snapshot) as c:
            c.checkpoint_epoch(1, lambda live=live: (live, {"epoch": 1}))  # allocates the buffers (not timed)
            c.wait()
            torch.cuda.synchronize()
            live["a"].add_(1)
            expected = {k: v.cpu().clone() for k, v in live.items()}  # .cpu() of a host tensor is itself
            torch.cuda.set_sync_debug_mode("error")
            try:
                record = c.checkpoint_epoch(2, lambda live=live: (live, {"epoch": 2}))
                for t in live.values():
                    t.mul_(-1)  # the next epoch overwrites the live tensors at once
                while c.busy:
                    c.poll()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            c.wait()
        assert record.mode == c.mode == mode and record.written
        tensors, meta = load_checkpoint(path)
        assert meta["epoch"] == 2 and all(torch.equal(tensors[k], expected[k]) for k in expected)
