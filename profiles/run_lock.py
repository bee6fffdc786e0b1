"""One writer per run folder: an exclusive lock held for a run's life, and the removal of a dead writer's temp files.

The lock is `fcntl.flock(LOCK_EX | LOCK_NB)` on <run folder>/LOCK_FILE, which holds the holder's pid (decimal, one
line). flock locks belong to the open file and the kernel drops them when the holder's process ends, however it
ends (exit, exception, SIGKILL, the hang watchdog's exit 3), so a lock file left by a killed run is not locked and
is simply taken over: `acquire` reports that dead holder's pid as RunLock.stale_pid. A live holder makes `acquire`
raise RunFolderLocked (a ValueError: exit 2 in the CLI) naming the pid read from the file.

Release (RunLock.release, the last of a process's nested holds) deletes the lock file while still holding it, then
closes it; an acquirer that locked a file which was deleted under it (it had opened it before the deletion) sees
that the path no longer names the file it locked (st_dev/st_ino differ or the path is gone) and tries again, so two
processes never both hold a folder. A folder whose run ended normally therefore holds no lock file; one whose run
was killed keeps it (with the dead pid) until the next acquire.

Within one process the lock is re-entrant: `acquire` of a folder this process already holds returns the same
RunLock with its hold count raised (the CLI can take it where it creates the folder and `run_training` again inside;
the lock ends with the outermost release). Not for NFS: flock there is local to one client on some kernels.
Sources: flock(2) (locks are per open file description, released when the last descriptor closes, including at
process exit), open(2) O_CREAT, the stat-after-lock check of the common lock-file recipe.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

LOCK_FILE = ".hotloop.lock"
"""The lock file's name inside a run folder."""
TEMP_GLOB = ".*.tmp"
"""Temp files of the run folder's atomic writers (hotloop.trainer.checkpoint.write_host_checkpoint's
`.checkpoint.pt.<random>.tmp`, written by save_checkpoint or by the background writer of hotloop.trainer.
async_checkpoint; hotloop.profiles.epoch_table.write_table's `.epochs.csv.<random>.tmp`, ...): any left at the start
of a run are a killed writer's and are removed (`remove_temp_files`). A run's background writer never outlives the
run's hold of the lock (run_training waits for it), so a live run's temp file is never taken for a dead one's."""
_PID_WAIT_S = 0.2
"""How long a refused acquire waits for the holder to write its pid (it writes it right after locking)."""

_held: dict[str, "RunLock"] = {}
_guard = threading.RLock()


class RunFolderLocked(ValueError):
    """Another live process holds the run folder's lock. `run_dir`: the folder (Path); `pid`: the holder's pid read
    from the lock file (int), None when it could not be read (the file empty or not a number)."""

    def __init__(self, run_dir: Path, pid: int | None) -> None:
        self.run_dir, self.pid = Path(run_dir), pid
        who = f"pid {pid}" if pid is not None else "a process whose pid could not be read"
        super().__init__(
            f"run folder {run_dir} is in use by another hotloop run ({who}, holding "
            f"{Path(run_dir) / LOCK_FILE}); wait for it to end or choose another folder"
        )


class RunLock:
    """A held run-folder lock (made by `acquire`). run_dir (Path), path (the lock file), stale_pid (int | None: the
    pid a killed earlier holder left in the lock file, None when the file was new or empty). Use as a context
    manager or call release(); each acquire of the same folder by this process must be matched by one release."""

    def __init__(self, run_dir: Path, key: str, fd: int, stale_pid: int | None) -> None:
        self.run_dir, self.path, self.stale_pid = run_dir, run_dir / LOCK_FILE, stale_pid
        self._key, self._fd, self._count = key, fd, 1
        self._restore: int | None = None

    @property
    def held(self) -> bool:
        """True until the last release."""
        return self._fd is not None

    def release(self) -> None:
        """End one hold; the last one deletes the lock file and unlocks (closes) it. A no-op once released."""
        with _guard:
            if self._fd is None:
                return
            self._count -= 1
            if self._count > 0:
                return
            _held.pop(self._key, None)
            fd, self._fd = self._fd, None
            try:
                if self._restore is not None:  # a refused must_be_empty acquire: the killed holder's pid back
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{self._restore}\n".encode(), 0)
                elif _same_file(self.path, fd):
                    os.unlink(self.path)  # still locked here: a waiter that opened it re-checks and retries
            except OSError:
                pass
            finally:
                os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RunLock({str(self.run_dir)!r}, held={self.held}, stale_pid={self.stale_pid})"


def acquire(run_dir: str | os.PathLike, *, create: bool = False, must_be_empty: bool = False) -> RunLock:
    """Take `run_dir`'s lock for this process (non-blocking) and return it (hold it for the run's life, then
    release). If this process holds it already, the same RunLock is returned with one more hold.

    create: make the folder (and its parents) first. must_be_empty: the folder must hold nothing but LOCK_FILE (a
    new run's folder, or one a run killed at its start left): a folder with other files and no lock file (a
    finished run's) is refused before anything is written; one with a lock file is locked first, so that a live
    run's folder is refused as locked (RunFolderLocked), not as "not empty", and a killed run's is checked once
    locked and, holding other files, refused with its lock file left as it was.
    Writes LOCK_FILE with this process's pid. Raises RunFolderLocked (a ValueError) naming the holder's pid when
    another live process holds the lock; ValueError naming the folder when it is not a folder (or missing without
    `create`), cannot be created or its lock file cannot be opened (the OSError chained), or, with must_be_empty,
    holds other files ("exists and is not an empty folder")."""
    run_dir = Path(run_dir)
    with _guard:
        key = os.path.realpath(run_dir)
        lock = _held.get(key)
        if lock is not None:
            if must_be_empty:
                _check_empty(run_dir)
            lock._count += 1
            return lock
        if run_dir.exists() and not run_dir.is_dir():
            raise ValueError(f"run folder {run_dir} is not a folder")
        if must_be_empty and run_dir.is_dir() and not (run_dir / LOCK_FILE).exists():
            _check_empty(run_dir)  # a finished run's folder (no lock file): refused untouched
        if create:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ValueError(f"cannot create the run folder {run_dir}: {exc.strerror or exc}") from exc
            key = os.path.realpath(run_dir)
        if not run_dir.is_dir():
            raise ValueError(f"run folder {run_dir}: no such folder")
        fd = _lock_fd(run_dir)
        stale = _read_pid(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise ValueError(f"cannot write the lock file {run_dir / LOCK_FILE}: {exc.strerror or exc}") from exc
        lock = RunLock(run_dir, key, fd, stale if stale != os.getpid() else None)
        _held[key] = lock
        if must_be_empty:
            try:
                _check_empty(run_dir)  # a killed run's folder, or one another run filled since the first check
            except ValueError:
                lock._restore = stale  # leave a killed run's lock file as it was
                lock.release()
                raise
        return lock


def check_not_held(run_dir: str | os.PathLike) -> None:
    """Raise RunFolderLocked (a ValueError naming the holder's pid) when another live process holds `run_dir`'s
    lock; return when none does: the folder has no lock file (or it cannot be opened), its holder is dead (a
    killed run's lock file), or this process holds it. Takes no lock that lasts: the lock file is opened read-only
    (O_NONBLOCK: never waits) and probed with a shared non-blocking flock that is released at once, so a run that
    tries to acquire the folder in that same instant (microseconds) would be refused as if it were held. For
    writers of a file into a folder that is not theirs (`hotloop gate --update-baseline`: no file of a live run is
    overwritten)."""
    run_dir = Path(run_dir)
    with _guard:
        if os.path.realpath(run_dir) in _held:
            return
        try:
            fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderLocked(run_dir, _read_pid(fd, wait_s=_PID_WAIT_S)) from None
        except OSError:
            return
        finally:
            os.close(fd)


def remove_temp_files(run_dir: str | os.PathLike) -> list[Path]:
    """Delete the files matching TEMP_GLOB directly in `run_dir` (temp files of an atomic write that a killed process
    left) and return their paths, sorted. Call it only while holding the folder's lock (another live writer's temp
    files would go too). Missing folder: nothing to do, []."""
    removed = []
    for path in sorted(Path(run_dir).glob(TEMP_GLOB)):
        if path.is_file() and not path.is_symlink():
            try:
                path.unlink()
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed


def _lock_fd(run_dir: Path) -> int:
    """Open-create and flock LOCK_FILE; retry while the file locked turns out to have been deleted by a releaser."""
    path = run_dir / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ValueError(f"cannot open the lock file {path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd, wait_s=_PID_WAIT_S)
            os.close(fd)
            raise RunFolderLocked(run_dir, pid) from None
        except OSError as exc:
            os.close(fd)
            raise ValueError(f"cannot lock {path}: {exc.strerror or exc}") from exc
        if _same_file(path, fd):
            return fd
        os.close(fd)  # released and deleted after we opened it: lock the file that is there now


def _same_file(path: Path, fd: int) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_pid(fd: int, wait_s: float = 0.0) -> int | None:
    """The pid in the lock file (None if empty or not a number), waiting up to wait_s for a holder that has just
    locked it to write its pid."""
    deadline = time.monotonic() + wait_s
    while True:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _check_empty(run_dir: Path) -> None:
    """ValueError unless run_dir holds nothing but the lock file (a new run's folder)."""
    other = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE)
    if other:
        raise ValueError(
            f"run folder {run_dir} exists and is not an empty folder (it holds {', '.join(other[:3])}"
            f"{', ...' if len(other) > 3 else ''}); choose a new run folder (nothing there is "
            f"overwritten)"
        )
