"""Checkpoint / resume: the round trip restores identical buffers, the continuation is deterministic, the CLI's
`train --resume`, and a run killed mid-epoch loses at most that epoch. The run folder: one writer at a time (its
lock; a killed run's lock taken over), a torn table or a corrupt checkpoint refused at resume, leftover temp files
removed."""

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch

from hotloop.guards.cli import main
from hotloop.guards.run import run_training
from hotloop.profiles.run_lock import LOCK_FILE, RunFolderLocked
from hotloop.trainer.checkpoint import load_checkpoint, save_checkpoint
from hotloop.trainer.config import preset
from hotloop.trainer.envs import make_env
from hotloop.trainer.loop import Trainer
from hotloop.trainer.resume import CHECKPOINT_FILE, ENV_RESEED, check_table_complete, read_resume_point
from hotloop.trainer.step import WARMUP_STEPS

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
TINY_SET = [
    arg
    for k, v in TINY.items()
    if k not in ("device", "epochs")
    for arg in ("--set", f"{k}={list(v) if isinstance(v, tuple) else v}")
]


def _trained(epochs: int, **overrides) -> Trainer:
    trainer = Trainer(preset("cartpole", **{**TINY, **overrides}))
    for epoch in range(1, epochs + 1):
        trainer.run_epoch(epoch)
    return trainer


def _snapshot(trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, meta = trainer.checkpoint_state()
    return {k: v.clone() for k, v in tensors.items()}, meta


def _assert_same_state(trainer: Trainer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    _assert_equal(trainer.checkpoint_state(), (tensors, meta))


def _assert_equal(state: tuple[dict[str, torch.Tensor], dict], expected: tuple[dict[str, torch.Tensor], dict]) -> None:
    (got, got_meta), (tensors, meta) = state, expected
    assert sorted(got) == sorted(tensors)
    different = [k for k in tensors if not torch.equal(got[k], tensors[k].to(got[k].device))]
    assert not different, different
    assert json.loads(json.dumps(got_meta)) == json.loads(json.dumps(meta))


def test_round_trip_restores_identical_buffers():
    a = _trained(2)
    tensors, meta = _snapshot(a)
    kinds = {name.split(".")[0] + ("." + name.split(".")[1] if name.startswith("learner.") else "") for name in tensors}
    assert kinds >= {"learner.online", "learner.target", "learner.opt", "replay", "returns", "rng", "generator"}
    assert {"replay.tree.nodes", "replay.obs", "returns.ring", "rng.cpu", "learner.opt.state.0.exp_avg"} <= set(tensors)
    assert meta["epoch"] == 2 and meta["learner_steps"] == 40 and meta["learner_updates"] == 40
    assert meta["env_steps"] == a.env_steps and meta["replay"]["size"] == a.replay.size == 64 + 2 * 20 * 8
    b = Trainer(preset("cartpole", **TINY))
    addresses = [
        b.replay.obs.data_ptr(),
        b.replay.tree.nodes.data_ptr(),
        b.returns.ring.data_ptr(),
        *(p.data_ptr() for p in b.learner.online.parameters()),
    ]
    torch.rand(7)  # training draws no global random numbers: move the global RNG so that restore must set it
    b.restore(tensors, meta)
    _assert_same_state(b, tensors, meta)
    assert (b.epochs_done, b.env_steps, b.learner_steps, b.learner.steps) == (2, a.env_steps, 40, 40)
    assert (b.replay.pos, b.replay.size) == (a.replay.pos, a.replay.size)
    assert addresses == [
        b.replay.obs.data_ptr(),
        b.replay.tree.nodes.data_ptr(),
        b.returns.ring.data_ptr(),
        *(p.data_ptr() for p in b.learner.online.parameters()),
    ]
    # The env is reset (not restored): running returns restart at 0, obs from the documented seed.
    assert not b.returns.running.any()
    assert torch.equal(b.obs, make_env("cartpole", b.cfg.num_envs, "cpu").reset(seed=b.cfg.seed + ENV_RESEED * 2))
    # The trainer owns its state: changing the checkpoint's tensors afterwards changes nothing.
    tensors["learner.opt.state.0.exp_avg"].add_(1.0)
    own = b.learner.optimizer.state_dict()["state"][0]["exp_avg"]
    assert not torch.equal(own, tensors["learner.opt.state.0.exp_avg"])


def test_resumed_run_continues_exactly_from_the_checkpoint(tmp_path):
    a = _trained(2)
    a_state = _snapshot(a)
    b = _trained(2)
    save_checkpoint(tmp_path / CHECKPOINT_FILE, *b.checkpoint_state())
    c = Trainer(preset("cartpole", **TINY))
    c.restore(*load_checkpoint(tmp_path / CHECKPOINT_FILE))
    _assert_same_state(c, *a_state)  # everything after a disk round trip equals the uninterrupted run's state
    # Epoch 3 of the resumed run equals that of the uninterrupted run given the same env reset.
    a.obs.copy_(a.env.reset(seed=a.cfg.seed + ENV_RESEED * 2))
    a.returns.running.zero_()
    stats_a, stats_c = a.run_epoch(3), c.run_epoch(3)
    assert stats_c.epoch == 3 and c.learner_steps == 60 and c.epochs_done == 3
    assert (stats_a.loss, stats_a.episodes, stats_a.eval_return) == (
        stats_c.loss,
        stats_c.episodes,
        stats_c.eval_return,
    )
    _assert_same_state(c, *_snapshot(a))


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(trunk_hidden=(32,)), "trunk_hidden"),
        (dict(replay_capacity=600), "replay_capacity"),
        (dict(num_envs=4), "num_envs"),
        (dict(env="synthetic", num_envs=8), "env"),
    ],
)
def test_restore_rejects_a_mismatch_by_name_and_changes_nothing(change, match):
    tensors, meta = _snapshot(_trained(1))
    other = Trainer(preset("cartpole", **{**TINY, **change}))
    before = _snapshot(other)
    with pytest.raises(ValueError, match=match):
        other.restore(tensors, meta)
    _assert_same_state(other, *before)


def test_restore_rejects_missing_and_misshapen_tensors():
    tensors, meta = _snapshot(_trained(1))
    fresh = Trainer(preset("cartpole", **TINY))
    with pytest.raises(ValueError, match="missing \\['replay.tree.nodes'\\]"):
        fresh.restore({k: v for k, v in tensors.items() if k != "replay.tree.nodes"}, meta)
    with pytest.raises(ValueError, match="'returns.ring'"):
        fresh.restore({**tensors, "returns.ring": tensors["returns.ring"][:-1]}, meta)
    with pytest.raises(ValueError, match="not a trainer checkpoint"):
        fresh.restore(tensors, {**meta, "format": "other"})
    with pytest.raises(ValueError, match="checkpoint is of a 'hotloop' learner, this run builds a 'reference' one"):
        fresh.restore(tensors, {**meta, "learner": "hotloop"})
    with pytest.raises(ValueError, match="taken on cuda, this run is on cpu"):
        fresh.restore(tensors, {**meta, "device_type": "cuda"})
    with pytest.raises(ValueError, match="replay"):
        fresh.restore(tensors, {**meta, "replay": {**meta["replay"], "pos": 10**6}})
    assert fresh.learner_steps == 0 and fresh.replay.size == 0
    # A config field that changes no shape (epochs: the run is extended) may differ.
    longer = Trainer(preset("cartpole", **{**TINY, "epochs": 5}))
    longer.restore(tensors, meta)
    assert longer.epochs_done == 1 and next(longer.epochs()).epoch == 2


def test_cli_train_resume_extends_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--preset",
                "cartpole",
                *TINY_SET,
                "--epochs",
                "2",
                "--out",
                str(out),
                "--device",
                "cpu",
                "--no-progress",
            ]
        )
        == 0
    )
    first = pd.read_csv(out / "epochs.csv")
    assert load_checkpoint(out / CHECKPOINT_FILE)[1]["epoch"] == 2
    assert main(["train", "--resume", str(out), "--epochs", "3", "--no-progress"]) == 0
    table = pd.read_csv(out / "epochs.csv")
    assert table.epoch.tolist() == [1, 2, 3]
    pd.testing.assert_frame_equal(table.iloc[:2].reset_index(drop=True), first)
    assert load_checkpoint(out / CHECKPOINT_FILE)[1]["epoch"] == 3
    assert json.loads((out / "config.json").read_text())["epochs"] == 3
    assert sorted(p.name for p in out.iterdir()) == [
        "best.pt",
        "checkpoint.pt",
        "config.json",
        "epochs.csv",
        "epochs.md",
        "epochs.png",
        "timeline.csv",
    ]  # no temp file left
    capsys.readouterr()
    # Nothing left to run: a named error, exit 2.
    assert main(["train", "--resume", str(out), "--no-progress"]) == 2
    assert "finished 3 of its 3 epochs" in capsys.readouterr().err


def test_cli_resume_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY_SET, "--epochs", "1", "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((out / "config.json").read_text())
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "epochs.csv"):
        (broken / name).write_text((out / name).read_text())
    (broken / CHECKPOINT_FILE).write_bytes((out / CHECKPOINT_FILE).read_bytes()[:100])
    cases = [
        (["--resume", str(bare), "--epochs", "2"], f"{bare / CHECKPOINT_FILE}: no such file"),
        (["--resume", str(broken), "--epochs", "2"], "cannot be read"),
        (["--resume", str(out), "--preset", "cartpole"], "--preset cannot be given with it"),
        (["--resume", str(out), "--set", "lr=0.1", "--out", str(out)], "--set, --out cannot be given"),
        (["--resume", str(tmp_path / "nope")], "no such run folder"),
    ]
    for argv, match in cases:
        listing = {p: p.stat().st_mtime_ns for d in (out, bare, broken) for p in d.iterdir()}
        assert main(["train", *argv, "--no-progress"]) == 2, argv
        assert match in capsys.readouterr().err, argv
        assert listing == {p: p.stat().st_mtime_ns for d in (out, bare, broken) for p in d.iterdir()}


def test_a_run_killed_mid_epoch_loses_at_most_that_epoch(tmp_path, monkeypatch):
    cfg = preset("cartpole", **TINY)
    clean = Trainer.run_epoch

    def dies_in_epoch_3(self, epoch):
        if epoch == 3:
            self.train_step()  # part of the epoch ran (state changed), then the process "dies"
            raise RuntimeError("killed")
        return clean(self, epoch)

    monkeypatch.setattr(Trainer, "run_epoch", dies_in_epoch_3)
    with pytest.raises(RuntimeError, match="killed"):
        run_training(cfg, tmp_path, 60.0, show_progress=False)
    tensors, meta = load_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert (meta["epoch"], meta["learner_steps"]) == (2, 40)
    _assert_equal((tensors, meta), _snapshot(_trained(2)))  # the epoch-2 state, untouched by the dying epoch 3
    assert pd.read_csv(tmp_path / "epochs.csv").epoch.tolist() == [1, 2]
    monkeypatch.setattr(Trainer, "run_epoch", clean)
    table, _ = run_training(cfg, tmp_path, 60.0, show_progress=False, resume=True)
    assert table.epoch.tolist() == [1, 2, 3] and table.learner_steps.tolist() == [20, 20, 20]
    assert load_checkpoint(tmp_path / CHECKPOINT_FILE)[1]["learner_steps"] == 60


def test_hotloop_learner_round_trip():
    # On CUDA when present, else the Triton interpreter on CPU (tests/conftest.py): the tiniest sizes.
    hot = dict(
        learner="hotloop",
        trunk_hidden=(16,),
        head_hidden=16,
        batch_size=16,
        learner_steps_per_epoch=2,
        learning_starts=32,
        num_envs=4,
        eval_episodes=0,
        replay_capacity=128,
        log_interval=1,
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    a = _trained(2, **hot)
    tensors, meta = _snapshot(a)
    assert {"learner.nets", "learner.sn_u", "learner.adam.exp_avg", "learner.adam.step"} <= set(tensors)
    # With a CUDA graph, capture's WARMUP_STEPS warm-up steps are real updates too (trainer/step.py).
    updates = 4 + (WARMUP_STEPS if a.learner.use_graph else 0)
    assert meta["learner"] == "hotloop" and int(tensors["learner.adam.step"]) == updates
    b = Trainer(preset("cartpole", **{**TINY, **hot}))
    addresses = [
        b.learner.nets.data_ptr(),
        b.learner.adam.exp_avg.data_ptr(),
        b.learner.sn_u.data_ptr(),
        b.replay.tree.nodes.data_ptr(),
    ]
    b.restore(tensors, meta)
    _assert_same_state(b, tensors, meta)
    assert addresses == [
        b.learner.nets.data_ptr(),
        b.learner.adam.exp_avg.data_ptr(),
        b.learner.sn_u.data_ptr(),
        b.replay.tree.nodes.data_ptr(),
    ]
    assert (b.learner_steps, b.learner.steps, b.epochs_done) == (4, updates, 2)
    # the device actor resumes its counter-based randomness (and epsilon) at the step the checkpoint was taken
    assert b.actor is not None and int(b.actor.t) == meta["env_steps"] // hot["num_envs"] == int(a.actor.t)


# --- The run folder: one writer (its lock), whole files, leftovers removed, corrupt state refused. ---


def _listing(run_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run folder of two finished epochs (TINY config), made by run_training; copy it before changing it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_dir.mkdir()
    run_training(preset("cartpole", **{**TINY, "epochs": 2}), run_dir, 60.0, show_progress=False)
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def test_a_run_folder_held_by_a_live_run_is_refused_naming_its_pid(tmp_path, run_copy, lock_holder):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with lock_holder.hold(fresh) as proc:
        with pytest.raises(ValueError, match=f"run folder {fresh} is in use by another hotloop run \\(pid {proc.pid}"):
            run_training(preset("cartpole", **TINY), fresh, 60.0, show_progress=False)
        assert _listing(fresh) == {LOCK_FILE: (fresh / LOCK_FILE).stat().st_mtime_ns}  # no config.json, nothing
    before = _listing(run_copy)
    with lock_holder.hold(run_copy) as proc:  # two `--resume R` at once: the second one is refused
        for resume in (True, read_resume_point(run_copy, preset("cartpole", **TINY))):
            with pytest.raises(RunFolderLocked, match=f"pid {proc.pid}"):
                run_training(preset("cartpole", **TINY), run_copy, 60.0, show_progress=False, resume=resume)
        assert {k: v for k, v in _listing(run_copy).items() if k != LOCK_FILE} == before


def test_a_lock_left_by_a_killed_run_is_taken_over(run_copy, capsys, lock_holder):
    dead = lock_holder.killed(run_copy)
    assert (run_copy / LOCK_FILE).read_text() == f"{dead}\n"  # stale: its holder is dead
    capsys.readouterr()
    table, _ = run_training(preset("cartpole", **TINY), run_copy, 60.0, show_progress=False, resume=True)
    assert table.epoch.tolist() == [1, 2, 3]
    assert f"took over the lock left by pid {dead}" in capsys.readouterr().err
    assert not (run_copy / LOCK_FILE).exists()  # released at the end of the run


def test_the_lock_is_held_while_the_run_writes(tmp_path, lock_holder):
    seen = []

    def probe(trainer):  # called inside run_training: another process must be refused now
        out = subprocess.run(
            [sys.executable, "-c", lock_holder.script, str(tmp_path / LOCK_FILE)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        seen.append((out.returncode, (tmp_path / LOCK_FILE).read_text()))

    run_training(preset("cartpole", **{**TINY, "epochs": 1}), tmp_path, 60.0, show_progress=False, after_epochs=probe)
    assert seen == [(1, f"{os.getpid()}\n")]
    assert LOCK_FILE not in _listing(tmp_path)


@pytest.mark.parametrize("cut", ["mid_row", "no_line_end", "open_quote"])
def test_a_torn_table_is_refused_at_resume(run_copy, capsys, cut):
    table = run_copy / "epochs.csv"
    text = table.read_text()
    lines = text.splitlines(keepends=True)
    assert len(lines) == 3  # header and epochs 1, 2
    torn = {
        "mid_row": "".join(lines[:2]) + lines[2][: len(lines[2]) // 2],  # a kill mid-write, before atomic writes
        "no_line_end": text[:-1],
        "open_quote": "".join(lines[:2]) + '2,"20',
    }[cut]
    table.write_text(torn)
    with pytest.raises(ValueError, match="epochs.csv: row 2 \\(line 3(, the last)?\\) is torn"):
        read_resume_point(run_copy, preset("cartpole", **TINY))
    before = _listing(run_copy)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "--epochs", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "epochs.csv: row 2 (line 3" in err and "is torn" in err and "restore it or start a new run" in err
    assert _listing(run_copy) == before


def test_check_table_complete_passes_whole_tables(tmp_path):
    path = tmp_path / "t.csv"
    for text in ("", "a,b\n", "a,b\n1,2\n", 'a,b\n1,"x\ny"\n', "a,b\r\n1,2\r\n"):
        path.write_text(text, newline="")
        check_table_complete(path)
    path.write_text("a,b\n1,2,3\n")
    with pytest.raises(ValueError, match="row 1 \\(line 2\\) is torn: 3 fields where the header has 2"):
        check_table_complete(path)
    path.write_text("a,b")
    with pytest.raises(ValueError, match="the header \\(line 1\\) is torn: it has no line end"):
        check_table_complete(path)


def test_leftover_temp_files_are_removed_at_start_and_at_resume(tmp_path, run_copy, capsys):
    leftovers = [".checkpoint.pt.x1y2z3_q.tmp", ".epochs.csv.0a1b2c3d.tmp", ".epochs.md.0a1b2c3d.tmp"]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for d in (fresh, run_copy):
        for name in leftovers:
            (d / name).write_bytes(b"half a file")
    capsys.readouterr()
    run_training(preset("cartpole", **{**TINY, "epochs": 1}), fresh, 60.0, show_progress=False)
    assert "removed .checkpoint.pt.x1y2z3_q.tmp, a temp file left by a killed write" in capsys.readouterr().err
    run_training(preset("cartpole", **TINY), run_copy, 60.0, show_progress=False, resume=True)
    for d in (fresh, run_copy):
        assert sorted(_listing(d)) == [
            "best.pt",
            "checkpoint.pt",
            "config.json",
            "epochs.csv",
            "epochs.md",
            "epochs.png",
            "timeline.csv",
        ], d


def test_a_checkpoint_with_a_flipped_tensor_byte_is_refused_at_resume(run_copy, capsys):
    path = run_copy / CHECKPOINT_FILE
    expected = load_checkpoint(path)[0]
    with zipfile.ZipFile(path) as z:  # flip one bit in the middle of the last tensor storage record, in place
        info = max((i for i in z.infolist() if "/data/" in i.filename and i.file_size), key=lambda i: i.header_offset)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x01
    path.write_bytes(bytes(data))
    raw = torch.load(path, weights_only=True)["tensors"]  # torch itself reads it without complaint
    changed = [n for n, t in expected.items() if not torch.equal(raw[n], t)]
    assert len(changed) == 1
    with pytest.raises(ValueError, match=f"checkpoint {path} is corrupt: tensor '{changed[0]}'"):
        read_resume_point(run_copy, preset("cartpole", **TINY))
    before = _listing(run_copy)
    capsys.readouterr()
    assert main(["train", "--resume", str(run_copy), "--epochs", "3", "--no-progress"]) == 2
    assert f"is corrupt: tensor '{changed[0]}'" in capsys.readouterr().err
    assert _listing(run_copy) == before


def test_a_resume_point_is_refused_once_another_run_wrote_the_checkpoint(run_copy):
    cfg = preset("cartpole", **TINY)
    point = read_resume_point(run_copy, cfg)
    assert point.source is not None and point.epoch == 2
    save_checkpoint(run_copy / CHECKPOINT_FILE, point.tensors, point.meta)  # "another run" saved since
    before = _listing(run_copy)
    with pytest.raises(ValueError, match="changed since it was read for this resume"):
        run_training(cfg, run_copy, 60.0, show_progress=False, resume=point)
    assert _listing(run_copy) == before


def test_a_full_disk_at_the_second_checkpoint_says_disk_full_and_the_folder_resumes(tmp_path, capsys, monkeypatch):
    """Issue 41 item 3: a full disk mid-run was exit 70 with torch's "unexpected pos" message. The write of epoch
    2's checkpoint runs out of space part-way (torch.save into a file whose disk fills: torch raises its own
    RuntimeError, the OSError ENOSPC its __context__): exit 70 saying "disk full" and how to continue; the folder
    keeps epoch 1's checkpoint whole (no temp file left) and resumes from it."""
    import errno
    import io

    from hotloop.trainer.resume import STATE_FORMAT

    class FullDisk(io.RawIOBase):
        def __init__(self, f):
            self.f, self.room = f, 4096

        def writable(self):
            return True

        def write(self, b):
            if len(b) > self.room:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.room -= len(b)
            return self.f.write(b)

    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        meta = obj.get("meta", {}) if isinstance(obj, dict) else {}
        full = meta.get("format") == STATE_FORMAT and meta.get("epoch") == 2  # epoch 2's checkpoint only
        return real_save(obj, FullDisk(f) if full else f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "run"
    assert main(["train", *TINY_SET, "--epochs", "3", "--out", str(out), "--device", "cpu", "--no-progress"]) == 70
    err = capsys.readouterr().err
    assert (
        f"hotloop train: disk full: {out / CHECKPOINT_FILE} could not be written (No space left on device); "
        f"the file there before is kept whole"
    ) in err, err
    assert f"then continue with: hotloop train --resume {out}" in err and "internal error" not in err
    assert "unexpected pos" not in err.splitlines()[-2]  # torch's message only in error.log's traceback
    assert not list(out.glob(".*.tmp")) and load_checkpoint(out / CHECKPOINT_FILE)[1]["epoch"] == 1
    monkeypatch.undo()  # space freed
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert "resumed after epoch 1" in capsys.readouterr().err
    assert pd.read_csv(out / "epochs.csv").epoch.tolist() == [1, 2, 3]
    assert load_checkpoint(out / CHECKPOINT_FILE)[1]["epoch"] == 3


def test_a_full_disk_writing_the_table_names_it(tmp_path, monkeypatch):
    import errno

    import hotloop.guards.run
    from hotloop.profiles.disk_full import DiskFullError

    real = hotloop.guards.run.write_table

    def write_table(df, run_dir, stem):
        if len(df) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(df, run_dir, stem)

    monkeypatch.setattr(hotloop.guards.run, "write_table", write_table)
    with pytest.raises(
        DiskFullError,
        match=f"disk full: {tmp_path / 'epochs.csv'} could not be written with epoch "
        f"2's row \\(No space left on device\\)",
    ):
        run_training(preset("cartpole", **TINY), tmp_path, 60.0, show_progress=False)
    assert load_checkpoint(tmp_path / CHECKPOINT_FILE)[1]["epoch"] == 1


def test_a_config_changed_between_runs_is_refused_at_resume_unless_allowed_and_then_recorded(tmp_path, capsys):
    """Issue 41 item 6: a config.json edited between runs (lr) was taken silently by --resume, so the folder's
    epochs were trained under two configs while it claimed one."""
    from hotloop.trainer.resume import CONFIG_CHANGES_FILE, config_hash

    out = tmp_path / "run"
    assert main(["train", *TINY_SET, "--epochs", "1", "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    meta = load_checkpoint(out / CHECKPOINT_FILE)[1]
    assert meta["config_sha256"] == config_hash(config) == config_hash({**config, "epochs": 99})  # epochs: not in it
    old_lr, old_gamma = config["lr"], config["gamma"]
    (out / "config.json").write_text(json.dumps({**config, "lr": 0.1, "gamma": 0.5}))
    capsys.readouterr()
    listing = _listing(out)
    assert main(["train", "--resume", str(out), "--epochs", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        f"the config differs from the one the run was trained with (its checkpoint {out / CHECKPOINT_FILE}, "
        f"epoch 1) in gamma, lr: gamma (checkpoint {old_gamma!r}, now 0.5); lr (checkpoint {old_lr!r}, now 0.1)"
    ) in err, err
    assert "--allow-config-change" in err and _listing(out) == listing  # nothing written
    assert main(["train", "--resume", str(out), "--epochs", "2", "--allow-config-change", "--no-progress"]) == 0
    assert (
        f"config changed at resume after epoch 1 (allowed): gamma {old_gamma!r} -> 0.5; lr {old_lr!r} -> 0.1"
        in capsys.readouterr().err
    )
    [record] = json.loads((out / CONFIG_CHANGES_FILE).read_text())
    assert record["epoch"] == 1 and record["changes"] == {
        "gamma": {"old": old_gamma, "new": 0.5},
        "lr": {"old": old_lr, "new": 0.1},
    }
    new = json.loads((out / "config.json").read_text())
    assert record["config_sha256"] == {"old": meta["config_sha256"], "new": config_hash(new)}
    meta = load_checkpoint(out / CHECKPOINT_FILE)[1]  # the next checkpoint holds the config it was trained with
    assert (meta["epoch"], meta["config"]["lr"], meta["config_sha256"]) == (2, 0.1, config_hash(new))
    assert main(["train", "--resume", str(out), "--epochs", "3", "--no-progress"]) == 0  # unchanged since: resumes
    assert len(json.loads((out / CONFIG_CHANGES_FILE).read_text())) == 1
    assert (
        main(
            [
                "train",
                *TINY_SET,
                "--epochs",
                "1",
                "--out",
                str(tmp_path / "new"),
                "--device",
                "cpu",
                "--allow-config-change",
                "--no-progress",
            ]
        )
        == 2
    )  # only with --resume
    assert "--allow-config-change is for --resume" in capsys.readouterr().err


def test_a_checkpoint_without_a_config_hash_still_resumes_saying_so_and_a_changed_record_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY_SET, "--epochs", "1", "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    tensors, meta = load_checkpoint(out / CHECKPOINT_FILE)
    save_checkpoint(out / CHECKPOINT_FILE, tensors, {**meta, "config": {**meta["config"], "lr": 0.5}})
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--epochs", "2", "--no-progress"]) == 2
    assert "its meta's config does not match its config_sha256" in capsys.readouterr().err
    old = {k: v for k, v in meta.items() if k != "config_sha256"}  # as checkpoints were before issue 41
    save_checkpoint(out / CHECKPOINT_FILE, tensors, old)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "lr": 0.1}))
    assert main(["train", "--resume", str(out), "--epochs", "2", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert (
        "was written before checkpoints recorded their config's hash (config_sha256): the config is taken as it "
        "is, not checked" in err
    ), err
    assert load_checkpoint(out / CHECKPOINT_FILE)[1]["config_sha256"]  # from now on it is


def test_the_config_change_record_replaces_a_resume_that_kept_no_epoch_and_a_damaged_one_is_refused(tmp_path):
    from hotloop.trainer.resume import CONFIG_CHANGES_FILE, ResumePoint, read_config_changes, record_config_change

    cfg = preset("cartpole", **{**TINY, "lr": 0.1})
    point = ResumePoint({}, {"epoch": 1, "config_sha256": "a"}, [], None, {"lr": {"old": 0.001, "new": 0.1}})
    assert (
        read_config_changes(tmp_path) == []
        and record_config_change(tmp_path, point._replace(config_changes={}), cfg) is None
    )
    path = record_config_change(tmp_path, point, cfg)
    assert path == tmp_path / CONFIG_CHANGES_FILE and oct(path.stat().st_mode)[-3:] == "644"
    record_config_change(tmp_path, point, cfg)  # that resume kept no epoch: the same epoch's record is replaced
    record_config_change(tmp_path, point._replace(meta={"epoch": 3, "config_sha256": "b"}), cfg)
    assert [r["epoch"] for r in read_config_changes(tmp_path)] == [1, 3]
    assert not list(tmp_path.glob(".*.tmp"))
    for text in ("{", '{"epoch": 1}', "[1]"):
        path.write_text(text)
        with pytest.raises(ValueError, match=f"{path} (cannot be read|is not a JSON list).*move it away to resume"):
            record_config_change(tmp_path, point, cfg)
