"""Hang watchdog: each armed period (an epoch) must end within a time limit, else dump every stack and exit 3.

A daemon thread waits on the deadline. On expiry it writes which period and which phase were last entered, dumps
every thread's Python stack with `faulthandler.dump_traceback(all_threads=True)`, and ends the process with
`os._exit(exit_code)` (no cleanup that could hang too). It fires also when the main thread is blocked inside a
CUDA call or a C extension that released the GIL (CUDA syncs, kernel launches, sleeps all do).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import TextIO

HANG_EXIT_CODE = 3


class HangWatchdog:
    """Use as `with HangWatchdog(limit_s) as wd: wd.arm("epoch 1"); ...; wd.phase("sample"); ...; wd.disarm()`.

    Args:
        limit_s: seconds an armed period may last (> 0), else ValueError.
        stream: where the report goes (stderr by default; must have a real file descriptor for the stack dump).
        exit_code: process exit status on expiry (3, hotloop's "hang" code).
    """

    def __init__(self, limit_s: float, stream: TextIO | None = None, exit_code: int = HANG_EXIT_CODE) -> None:
        if not limit_s > 0:
            raise ValueError(f"HangWatchdog: limit_s must be > 0 seconds, got {limit_s!r}")
        self.limit_s = float(limit_s)
        self.stream = stream or sys.stderr
        self.exit_code = exit_code
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
        """Start the countdown of a period named `label` (e.g. "epoch 1"), `limit_s` or the default limit long."""
        with self._wake:
            self._label, self._period_s = label, limit_s or self.limit_s
            self._deadline = time.monotonic() + self._period_s
            self._wake.notify()

    def disarm(self) -> None:
        """End the current period in time."""
        with self._wake:
            self._label, self._deadline = None, float("inf")
            self._wake.notify()

    def phase(self, name: str) -> None:
        """Record the phase the watched code is entering (shown in the report). Cheap: one attribute store."""
        self.last_phase = name

    def _watch(self) -> None:
        with self._wake:
            while not self._closed:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self._expire()
                self._wake.wait(timeout=None if remaining == float("inf") else remaining)

    def _expire(self) -> None:
        s = self.stream
        s.write(f"\nhotloop: HANG: {self._label} did not finish within {self._period_s:g} s; "
                f"last phase entered: {self.last_phase}. Stacks of all threads:\n")
        s.flush()
        faulthandler.dump_traceback(file=s, all_threads=True)
        s.flush()
        os._exit(self.exit_code)
