"""Opening and reading the files hotloop takes as input: regular files only, and whole-file reads only up to a
size cap that the error states.

Every input file hotloop reads goes through here: a config JSON (`hotloop.trainer.config.Config.load`, cap
MAX_CONFIG_BYTES), a baseline JSON (`hotloop.guards.baselines.load_baseline`, MAX_BASELINE_BYTES), a resumed run's
per-epoch table (`hotloop.trainer.resume.read_resume_point`, MAX_TABLE_BYTES; its checkpoint is refused unless a
regular file by hotloop.trainer.checkpoint.load_checkpoint) and the traces of `hotloop inspect` (opened with
`open_input`; they are streamed, so they have no cap).

Why: `Path.read_text()` of /dev/zero grows until MemoryError (an internal error, exit 70, after taking the
machine's memory), and `open()` of a FIFO without a writer blocks forever. `open_input` looks at the path first
(os.stat: no side effect on a device), then opens it with O_NONBLOCK (a FIFO opens at once instead of waiting for a
writer) and checks what it opened with fstat, so the file checked is the file read (no window between a check and
the open in which the path could be swapped); O_NONBLOCK is then cleared (it has no effect on a regular file's
reads anyway). `read_input_bytes` compares the size with the cap before reading and reads at most cap + 1 bytes,
so a file that grows while it is read (or a /proc file, whose size reads 0) cannot get past it either.
Sources: open(2) (O_NONBLOCK on a FIFO), fstat(2), inode(7) (S_ISREG and the other file types).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

MiB = 1 << 20
MAX_CONFIG_BYTES = 1 * MiB
"""Cap of a config JSON: one flat object of about forty fields (a few kB as `Config.save` writes it)."""
MAX_BASELINE_BYTES = 16 * MiB
"""Cap of a baseline JSON: the installed ones are about 15 kB (a few hundred metrics x R repeats)."""
MAX_TABLE_BYTES = 128 * MiB
"""Cap of a run folder's per-epoch table (epochs.csv): about 2 kB per epoch (a 200-epoch run's is 418 kB), so
about 60,000 epochs."""

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(ValueError):
    """An input file cannot be read; the message is "<path>: <problem>". Attributes: `path` (str), `problem`
    (str, without the path), `missing` (True when there is no file at the path)."""

    def __init__(self, path: str | os.PathLike, problem: str, missing: bool = False) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem, self.missing = str(path), problem, missing


def file_kind(mode: int) -> str:
    """What a file of st_mode `mode` is, in words ("a FIFO (named pipe)", "a folder", ...; "a regular file")."""
    return next(
        (name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else "not a regular file"
    )


def format_bytes(n: int) -> str:
    """`n` bytes in words: "16 MiB" for a whole number of MiB, else "1234 bytes" ("1 byte")."""
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} byte{'' if n == 1 else 's'}"


def open_input(path: str | os.PathLike, what: str = "input file") -> BinaryIO:
    """Open the regular file `path` for reading, in binary (a buffered file object at offset 0; close it).

    `what` names the file's role in the errors ("config file", "baseline", "trace"). Raises InputFileError naming
    the path when there is no file (`missing` True; problem "cannot read: No such file or directory"), it cannot
    be opened ("cannot read: <strerror>"), or it is not a regular file ("not a regular file: it is a FIFO (named
    pipe); hotloop reads a trace only from a regular file"): a FIFO, device, socket or folder is refused without
    reading from it and without waiting for a FIFO's writer. Never blocks."""
    try:
        kind = file_kind(os.stat(path).st_mode)
        if kind != "a regular file":
            raise InputFileError(path, _not_regular(kind, what))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}", missing=True) from None
    except OSError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        kind = file_kind(os.fstat(fd).st_mode)  # what was opened, whatever the path names now
        if kind != "a regular file":
            raise InputFileError(path, _not_regular(kind, what))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The whole content of the regular file `path`, at most `max_bytes` bytes long (`open_input`'s checks first).

    Raises InputFileError naming the path for what `open_input` refuses, an error while reading ("cannot read:
    <strerror>"), and a file longer than `max_bytes` ("is 2000000 bytes, more than the 1 MiB a config file may
    have (...): not a config file?"), checked on the size before reading and on what was read (at most max_bytes + 1
    bytes are read, whatever the file's size claims)."""
    with open_input(path, what) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise InputFileError(path, _too_large(f"is {size} bytes, more", what, max_bytes))
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputFileError(path, _too_large("holds more", what, max_bytes))
    return data


def _not_regular(kind: str, what: str) -> str:
    return f"not a regular file: it is {kind}; hotloop reads a {what} only from a regular file"


def _too_large(size: str, what: str, max_bytes: int) -> str:
    return (
        f"{size} than the {format_bytes(max_bytes)} a {what} may have (hotloop's cap on what it reads into "
        f"memory): not a {what}?"
    )


def is_regular_file(path: str | os.PathLike) -> bool:
    """Whether `path` names a regular file (symlinks followed); False when it names nothing or cannot be
    stat'ed. Does not open it."""
    try:
        return stat.S_ISREG(os.stat(Path(path)).st_mode)
    except OSError:
        return False
