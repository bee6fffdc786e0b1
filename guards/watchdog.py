"""Hang watchdog: each armed period (an epoch) must end within a time limit, else dump every stack and exit 3.

A daemon thread waits on the deadline. On expiry it writes which period and which phase were last entered, dumps
every thread's Python stack with `faulthandler.dump_traceback(all_threads=True)`, and ends the process with
`os._exit(exit_code)` (no cleanup that could hang too). It fires also when the main thread is blocked inside a
CUDA call or a C extension that released the GIL (CUDA syncs, kernel launches, sleeps all do).

A guard that can fail silently is worse than none: a limit above `MAX_LIMIT_S` (threading.TIMEOUT_MAX, the longest
wait this platform's threads accept) is refused up front (ValueError), and if the watching thread itself fails, it
reports why (message on the stream, traceback in `error_log` or on the stream) and ends the process with
`os._exit(WATCHDOG_DIED_EXIT_CODE)` (70, hotloop's "internal error"): the run never goes on unguarded. `arm` and
`disarm` raise RuntimeError when the thread is not running. `watched` records, per period, whether the thread was
alive from its `arm` to its `disarm`: a period is "watched" only then (the gate's "epoch 1 without hang" reads it).
With `hang_record`, an expiry first writes every thread's stack into HANG_STACKS beside it, then a small JSON file
there ({"exit_code", "period", "limit_s", "last_phase", "pid", "time": the expiry's Unix time, "stacks": that file's
name}): a data-parallel gate's launcher reads it per rank, since torchrun reports only the ranks it saw fail first
and shows only rank 0's console (hotloop.guards.data_parallel).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TextIO

HANG_EXIT_CODE = 3
WATCHDOG_DIED_EXIT_CODE = 70
"""Exit status when the watching thread fails (EX_SOFTWARE, hotloop's "internal error"; guards/commands/errors.py)."""
HANG_STACKS = "hang_stacks.txt"
"""Beside a hang record (`hang_record`): the expiry's report and every thread's stack (faulthandler's text)."""
MAX_LIMIT_S = threading.TIMEOUT_MAX
"""The longest limit (seconds) a period may have: threading.TIMEOUT_MAX, above which the thread's wait raises
OverflowError (about 292 years on Linux)."""


def check_limit_s(limit_s: object, what: str = "limit_s") -> float:
    """`limit_s` as a float if it is a number of seconds with 0 < limit_s <= MAX_LIMIT_S, else ValueError naming
    `what` (e.g. "--epoch-timeout"), the value and the platform's maximum (NaN and infinity are refused too)."""
    try:
        value = float(limit_s)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {limit_s!r}") from None
    if not value > 0:
        raise ValueError(f"{what} must be > 0 seconds, got {limit_s!r}")
    if not value <= MAX_LIMIT_S:
        raise ValueError(
            f"{what} must be at most {MAX_LIMIT_S:g} seconds (threading.TIMEOUT_MAX: the longest "
            f"wait this platform's threads accept; the hang watchdog could not wait longer), got "
            f"{limit_s!r}"
        )
    return value


class HangWatchdog:
    """Use as `with HangWatchdog(limit_s) as wd: wd.arm("epoch 1"); ...; wd.phase("sample"); ...; wd.disarm()`.

    Args:
        limit_s: seconds an armed period may last (0 < limit_s <= MAX_LIMIT_S), else ValueError (`check_limit_s`).
        stream: where the report goes (stderr by default; must have a real file descriptor for the stack dump).
        exit_code: process exit status on expiry (3, hotloop's "hang" code).
        error_log: where the traceback goes if the watching thread fails (None: on `stream`).
        hang_record: where an expiry writes its JSON record before the report (None: nowhere; best effort: an
            error writing it does not keep the process from exiting).
    Attributes: watched ({period label: True when the thread was alive from the period's `arm` to its `disarm`}),
        failure (the exception the thread died of, None while it is fine).
    """

    def __init__(
        self,
        limit_s: float,
        stream: TextIO | None = None,
        exit_code: int = HANG_EXIT_CODE,
        error_log: str | Path | None = None,
        hang_record: str | Path | None = None,
    ) -> None:
        self.limit_s = check_limit_s(limit_s, "HangWatchdog: limit_s")
        self.hang_record = None if hang_record is None else Path(hang_record)
        self.stream = stream or sys.stderr
        self.exit_code = exit_code
        self.error_log = None if error_log is None else Path(error_log)
        self.watched: dict[str, bool] = {}
        self.failure: BaseException | None = None
        self._exit = os._exit  # how the process ends (expiry, thread failure); tests replace it
        self.last_phase = "start"
        self._label: str | None = None
        self._period_s = self.limit_s
        self._deadline = float("inf")
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="hotloop-watchdog", daemon=True)

    def __enter__(self) -> "HangWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    def arm(self, label: str, limit_s: float | None = None) -> None:
        """Start the countdown of a period named `label` (e.g. "epoch 1"), `limit_s` or the default limit long.
        Raises ValueError for a limit outside (0, MAX_LIMIT_S], RuntimeError when the watching thread is not running
        (never started: use the watchdog as a context manager; or dead: `failure` says why)."""
        period_s = self.limit_s if limit_s is None else check_limit_s(limit_s, "HangWatchdog.arm: limit_s")
        self._check_alive(f"arm {label!r}")
        with self._wake:
            self._label, self._period_s = label, period_s
            self._deadline = time.monotonic() + self._period_s
            self._wake.notify()

    def disarm(self) -> None:
        """End the current period in time; records in `watched` whether the thread was alive all through it.
        Raises RuntimeError when the watching thread is not running (the period was not watched to its end)."""
        with self._wake:
            label, self._label, self._deadline = self._label, None, float("inf")
            alive = self._thread.is_alive() and self.failure is None
            if label is not None:  # armed only while the thread was alive (`arm` checks)
                self.watched[label] = alive
            self._wake.notify()
        self._check_alive(f"watch {label!r} to its end" if label is not None else "disarm")

    def _check_alive(self, action: str) -> None:
        if self._thread.is_alive() and self.failure is None:
            return
        why = (
            f"it died: {type(self.failure).__name__}: {self.failure}"
            if self.failure is not None
            else "it is not running (use `with HangWatchdog(...) as watchdog:`)"
            if not self._thread.ident
            else "its thread has ended"
        )
        raise RuntimeError(f"the hang watchdog cannot {action}: {why}; the run would go on unguarded")

    def phase(self, name: str) -> None:
        """Record the phase the watched code is entering (shown in the report). Cheap: one attribute store."""
        self.last_phase = name

    def _watch(self) -> None:
        try:
            with self._wake:
                while not self._closed:
                    remaining = self._deadline - time.monotonic()
                    if remaining <= 0:
                        self._expire()
                        return  # only where `_exit` was replaced (tests)
                    self._wake.wait(timeout=None if remaining == float("inf") else min(remaining, MAX_LIMIT_S))
        except BaseException as exc:  # the guard itself failed: stop the run rather than let it go on unguarded
            self._die(exc)

    def _expire(self) -> None:
        try:
            if self.hang_record is not None:
                try:
                    with open(self.hang_record.with_name(HANG_STACKS), "w") as f:
                        self._dump_stacks(f, "")
                except OSError:
                    pass
                try:
                    self.hang_record.write_text(
                        json.dumps(
                            {
                                "exit_code": self.exit_code,
                                "period": self._label,
                                "limit_s": self._period_s,
                                "last_phase": self.last_phase,
                                "pid": os.getpid(),
                                "time": time.time(),
                                "stacks": HANG_STACKS,
                            }
                        )
                        + "\n"
                    )
                except OSError:
                    pass
            self._dump_stacks(self.stream, "\nhotloop: HANG: ")
        finally:  # a hang exits 3 even if the report cannot be written
            self._exit(self.exit_code)

    def _dump_stacks(self, f: TextIO, lead: str) -> None:
        """Write the expiry's report (`lead`, the period, its limit, the last phase) and every thread's stack to `f`
        (a file with a real descriptor: faulthandler writes to it directly)."""
        f.write(
            f"{lead}{self._label} did not finish within {self._period_s:g} s; last phase entered: {self.last_phase}. "
            "Stacks of all threads:\n"
        )
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.flush()

    def _die(self, exc: BaseException) -> None:
        """The watching thread failed with `exc`: say so and why, keep the traceback, end the process with
        WATCHDOG_DIED_EXIT_CODE (`_exit`)."""
        self.failure = exc
        try:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            where = None
            if self.error_log is not None:
                try:
                    self.error_log.write_text(text)
                    where = self.error_log
                except OSError:
                    where = None
            during = f" during {self._label!r}" if self._label is not None else ""
            self.stream.write(
                f"\nhotloop: internal error: the hang watchdog died{during}: {type(exc).__name__}: "
                f"{exc}; stopping the run (exit {WATCHDOG_DIED_EXIT_CODE}) rather than let it go on "
                f"unguarded ("
                + (f"full traceback in {where})\n" if where else "traceback follows)\n")
                + ("" if where else text)
            )
            self.stream.flush()
        finally:
            self._exit(WATCHDOG_DIED_EXIT_CODE)
