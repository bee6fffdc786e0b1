"""The `hotloop` command's exit codes (hotloop.guards.commands.main's docstring gives their meaning) and how `main`
reports what ended a command early: an unexpected exception (`report_internal_error`, exit 70) and Ctrl-C
(`report_interrupt`, exit 130)."""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from pathlib import Path

from hotloop.profiles.disk_full import DiskFullError, disk_full_cause

USAGE_ERROR = 2
INTERNAL_ERROR = 70
"""Exit code of an unexpected exception (EX_SOFTWARE, sysexits.h): never 1, which means "a criterion failed"."""
INTERRUPTED = 130
BROKEN_PIPE = 141
ERROR_LOG = "error.log"
"""The traceback of an internal error, in the run folder."""


def report_internal_error(command: str, exc: BaseException, run_dir: Path | None) -> int:
    """Report an unexpected exception `exc` of `hotloop <command>` and return INTERNAL_ERROR (70).

    The full traceback goes to <run_dir>/error.log when the run folder exists, else (or when that cannot be
    written) to a new temporary file (tempfile.mkstemp, prefix hotloop-<command>-error-); one line on stderr names
    the exception's type and message, where it was raised (file:line in function) and the traceback's file. If no
    file can be written, the traceback follows that line on stderr. A full disk (an OSError ENOSPC / EDQUOT in the
    exception's chain, hotloop.profiles.disk_full.disk_full_cause; torch.save reports it as a RuntimeError) is
    reported as "disk full" instead of "internal error", and a second line says what the run folder keeps: its
    last complete checkpoint (`train`: with the `--resume` command that continues it), or none. Raises nothing."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log = None
    if run_dir is not None and run_dir.is_dir():
        try:
            (run_dir / ERROR_LOG).write_text(text)
            log = run_dir / ERROR_LOG
        except OSError:
            log = None
    if log is None:
        try:
            fd, name = tempfile.mkstemp(prefix=f"hotloop-{command}-error-", suffix=".log")
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            log = Path(name)
        except OSError:
            log = None
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}; " if frames else ""
    message = " ".join(str(exc).split())
    message = message if len(message) <= 300 else message[:297] + "..."
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    tail = f"full traceback in {log}" if log is not None else "the traceback could not be saved; it follows"
    full = disk_full_cause(exc)
    if isinstance(exc, DiskFullError):
        head = message.removeprefix("disk full: ")
    elif full is not None and full is not exc:  # e.g. torch.save's RuntimeError ("unexpected pos ...")
        head = f"{head} (caused by: [Errno {full.errno}] {full.strerror or full})"
    print(
        f"hotloop {command}: {'disk full' if full is not None else 'internal error'}: {head} ({where}{tail})",
        file=sys.stderr,
    )
    if log is None:
        print(text, file=sys.stderr, end="")
    if full is not None and run_dir is not None:
        from hotloop.trainer.resume import CHECKPOINT_FILE

        if not (run_dir / CHECKPOINT_FILE).is_file():
            print(
                f"hotloop {command}: {run_dir} holds no checkpoint yet: free space on its disk and start the run again",
                file=sys.stderr,
            )
        elif command == "train":
            print(
                f"hotloop {command}: {run_dir} keeps its last complete checkpoint ({CHECKPOINT_FILE} is only ever "
                f"replaced by a whole new one): free space on its disk, then continue with: hotloop train --resume "
                f"{run_dir}",
                file=sys.stderr,
            )
        else:
            print(
                f"hotloop {command}: {run_dir} keeps its last complete checkpoint ({CHECKPOINT_FILE}): free space "
                f"on its disk and run it again",
                file=sys.stderr,
            )
    return INTERNAL_ERROR


def report_interrupt(command: str, run_dir: Path | None) -> int:
    """Say on stderr that `hotloop <command>` was interrupted (Ctrl-C) and return INTERRUPTED (130): with the run
    folder `run_dir`, that its finished epochs are there (`train`, when it holds a checkpoint: with the `--resume`
    command that continues it). Raises nothing."""
    if run_dir is None:
        print(f"\nhotloop {command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    from hotloop.trainer.resume import CHECKPOINT_FILE

    hint = (
        f"; continue with: hotloop train --resume {run_dir}"
        if command == "train" and (run_dir / CHECKPOINT_FILE).exists()
        else ""
    )
    print(f"\nhotloop {command}: interrupted; the finished epochs are in {run_dir}{hint}", file=sys.stderr)
    return INTERRUPTED
