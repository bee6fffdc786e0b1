"""Durability of atomic file replacement: after `os.replace(tmp, path)` the rename itself is only on disk once the
folder holding it is fsynced (POSIX). Used by the run folder's writers (hotloop.profiles.epoch_table.write_table,
hotloop.trainer.checkpoint.save_checkpoint) and `write_text_atomic` (the baselines of `hotloop gate
--update-baseline`). Source: fsync(2), rename(2) ("the directory entry is durable only after
the directory is synced")."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def fsync_dir(directory: str | Path) -> None:
    """fsync `directory` so that a rename into it is durable; skipped silently where folders cannot be opened or
    fsynced (some file systems, Windows). Raises nothing."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Replace the file `path` with `text` atomically; returns `path` as a Path. `text` is written to a temp file
    `.<name>.<8 hex>.tmp` in the same folder (created O_EXCL with the mode of the file it replaces, else 0666 less
    the umask, as a plain open would make it), flushed and fsynced, renamed over `path` (os.replace, atomic on
    POSIX) and the folder fsynced (`fsync_dir`): a reader, or a process killed at any point, sees the old file or
    the new one whole, never a part. A `path` that is a symlink is replaced by the file, not written through:
    resolve it first to write its target. On any error the temp file is removed and `path` left as it was; the
    OSError (UnicodeEncodeError for text `encoding` cannot hold) passes through. The folder must exist."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
    return path
