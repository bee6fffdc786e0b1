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

The first epoch the census is given is left out, whatever its number (a resumed run's first epoch captures again): it
compiles the kernels and captures the CUDA graphs, and capture synchronizes. The readback, evaluation and checkpoint
at the end of an epoch are left out too (the epoch's one host read). On a machine without CUDA nothing is measured:
host "syncs" of CPU tensors wait for no device.

A non_blocking copy between a CUDA tensor and pageable host memory (the driver makes it synchronous; torch raises
no warning) is seen by its hook when made through `Tensor.copy_` / `.to` / `.cuda` from Python.
Not seen (the guarded window's trace sees them in its K iterations only): such a copy made from C++, syncs through
the device-generic `torch.Event` / `torch.Stream` or through a function bound before the hooks were installed
(sync_hooks' limits), and C++ syncs that raise no sync debug warning.
Source of the warning text: c10/cuda/CUDAFunctions.cpp, `warn_or_error_on_sync`.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

from hotloop.guards.sync_hooks import SyncHooks, call_site

SYNC_WARNING = "called a synchronizing CUDA operation"
"""The text of the warning torch raises in sync debug mode "warn" (c10/cuda/CUDAFunctions.cpp)."""


@dataclass
class LoopSyncCensus:
    """Counts the training loop's host syncs over every epoch after the first it is given (module docstring).

    Drive it with `begin(epoch)` right before an epoch's loop and `end()` when the loop has queued its last launch
    (the "readback" phase; also after an exception: `end` is idempotent). `cuda` (default: torch.cuda.is_available())
    says whether there is a device to sync with; without one `begin` does nothing. After the run: `epochs` (the
    epoch numbers watched), `skipped` (the first epoch's number, None before it), `sites` (Counter of "api at
    file:line" -> calls), `total` (all calls) and `verdict()`.
    Raises RuntimeError from `begin` while a census epoch is open.
    """

    cuda: bool = field(default_factory=torch.cuda.is_available)
    epochs: list[int] = field(default_factory=list)
    skipped: int | None = None
    sites: Counter = field(default_factory=Counter)
    _hooks: SyncHooks | None = None
    _warnings: warnings.catch_warnings | None = None

    def begin(self, epoch: int) -> None:
        if self._hooks is not None:
            raise RuntimeError("LoopSyncCensus.begin: the census of an epoch is already open")
        if not self.cuda:
            return
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
                    self.sites[f"sync debug warning at {call_site()[0]}"] += 1
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
        self.epochs.append(epoch)

    def end(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is None:
            return
        try:
            hooks.__exit__(None, None, None)
        finally:
            self._warnings.__exit__(None, None, None)
            self._warnings = None
        for hit in hooks.hits:
            self.sites[f"{hit.api} at {hit.site}"] += 1

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def verdict(self) -> tuple[int | None, str]:
        """(measured, status or evidence): (None, "not applicable (no CUDA)") without CUDA (no device to sync
        with, as the guarded window's sync rows say: hotloop.guards.guard.NOT_APPLICABLE), (None, "not measured
        (<why>)") when no epoch was watched (a run of one epoch), else (total calls, their sites as "site xN; ..."
        or "none in epochs 2-E")."""
        if not self.cuda:
            return None, "not applicable (no CUDA)"
        if not self.epochs:
            return None, ("not measured (no epoch after the first: the first compiles and captures; run "
                          "--epochs 2 or more)")
        span = f"epoch{'s' * (len(self.epochs) > 1)} {self.epochs[0]}" + (
            f"-{self.epochs[-1]}" if len(self.epochs) > 1 else "")
        if not self.sites:
            return 0, f"none in the loop of {span}"
        return self.total, f"in the loop of {span}: " + "; ".join(f"{s} x{n}" for s, n in self.sites.most_common())

