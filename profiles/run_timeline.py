"""Where a run's wall time went: start-up, kernel compilation and graph captures, and per epoch the loop, the
evaluation, the best-policy file, the table writes and the checkpoint (issue 37, "A run timeline").

A `RunTimeline` holds spans (phase, epoch, start_s, seconds, overlapped) on one clock: seconds since the process
started (`process_age_s`: Linux /proc; else since the timeline was made). Spans are timed on the host with
`time.perf_counter` around the phase (`span`), or added when another part measured them (`add`: the warm-up the
trainer timed inside its loop, a checkpoint's background write). A span marked `overlapped` ran beside the main
thread (a background write) and is shown but not counted in the main thread's total. Every `span` also opens an
NVTX + record_function range of the phase's name (hotloop.profiles.ranges.phase_range), so that an Nsight Systems or
Kineto trace of a whole run shows the same phases, unless the caller's code already opens one (`nvtx=False`).

Outputs: `frame()` (pandas, TIMELINE_COLUMNS), `write(run_dir)` (run_dir/timeline.csv, replaced atomically),
`epoch_columns(epoch)` (the per-epoch table's columns EPOCH_TIME_COLUMNS) and `summary()` (the lines a run prints
at its end: the share of its wall time in the loop, then where the rest went).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import astuple, dataclass
from pathlib import Path

import pandas as pd

from hotloop.profiles.durable_files import write_text_atomic
from hotloop.profiles.ranges import phase_range

TIMELINE_COLUMNS = ("phase", "epoch", "start_s", "seconds", "overlapped")
"""timeline.csv's columns: phase name, epoch (0 for run-level phases), start in seconds since the process started,
duration in seconds, and whether the span ran beside the main thread (not part of the run's main-thread time)."""
EPOCH_PHASES = ("loop", "warmup", "evaluate", "best_policy", "table", "checkpoint", "checkpoint_write")
"""The per-epoch phases: loop (the epoch's learner loop: the table's wall_s), warmup (the part of the loop spent
compiling kernels and capturing CUDA graphs: inside `loop`, not added to it), evaluate, best_policy (best.pt),
table (epochs.csv + epochs.md), checkpoint (the main thread's share of checkpoint.pt) and checkpoint_write (its
background write: overlapped)."""
EPOCH_TIME_COLUMNS = (
    "warmup_s",
    "evaluate_s",
    "best_policy_s",
    "table_s",
    "checkpoint_s",
    "checkpoint_write_s",
    "epoch_total_s",
)
"""The per-epoch table's columns from the timeline (seconds): the EPOCH_PHASES' spans summed per epoch (but `loop`,
which is wall_s) and epoch_total_s, the epoch's main-thread wall time from its start to the end of its last phase."""
_INSIDE_LOOP = ("warmup",)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat's starttime against /proc/uptime, to 1/CLK_TCK
    s, usually 10 ms), or None where /proc is not available."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the parenthesised command name
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Span:
    """One phase: `seconds` of wall time from `start_s` (seconds since the process started), in `epoch` (0: the
    run's own phases, e.g. start-up); `overlapped` when it ran beside the main thread."""

    phase: str
    epoch: int
    start_s: float
    seconds: float
    overlapped: bool = False


class RunTimeline:
    """The spans of one run, on the clock of `process_age_s` (host seconds).

    Args:
        origin: the `time.perf_counter()` value of second 0; default: the process start (`process_age_s`), else now.
    The run's first span is usually "startup" (`add_startup`): from the process start to the point the caller's
    work began (interpreter start-up, module imports, argument checks).
    """

    def __init__(self, origin: float | None = None) -> None:
        if origin is None:
            age = process_age_s()
            origin = time.perf_counter() - (age or 0.0)
        self.origin = origin
        self.spans: list[Span] = []

    def now_s(self) -> float:
        """Seconds since second 0."""
        return time.perf_counter() - self.origin

    def add(
        self, phase: str, seconds: float, epoch: int = 0, start_s: float | None = None, overlapped: bool = False
    ) -> Span:
        """Record a span measured elsewhere (start_s default: now less `seconds`). Raises ValueError for an empty
        phase, a negative or non-finite `seconds`, or an epoch < 0."""
        if not phase:
            raise ValueError("phase must be a non-empty name")
        if not (seconds >= 0 and seconds != float("inf")):
            raise ValueError(f"seconds must be finite and >= 0, got {seconds!r} for phase {phase!r}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        span = Span(phase, epoch, self.now_s() - seconds if start_s is None else start_s, seconds, overlapped)
        self.spans.append(span)
        return span

    def add_startup(self, until: float) -> Span:
        """The "startup" span: from second 0 to `until` (a time.perf_counter value: where the caller's work began)."""
        return self.add("startup", max(0.0, until - self.origin), start_s=0.0)

    @contextmanager
    def span(self, phase: str, epoch: int = 0, nvtx: bool = True) -> Iterator[None]:
        """Time the body as `phase` (recorded also when it raises); with `nvtx` inside a phase_range(phase)."""
        start = self.now_s()
        try:
            with phase_range(phase) if nvtx else nullcontext():
                yield
        finally:
            self.add(phase, self.now_s() - start, epoch, start_s=start)

    def seconds(self, phase: str, epoch: int | None = None) -> float:
        """Total seconds of `phase` (in `epoch`, or in all)."""
        return sum(s.seconds for s in self.spans if s.phase == phase and (epoch is None or s.epoch == epoch))

    def epoch_columns(self, epoch: int) -> dict[str, float]:
        """{EPOCH_TIME_COLUMNS: seconds} of `epoch` (0.0 for a phase it did not run). epoch_total_s spans the
        epoch's main-thread spans, from the first one's start to the last one's end."""
        own = [s for s in self.spans if s.epoch == epoch and not s.overlapped]
        cols = {f"{p}_s": self.seconds(p, epoch) for p in EPOCH_PHASES if p != "loop"}
        cols["epoch_total_s"] = (max(s.start_s + s.seconds for s in own) - min(s.start_s for s in own)) if own else 0.0
        return {c: cols[c] for c in EPOCH_TIME_COLUMNS}

    def frame(self) -> pd.DataFrame:
        """The spans as a DataFrame with TIMELINE_COLUMNS, in the order recorded."""
        return pd.DataFrame([astuple(s) for s in self.spans], columns=list(TIMELINE_COLUMNS))

    def write(self, run_dir: str | Path) -> Path:
        """Replace run_dir/timeline.csv (atomically: hotloop.profiles.durable_files.write_text_atomic); returns
        its path. OSError passes through."""
        return write_text_atomic(Path(run_dir) / "timeline.csv", self.frame().to_csv(index=False))

    def summary(self, total_s: float | None = None) -> list[str]:
        """Lines saying where the run's `total_s` seconds (default: now) went: the share in the epochs' loops, then
        each other phase's seconds and share, largest first, and what no span holds ("other"). Nested spans (a
        warm-up inside a loop) and overlapped ones are shown apart, not summed twice."""
        total = self.now_s() if total_s is None else total_s
        main: dict[str, float] = {}
        for s in self.spans:
            if not s.overlapped and s.phase not in _INSIDE_LOOP:
                main[s.phase] = main.get(s.phase, 0.0) + s.seconds
        loop = main.pop("loop", 0.0)
        warm = self.seconds("warmup")
        pct = (lambda x: 100.0 * x / total) if total > 0 else (lambda x: float("nan"))
        lines = [
            f"run {total:.2f} s: {loop:.2f} s ({pct(loop):.0f}%) in the epochs' loops"
            + (f", of which {warm:.2f} s compiling kernels and capturing graphs" if warm else "")
        ]
        rest = sorted(main.items(), key=lambda kv: -kv[1])
        other = total - loop - sum(main.values())
        parts = [f"{name} {sec:.2f} s ({pct(sec):.0f}%)" for name, sec in rest] + [f"other {max(other, 0):.2f} s"]
        lines.append("  the rest: " + ", ".join(parts))
        background = sum(s.seconds for s in self.spans if s.overlapped)
        if background:
            lines.append(f"  in the background (beside the loop): checkpoint writes {background:.2f} s")
        return lines
