"""Durability of atomic file replacement: after `os.replace(tmp, path)` the rename itself is only on disk once the
folder holding it is fsynced (POSIX). Used by the run folder's writers (hotloop.profiles.epoch_table.write_table,
hotloop.trainer.checkpoint.save_checkpoint). Source: fsync(2), rename(2) ("the directory entry is durable only after
the directory is synced")."""

from __future__ import annotations

import os
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
