"""Host syncs of the training loop over a run's steady epochs, outside the guarded window: `LoopSyncCensus`.

The guarded window (hotloop.guards.guard) profiles K consecutive loop iterations; a sync that runs every N
iterations with N > K, or only at some iteration counts, may never fall inside it. The census watches the loop body
(`Trainer.iterate`, from the start of an epoch to its "readback" phase) of every epoch after the first, the whole
run, with two sources:

- `SyncHooks` (hotloop.guards.sync_hooks): the Python-level sync APIs and read-backs of CUDA tensors, each with its
  call site;
- torch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`, which SyncHooks sets while active): the C++
  warning "called a synchronizing CUDA operation" that ATen raises where it waits for the device itself (a blocking
  copy to or from the host, `nonzero`, a boolean-mask index, `torch.tensor(..., device="cuda")` from host data).
  A warning raised inside a hooked call is that call's, already counted; the others are counted with the call site
  of the Python line that made them (the first frame outside torch and guards/).

Completion queries too (`Event.query` / `Stream.query` through the hooks, hotloop.guards.sync_hooks.QUERY_APIS): a
host that queries until the GPU is done waits as a sync does, with no sync call. While an epoch is watched the census
wraps `hotloop.trainer.loop.phase_range` (the ranges `Trainer.iterate` and `Trainer.phase` open) to count the loop's
iterations (its "step" ranges, numbered 1, 2, ... per epoch) and the runs of each phase in each iteration, and to
know the phase ranges open around each query. A query is allowed while its iteration's queries in its innermost
allowance phase stay within the allowance (hotloop.guards.criteria.query_allowance: the readback's one query per
`readback_publish`, which runs every `log_interval` iterations), the first in call order first; every other one
(another phase, a second query of one publication, outside every iteration) is a polling query and counts in
"no sync in the epochs' loop" with its call site and the iterations it ran in (their period: "every 300
iterations"). The syncs' iterations are kept too and their period named. The host time of the polling runs
(hotloop.guards.sync_hooks.spin_spans) is reported beside them.

The first epoch the census is given is left out, whatever its number (a resumed run's first epoch captures again): it
compiles the kernels and captures the CUDA graphs, and capture synchronizes. The readback, evaluation and checkpoint
at the end of an epoch are left out too (the epoch's one host read). On a machine without CUDA nothing is measured:
host "syncs" of CPU tensors wait for no device.

A non_blocking copy between a CUDA tensor and pageable host memory (the driver makes it synchronous; torch raises
no warning) is seen by its hook when made through `Tensor.copy_` / `.to` / `.cuda` from Python.
Not seen (the guarded window's trace sees them in its K iterations only): such a copy made from C++, syncs and
queries through the device-generic `torch.Event` / `torch.Stream` or through a function bound before the hooks were
installed (sync_hooks' limits), queries made from C++ (cudaEventQuery / cudaStreamQuery with no Python call), C++
syncs that raise no sync debug warning, and a host spinning on pinned host memory the GPU writes (no CUDA call at
all: docs/criteria.md, "Polling waits").
Source of the warning text: c10/cuda/CUDAFunctions.cpp, `warn_or_error_on_sync`.
"""

from __future__ import annotations

import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pandas as pd
import torch

from hotloop.guards.criteria import query_allowance
from hotloop.guards.step_metrics import polling_flags
from hotloop.guards.sync_hooks import SyncHooks, call_site, spin_spans

SYNC_WARNING = "called a synchronizing CUDA operation"
"""The text of the warning torch raises in sync debug mode "warn" (c10/cuda/CUDAFunctions.cpp)."""


class _Tracked:
    """One range opened through `_PhaseTracker`: the original phase_range entered and left, the tracker's record
    kept around it (inline: this runs for every phase range of the watched loop)."""

    __slots__ = ("inner", "name", "opened", "tracker")

    def __init__(self, tracker: _PhaseTracker, name: str, inner) -> None:
        self.tracker, self.name, self.inner, self.opened = tracker, name, inner, False

    def __enter__(self):
        t = self.tracker
        if self.name == t.step_name:
            if t.hooks.step is None:  # an iteration starts (a step range inside one would be its own)
                t.iteration += 1
                t.hooks.step = t.iteration
                self.opened = True
        else:
            t.stack.append(self.name)
            if self.name in t.counted and t.hooks.step is not None:
                t.runs[(t.iteration, self.name)] += 1
        try:
            return self.inner.__enter__()
        except BaseException:
            self._left()
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            return self.inner.__exit__(exc_type, exc, tb)
        finally:
            self._left()

    def _left(self) -> None:
        t = self.tracker
        if self.name == t.step_name:
            if self.opened:
                t.hooks.step = None
            return
        stack = t.stack
        if stack and stack[-1] == self.name:
            stack.pop()
        elif self.name in stack:  # ranges nest: the innermost of that name is the one closing
            del stack[len(stack) - 1 - stack[::-1].index(self.name)]


class _PhaseTracker:
    """Stands in for hotloop.trainer.loop.phase_range while a census epoch is open: numbers the loop's iterations
    (a STEP_RANGE range opened outside any iteration: 1, 2, ... per epoch) in `hooks.step` (None between
    iterations), keeps the other ranges open (outermost first) in `stack`, which is `hooks.phases` (a query records a
    copy), and counts in `runs` (Counter of (iteration, phase)) the runs of the `counted` phases (the allowance's)
    in each iteration. Its cost: about 0.9 us per range on a CPU-only development container where a plain
    phase_range costs 1.1 us (3 ranges per iteration of the hotloop learner's loop: step, env_step, update)."""

    def __init__(
        self, hooks: SyncHooks, original, step_name: str, counted: set[str] | frozenset[str] = frozenset()
    ) -> None:
        self.hooks, self.original, self.counted = hooks, original, frozenset(counted)
        self.step_name = step_name
        self.iteration = 0
        self.stack: list[str] = []
        self.runs: Counter = Counter()
        hooks.phases = self.stack

    def __call__(self, name: str, *args, **kwargs) -> _Tracked:
        return _Tracked(self, name, self.original(name, *args, **kwargs))


def period_text(iterations: dict[int, list[int]]) -> str:
    """How often something ran, from {epoch: the iterations (1-based, per epoch) it ran in}: "every N iterations"
    (one gap N between consecutive iterations in every epoch), "every iteration", "once per epoch", else
    "irregular"; then where: "(iterations 300, 600, 900 of epochs 2-3)" (the first 6 iterations of each epoch, the
    same list said once when the epochs agree). "" when there are none."""
    its = {e: sorted(set(v)) for e, v in iterations.items() if v}
    if not its:
        return ""
    gaps = {b - a for v in its.values() for a, b in pairwise(v)}
    how = (
        "every iteration"
        if gaps == {1}
        else f"every {gaps.pop()} iterations"
        if len(gaps) == 1
        else "once per epoch"
        if not gaps
        else "irregular"
    )
    epochs = sorted(its)

    def listed(v: list[int]) -> str:
        return ", ".join(map(str, v[:6])) + (f", ... ({len(v)})" if len(v) > 6 else "")

    if all(its[e] == its[epochs[0]] for e in epochs):
        span = (
            f"epoch {epochs[0]}"
            if len(epochs) == 1
            else f"epochs {epochs[0]}-{epochs[-1]}"
            if epochs == list(range(epochs[0], epochs[-1] + 1))
            else "epochs " + ", ".join(map(str, epochs))
        )
        where = f"iteration{'s' * (len(its[epochs[0]]) > 1)} {listed(its[epochs[0]])} of {span}"
    else:
        where = "; ".join(f"epoch {e}: iterations {listed(its[e])}" for e in epochs)
    return f"{how} ({where})"


@dataclass
class LoopSyncCensus:
    """Counts the training loop's host syncs over every epoch after the first it is given (module docstring).

    Drive it with `begin(epoch)` right before an epoch's loop and `end()` when the loop has queued its last launch
    (the "readback" phase; also after an exception: `end` is idempotent). `cuda` (default: torch.cuda.is_available())
    says whether there is a device to sync with; without one `begin` does nothing. After the run: `epochs` (the
    epoch numbers watched), `skipped` (the first epoch's number, None before it), `sites` (Counter of "api at
    file:line" -> calls), `polls` (Counter of "api at file:line[ in phase]" -> polling queries), `queries` (all
    completion queries), `allowed` (those the allowance let pass), `poll_wait_s` (host seconds in polling runs),
    `iterations` ({site or poll key: {epoch: [iterations]}}), `total` (syncs + polling queries) and `verdict()`.
    `allowance`: {phase: queries per run} (default hotloop.guards.criteria.query_allowance()).
    `loop`: the module whose `phase_range` and `STEP_RANGE` the training loop uses (hotloop.trainer.loop), given by
    the composition layer (hotloop.guards.gate; the guards import no trainer code): the census stands in for its
    phase_range while an epoch is watched. Raises ValueError from `begin` on CUDA without it.
    Raises RuntimeError from `begin` while a census epoch is open.
    """

    cuda: bool = field(default_factory=torch.cuda.is_available)
    loop: Any = None
    epochs: list[int] = field(default_factory=list)
    skipped: int | None = None
    sites: Counter = field(default_factory=Counter)
    polls: Counter = field(default_factory=Counter)
    queries: int = 0
    allowed: int = 0
    poll_wait_s: float = 0.0
    iterations: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    allowance: dict = field(default_factory=query_allowance)
    _hooks: SyncHooks | None = None
    _warnings: warnings.catch_warnings | None = None
    _tracker: _PhaseTracker | None = None

    def begin(self, epoch: int) -> None:
        if self._hooks is not None:
            raise RuntimeError("LoopSyncCensus.begin: the census of an epoch is already open")
        if not self.cuda:
            return
        if self.loop is None:
            raise ValueError("LoopSyncCensus: loop (the training loop's module, hotloop.trainer.loop) was not given")
        if self.skipped is None:  # the run's first epoch compiles and captures
            self.skipped = epoch
            return
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("always", message=SYNC_WARNING)  # every one, not once per line
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING in str(message):
                if not (self._hooks is not None and self._hooks.in_counted_call()):
                    key = f"sync debug warning at {call_site()[0]}"
                    self.sites[key] += 1
                    if self._hooks is not None and self._hooks.step is not None:
                        self.iterations[key][epoch].append(self._hooks.step)
                return
            previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        self._hooks = SyncHooks()
        try:
            self._hooks.__enter__()
        except BaseException:
            self._hooks = None
            self._warnings.__exit__(None, None, None)
            raise
        loop_module = self.loop
        self._tracker = _PhaseTracker(self._hooks, loop_module.phase_range, loop_module.STEP_RANGE, set(self.allowance))
        loop_module.phase_range = self._tracker
        self.epochs.append(epoch)

    def end(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is None:
            return
        tracker, self._tracker = self._tracker, None
        try:
            if tracker is not None and self.loop.phase_range is tracker:
                self.loop.phase_range = tracker.original
            hooks.__exit__(None, None, None)
        finally:
            self._warnings.__exit__(None, None, None)
            self._warnings = None
        epoch = self.epochs[-1]
        for hit in hooks.hits:
            key = f"{hit.api} at {hit.site}"
            self.sites[key] += 1
            if hit.step is not None:
                self.iterations[key][epoch].append(hit.step)
        self._count_queries(hooks.query_frame(), tracker, epoch)

    def _count_queries(self, q: pd.DataFrame, tracker: _PhaseTracker | None, epoch: int) -> None:
        """Judge an epoch's hooked queries against the allowance per iteration and phase run (module docstring)."""
        if not len(q):
            return
        runs = pd.DataFrame(
            [(i, p, n) for (i, p), n in (tracker.runs.items() if tracker else ())], columns=["step", "phase", "runs"]
        )
        steps = q["step"].astype("Int64").fillna(-1)
        polling = polling_flags(steps, q["phases"], runs, self.allowance)
        spans = spin_spans(q)
        self.queries += len(q)
        self.allowed += int((~polling).sum())
        for (api, site, step, phases), poll, span in zip(
            zip(q["api"], q["site"], q["step"], q["phases"]), polling, spans
        ):
            if not poll:
                continue
            key = f"{api} at {site}" + (f" in {phases[-1]}" if phases else "")
            self.polls[key] += 1
            self.poll_wait_s += float(span)
            if not pd.isna(step):
                self.iterations[key][epoch].append(int(step))

    @property
    def total(self) -> int:
        """Syncs + polling queries over the watched epochs."""
        return sum(self.sites.values()) + sum(self.polls.values())

    def verdict(self) -> tuple[int | None, str]:
        """(measured, status or evidence): (None, "not applicable (no CUDA)") without CUDA (no device to sync
        with, as the guarded window's sync rows say: hotloop.guards.guard.NOT_APPLICABLE), (None, "not measured
        (<why>)") when no epoch was watched (a run of one epoch), else (total calls, their sites as "site xN; ..."
        or "none in epochs 2-E")."""
        if not self.cuda:
            return None, "not applicable (no CUDA)"
        if not self.epochs:
            return None, (
                "not measured (no epoch after the first: the first compiles and captures; run --epochs 2 or more)"
            )
        span = f"epoch{'s' * (len(self.epochs) > 1)} {self.epochs[0]}" + (
            f"-{self.epochs[-1]}" if len(self.epochs) > 1 else ""
        )
        queries = ""
        if self.queries:
            allowance = ", ".join(f"{n} per {p}" for p, n in self.allowance.items()) or "none"
            queries = (
                f" (completion queries {self.queries}, {self.allowed} allowed: {allowance}"
                + (
                    f"; {sum(self.polls.values())} polling, {self.poll_wait_s * 1e3:.3f} ms of host time in "
                    f"their polling runs"
                    if self.polls
                    else ""
                )
                + ")"
            )
        if not self.sites and not self.polls:
            return 0, f"none in the loop of {span}" + queries
        found = [f"{s} x{n}" + self._when(s) for s, n in self.sites.most_common()]
        found += [f"polling: {s} x{n}" + self._when(s) for s, n in self.polls.most_common()]
        return self.total, f"in the loop of {span}: " + "; ".join(found) + queries

    def _when(self, key: str) -> str:
        text = period_text(self.iterations.get(key, {}))
        return f", {text}" if text else ""
