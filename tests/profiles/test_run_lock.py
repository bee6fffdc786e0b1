"""hotloop.profiles.run_lock: one writer per run folder across processes (a live holder refused by pid, a killed
holder's lock taken over), re-entrant within a process, the new-folder check, and the removal of leftover temp
files. The other process is a plain `python -c` holding flock on the lock file, as any holder would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hotloop.profiles.run_lock import LOCK_FILE, RunFolderLocked, acquire, remove_temp_files


def test_a_live_holder_is_refused_naming_its_pid(tmp_path, lock_holder):
    with lock_holder.hold(tmp_path) as proc:
        with pytest.raises(RunFolderLocked, match=f"in use by another hotloop run \\(pid {proc.pid},") as info:
            acquire(tmp_path)
        assert info.value.pid == proc.pid and isinstance(info.value, ValueError)
        assert (tmp_path / LOCK_FILE).read_text() == f"{proc.pid}\n"  # the holder's file is left as it is
    with acquire(tmp_path) as lock:  # the holder ended: free
        assert lock.held and lock.stale_pid == proc.pid  # it ended without releasing: its pid is stale
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert not lock.held and not (tmp_path / LOCK_FILE).exists()


def test_a_killed_holders_lock_is_taken_over(tmp_path, lock_holder):
    dead = lock_holder.killed(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text() == f"{dead}\n"
    lock = acquire(tmp_path)
    assert lock.stale_pid == dead and (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    # and now this process is the live holder another process is refused by
    proc = subprocess.run(
        [sys.executable, "-c", lock_holder.script, str(tmp_path / LOCK_FILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "BlockingIOError" in proc.stderr
    lock.release()


def test_the_lock_is_reentrant_within_a_process(tmp_path, lock_holder):
    outer = acquire(tmp_path)
    inner = acquire(tmp_path / ".." / tmp_path.name)  # the same folder by another spelling
    assert inner is outer
    inner.release()
    assert outer.held and (tmp_path / LOCK_FILE).exists()
    proc = subprocess.run(
        [sys.executable, "-c", lock_holder.script, str(tmp_path / LOCK_FILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0  # still held after the inner release
    outer.release()
    outer.release()  # a no-op once released
    assert not outer.held and list(tmp_path.iterdir()) == []


def test_a_new_run_folder(tmp_path, lock_holder):
    new = tmp_path / "a" / "run"
    with acquire(new, create=True, must_be_empty=True) as lock:
        assert sorted(p.name for p in new.iterdir()) == [LOCK_FILE] and lock.stale_pid is None
    assert new.is_dir() and list(new.iterdir()) == []
    # a finished run's folder (files, no lock file) is refused untouched
    (new / "epochs.csv").write_text("precious\n")
    with pytest.raises(ValueError, match="exists and is not an empty folder \\(it holds epochs.csv\\)"):
        acquire(new, create=True, must_be_empty=True)
    assert sorted(p.name for p in new.iterdir()) == ["epochs.csv"]
    # a live run's folder is refused as locked, naming the pid, not as "not empty"
    with lock_holder.hold(new) as proc:
        with pytest.raises(RunFolderLocked, match=f"pid {proc.pid}"):
            acquire(new, create=True, must_be_empty=True)
    # a killed run's folder holding files: "not empty", its lock file left as it was
    dead = lock_holder.killed(new)
    with pytest.raises(ValueError, match="not an empty folder"):
        acquire(new, must_be_empty=True)
    assert (new / LOCK_FILE).read_text() == f"{dead}\n"
    # a run killed before it wrote anything left only its lock file: the folder counts as empty
    (new / "epochs.csv").unlink()
    with acquire(new, must_be_empty=True) as lock:
        assert lock.stale_pid == dead


def test_bad_folders(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        acquire(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        acquire(tmp_path / "file", create=True)
    with pytest.raises(ValueError, match="cannot create the run folder"):
        acquire(tmp_path / "file" / "run", create=True)


def test_remove_temp_files(tmp_path):
    names = [".checkpoint.pt.k2j4_x9a.tmp", ".epochs.csv.0a1b2c3d.tmp", ".epochs.md.0a1b2c3d.tmp"]
    keep = ["checkpoint.pt", "epochs.csv", "notes.tmp", LOCK_FILE]
    for name in names + keep:
        (tmp_path / name).write_text("x")
    assert remove_temp_files(tmp_path) == sorted(tmp_path / n for n in names)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    assert remove_temp_files(tmp_path / "missing") == []
