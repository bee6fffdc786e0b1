"""A full disk while a run writes its folder: recognized wherever it surfaces and reported as "disk full".

A write that runs out of space raises OSError with errno ENOSPC (EDQUOT: over a disk quota), but not always as
itself: torch.save's zip writer turns the failed write of its file object into a RuntimeError ("[enforce fail at
inline_container.cc] . unexpected pos ...") with the OSError as its __context__ (checked with torch 2.13 on a
writer raising ENOSPC). `disk_full_cause` finds the OSError along an exception's __cause__ / __context__ chain, so
that the checkpoint writer (hotloop.trainer.checkpoint.save_checkpoint) and the CLI (hotloop.guards.commands.errors)
can say "disk full" instead of quoting torch. Sources: write(2) (ENOSPC, EDQUOT), PEP 3134 (exception chaining)."""

from __future__ import annotations

import errno

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""errno values of a write refused for lack of space: ENOSPC (no space left on device), EDQUOT (quota exceeded)."""


class DiskFullError(OSError):
    """A write failed because the disk is full (or over quota); the message says what could not be written and what
    was kept. `errno` is the cause's (ENOSPC or EDQUOT)."""

    def __init__(self, message: str, code: int = errno.ENOSPC) -> None:
        super().__init__(message)
        self.errno = code


def disk_full_cause(exc: BaseException | None) -> OSError | None:
    """The OSError with an errno in DISK_FULL_ERRNOS in `exc` or along its __cause__ / __context__ chain (`exc`
    first, then breadth first; each exception visited once), else None. Raises nothing."""
    queue, seen = [exc], set()
    while queue:
        e = queue.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return e
        queue += [e.__cause__, e.__context__]
    return None
