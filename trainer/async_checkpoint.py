"""Checkpoints that do not stop training: the main thread takes a snapshot, a background thread writes it.

`AsyncCheckpointer.checkpoint_epoch(epoch, state)` is called once per epoch, after the epoch's loop and its
readback (hotloop.guards.run.run_training: after the table's row; never between an epoch's start and its "readback"
phase). When a checkpoint is due (every `interval` epochs, counted from epoch 0, so a resumed run keeps the schedule;
and always the run's last epoch) it calls `state()` (Trainer.checkpoint_state: (tensors, meta)) and snapshots it:

- host state (meta: counters, config; CPU tensors: RNG states, generator) is copied on the main thread at once;
- CUDA tensors, mode "device" (the default): the side stream waits for the main stream (an event), copies every
  CUDA tensor D2D into preallocated device buffers (~0.6 GB at seed scale: ~0.3 ms at the H200's copy bandwidth),
  records an event the main stream waits for (so the next epoch may overwrite the live tensors at once: the GPU
  waits only for the D2D, the host never), then copies the device buffers D2H into preallocated pinned host
  buffers, on the side stream, beside the next epoch's loop;
- mode "direct" (the device buffers could not be allocated, or `device_snapshot=False`): the side stream copies the
  live tensors D2H into the pinned buffers and the main stream waits for that copy (the GPU waits ~12-25 ms at seed
  scale; the host still never waits);
- mode "host" (a CPU trainer, or pinned memory could not be allocated): a synchronous copy on the main thread
  (on CUDA a blocking D2H: a host sync outside the loop, said in a note).

The snapshot is handed to the writer thread once its D2H copy is known complete, WITHOUT blocking: `event.query()`
on the main thread at the next `checkpoint_epoch` / `poll` (outside the loop); an explicit wait only at the end
(`close`, or `wait`). The writer runs hotloop.trainer.checkpoint.write_host_checkpoint: SHA-256 digests,
torch.save into a temp file beside the checkpoint (`.checkpoint.pt.<random>.tmp`), fsync, os.replace, fsync of the
folder: the same file format and version as save_checkpoint, so load_checkpoint and resume read it unchanged. The
writer calls no CUDA API (its tensors are on the host; the loop census hooks, hotloop.guards.loop_syncs, see every
thread). Its heavy parts release the GIL: hashlib's SHA-256, torch's CRC32, the file writes (torch.save makes a few
dozen Python write calls, each storage's bytes in one) and fsync; it still takes a CPU core for the write's length.

At most one snapshot is in flight (copying or writing). A checkpoint that falls due while one is in flight is
SKIPPED, recorded (`records`, `skipped=True` with the reason) and announced (`note`), and owed: the next epoch end
with the pipeline free takes it. Skipping rather than waiting keeps an epoch's wall time free of disk time when
the disk is slower than `interval` epochs of training; what a kill can lose is bounded by the write time plus
`interval` epochs and is shown in the records. The last epoch's checkpoint is never skipped: its epoch waits for
one in flight (rare: only when that write is still running), takes the snapshot, and `close()` (after the epochs,
before run_training's `after_epochs`) waits for its write, so nothing runs in the background after the epochs (the
gate's guarded window sees no writer); that final wait is the run's, not an epoch's (`CheckpointRecord.wait_s`).

Errors: a writer failure is kept and raised on the main thread at the next `poll` / `checkpoint_epoch` / `wait` /
`close`: hotloop.profiles.disk_full.DiskFullError as it is (it names the file), any other exception as
`CheckpointWriteError` (an OSError naming the file and the epoch, the cause chained). The temp file is removed and
the last complete checkpoint stays whole (os.replace is atomic), so the folder resumes from it; a kill -9 at any
moment leaves it too (a killed writer's temp file is removed at the next start: hotloop.profiles.run_lock.
remove_temp_files). Leaving `close` / the context manager while a write runs waits for it (under the watchdog, when
one is given, armed as "checkpoint writer"), so no write outlives the run folder's lock.

Sources: the stage-then-persist split of torch.distributed.checkpoint.async_save (copy the state to host memory, then
write it on a background thread). That function is not used: it writes a folder of shard files with its own metadata
(not hotloop's one file with per-tensor digests, which load_checkpoint, resume and the best-policy file share), and
its staging copies to the host on the caller's thread; the device snapshot here keeps even that D2H copy off the
main stream. Also CUDA's stream/event ordering (CUDA C Programming Guide, "Streams"; cudaStreamWaitEvent,
cudaEventQuery) and save_checkpoint's write-temp/fsync/rename pattern.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import torch

from hotloop.profiles.disk_full import DiskFullError
from hotloop.trainer.checkpoint import check_checkpoint_args, write_host_checkpoint

SNAPSHOT_MODES = ("device", "direct", "host")
"""How CUDA tensors are snapshotted (module docstring); "host" is also every CPU trainer's mode."""
WRITER_THREAD = "hotloop-checkpoint-writer"
"""The background writer thread's name (shown in stack dumps)."""


@dataclass
class CheckpointRecord:
    """One due checkpoint, for the run timeline and the report (host seconds, time.perf_counter's clock).

    epoch: the epoch it holds (or would have held, when skipped). skipped: True when it fell due while another was
    in flight (nothing copied or written; `reason` says which). mode: a SNAPSHOT_MODES value ("" when skipped).
    main_s: seconds of the main thread inside `checkpoint_epoch` for this epoch (poll, snapshot and launches; for
    the last epoch also a wait for the write before it, if one was still running). wait_s: seconds the main thread
    waited in `wait` / `close` for this checkpoint's copy and write (the last epoch's, at the end of the run; 0.0
    for one written while training went on). write_start: time.perf_counter() when the writer began (NaN before).
    write_s: the writer's seconds (digests, torch.save, fsync, rename; NaN until it ends). bytes: the file's size
    in bytes (0 until written). tensor_bytes: bytes of tensor data in the snapshot. written: True once the file is
    in place. error: "" or the writer's exception as "Type: message". The writer fills write_start, write_s,
    bytes, written and error; read them once `AsyncCheckpointer.busy` is False (after `wait` / `close`)."""

    epoch: int
    skipped: bool = False
    reason: str = ""
    mode: str = ""
    main_s: float = 0.0
    wait_s: float = 0.0
    write_start: float = math.nan
    write_s: float = math.nan
    bytes: int = 0
    tensor_bytes: int = 0
    written: bool = False
    error: str = ""


class CheckpointWriteError(OSError):
    """The background writer could not write a checkpoint. `path` (Path), `epoch` (int); `errno` is the cause's when
    it was an OSError (None otherwise); the cause is chained (__cause__). The last complete checkpoint is kept."""

    def __init__(self, path: Path, epoch: int, cause: BaseException) -> None:
        super().__init__(
            f"checkpoint {path} of epoch {epoch} could not be written by the background writer "
            f"({type(cause).__name__}: {cause}); the last complete checkpoint at {path} is kept"
        )
        self.path, self.epoch = path, epoch
        self.errno = getattr(cause, "errno", None)


class _Watchdog:
    """What AsyncCheckpointer needs of a hang watchdog (hotloop.guards.watchdog.HangWatchdog)."""

    def arm(self, label: str) -> None: ...

    def disarm(self) -> None: ...


@dataclass
class _Pending:
    """A snapshot whose D2H copy was launched and not yet seen complete."""

    record: CheckpointRecord
    host: dict[str, torch.Tensor]
    meta: dict
    done: torch.cuda.Event
    sources: Mapping[str, torch.Tensor]  # the tensors read on the side stream, alive until the copy is done


class AsyncCheckpointer:
    """Writes a trainer's checkpoints in the background (module docstring). Use as a context manager, or call
    `close()` at the end.

    Args:
        path: the checkpoint file (run_dir/checkpoint.pt); its folder must exist when a checkpoint is taken.
        interval: a checkpoint is due at every epoch divisible by it (>= 1; Config.checkpoint_interval).
        last_epoch: the run's last epoch (cfg.epochs), always checkpointed (never skipped); None: none is last.
        watchdog: an object with arm(label) / disarm() (HangWatchdog) armed as "checkpoint writer" while `close`
            waits for a write still running (after an error in the run); None: wait unguarded.
        note: called with a line to show the user (the first checkpoint skipped behind each write, a fallback
            mode); None: silent, but the same facts stay in `records` and `mode_note`.
        device_snapshot: False: never allocate device buffers (mode "direct" on CUDA).
    Attributes: records (list of CheckpointRecord, one per due checkpoint, in order), epochs_seen (the calls of
    `checkpoint_epoch`: the epochs this run trained), mode (the last snapshot's
    mode, "" before one), mode_note (why the mode is not "device" on CUDA, "" otherwise).
    Raises ValueError for interval < 1 or a last_epoch < 1.
    """

    def __init__(
        self,
        path: str | Path,
        interval: int = 1,
        last_epoch: int | None = None,
        watchdog: _Watchdog | None = None,
        note: Callable[[str], None] | None = None,
        device_snapshot: bool = True,
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"AsyncCheckpointer: interval must be an int >= 1 (epochs), got {interval!r}")
        if last_epoch is not None and (
            isinstance(last_epoch, bool) or not isinstance(last_epoch, int) or last_epoch < 1
        ):
            raise ValueError(f"AsyncCheckpointer: last_epoch must be an int >= 1 or None, got {last_epoch!r}")
        self.path, self.interval, self.last_epoch = Path(path), interval, last_epoch
        self.watchdog, self.note, self.device_snapshot = watchdog, note or (lambda line: None), device_snapshot
        self.records: list[CheckpointRecord] = []
        self.epochs_seen = 0
        self.mode, self.mode_note = "", ""
        self._owed = False
        self._pending: _Pending | None = None
        self._thread: threading.Thread | None = None
        self._error: tuple[BaseException, CheckpointRecord] | None = None
        self._layout: tuple | None = None
        self._host: dict[str, torch.Tensor] = {}
        self._dev: dict[str, torch.Tensor] | None = None
        self._side: torch.cuda.Stream | None = None
        self._pinned = False
        self._writing: CheckpointRecord | None = None
        self._skipped_behind: int | None = None
        self._closed = False

    # --- the per-epoch call -------------------------------------------------------------------------------------

    def due(self, epoch: int) -> bool:
        """Whether a checkpoint falls due after `epoch`: epoch % interval == 0, the last epoch, or one owed (skipped
        while the pipeline was busy)."""
        return epoch % self.interval == 0 or epoch == self.last_epoch or self._owed

    def checkpoint_epoch(
        self, epoch: int, state: Callable[[], tuple[Mapping[str, torch.Tensor], Mapping]]
    ) -> CheckpointRecord | None:
        """The checkpoint work after `epoch` (call it once per epoch, outside the epoch's loop): `poll`, then when
        one is `due`, the snapshot of `state()` (called only then: Trainer.checkpoint_state) handed on to the writer
        (module docstring), or a skip when one is in flight. The last epoch waits for one in flight, then snapshots
        (`close` waits for its write). Returns the epoch's CheckpointRecord (also appended to `records`), None when none
        was due. Raises the writer's error (DiskFullError / CheckpointWriteError, from an earlier write or, for the
        last epoch, from this one); ValueError from hotloop.trainer.checkpoint.check_checkpoint_args for a bad
        state (before anything is copied) or for CUDA tensors on more than one device; RuntimeError once closed."""
        if self._closed:
            raise RuntimeError(f"AsyncCheckpointer for {self.path} is closed")
        start = time.perf_counter()
        self.epochs_seen += 1
        self.poll()
        if not self.due(epoch):
            return None
        last = epoch == self.last_epoch
        if last:
            self.wait()
        elif self.busy:
            held = self._pending.record.epoch if self._pending is not None else self._writing.epoch
            record = CheckpointRecord(
                epoch,
                skipped=True,
                reason=f"epoch {held}'s checkpoint was still in flight",
                main_s=time.perf_counter() - start,
            )
            self.records.append(record)
            self._owed = True
            if held != self._skipped_behind:  # one line per write that held checkpoints up; all are in `records`
                self._skipped_behind = held
                self.note(
                    f"checkpoint of epoch {epoch} skipped: epoch {held}'s was still being written (the first "
                    f"epoch end after it takes one; later skips behind it are counted in the summary)"
                )
            return record
        tensors, meta = state()
        record = self._snapshot(epoch, tensors, meta)
        self._owed = False
        record.main_s = time.perf_counter() - start
        return record

    def reserve(self, tensors: Mapping[str, torch.Tensor]) -> str:
        """Allocate the snapshot buffers for the layout (names, shapes, dtypes, devices) of `tensors` now, before
        the epochs: the pinned host buffers and, on CUDA, the side stream and the device buffers, which the first
        snapshot would otherwise allocate inside its epoch (seed scale: 583 MB; the H100 run of 2026-12-05 spent
        0.357 s on the main thread in the one epoch that took the first snapshot, results/h200/whole_run/). A later
        snapshot of the same layout reuses them. Returns the snapshot mode it will use ("device", "direct" or
        "host"). Raises RuntimeError once closed, ValueError for CUDA tensors on more than one device."""
        if self._closed:
            raise RuntimeError(f"AsyncCheckpointer for {self.path} is closed")
        _, self.mode = self._buffers(tensors, self._cuda_device(tensors))
        return self.mode

    @property
    def busy(self) -> bool:
        """True while a snapshot is in flight: its D2H copy not yet handed on, or the writer thread running."""
        return self._pending is not None or (self._thread is not None and self._thread.is_alive())

    def poll(self) -> None:
        """Never blocks: raise the writer's error if it failed since the last call; hand a snapshot whose D2H copy
        has completed (its event's query(), a cudaEventQuery: no sync) on to the writer. Call it only outside an
        epoch's loop (the loop census records every query)."""
        self._raise_error()
        if self._pending is not None and self._pending.done.query():
            self._hand_over()

    def wait(self) -> None:
        """Block until nothing is in flight: synchronize the pending D2H copy's event (a host wait: only outside
        the loop), hand it on, join the writer (the seconds go to its record's wait_s); then raise its error if it
        failed."""
        start, record = time.perf_counter(), None
        if self._pending is not None:
            record = self._pending.record
            self._pending.done.synchronize()
            self._hand_over()
        if self._thread is not None and self._thread.is_alive():
            record = self._writing
            self._thread.join()
        if record is not None:
            record.wait_s += time.perf_counter() - start
        self._raise_error()

    def close(self, flush: bool = True) -> None:
        """End: with `flush`, `wait` for everything in flight and raise the writer's error; without (the run is
        ending on an error), join a write that is running, drop a snapshot not yet handed on (recorded with error
        "not written: ...") and raise nothing. While it blocks, the watchdog (when given) is armed as "checkpoint
        writer", so a stuck writer ends in the watchdog's hang exit. Frees the buffers; idempotent."""
        if self._closed:
            return
        self._closed = True
        armed = False
        try:
            if self.busy and self.watchdog is not None:
                try:
                    self.watchdog.arm("checkpoint writer")
                    armed = True
                except RuntimeError:  # the watchdog's thread is gone: it already ended the run or said why
                    pass
            if flush:
                self.wait()
            else:
                if self._pending is not None:
                    self._pending.record.error = "not written: the run ended before its copy was handed to the writer"
                    self._pending = None
                if self._thread is not None:
                    self._thread.join()
        finally:
            self._host, self._dev, self._layout, self._side = {}, None, None, None
            if armed:
                self.watchdog.disarm()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(flush=exc is None)
        if exc is not None and self._error is not None and hasattr(exc, "add_note"):  # never lost: said with exc
            failed, record = self._error
            exc.add_note(
                f"also: the background write of {self.path} (epoch {record.epoch}) failed "
                f"({type(failed).__name__}: {failed})"
            )

    def summary(self) -> str:
        """One line: checkpoints written and their bytes (total, per file, per epoch of this run), those skipped, the
        background write seconds, the main thread's seconds in the epochs and waiting at the end, the mode."""
        written = [r for r in self.records if r.written]
        total = sum(r.bytes for r in written)
        mode = f", snapshot mode {self.mode}" + (f" ({self.mode_note})" if self.mode_note else "") if self.mode else ""
        return (
            f"checkpoints: {len(written)} written, every {self.interval} epoch(s) and the last: "
            f"{total / 1e6:.1f} MB ({total / max(len(written), 1) / 1e6:.1f} MB each, "
            f"{total / max(self.epochs_seen, 1) / 1e6:.1f} MB per epoch over {self.epochs_seen}), "
            f"{sum(r.skipped for r in self.records)} skipped as busy; {sum(r.write_s for r in written):.2f} s "
            f"writing in the background, {sum(r.main_s for r in self.records):.3f} s on the main thread in the "
            f"epochs, {sum(r.wait_s for r in self.records):.2f} s waiting at the end{mode}"
        )

    # --- internals ----------------------------------------------------------------------------------------------

    def _raise_error(self) -> None:
        if self._error is None:
            return
        exc, record = self._error
        self._error = None
        if isinstance(exc, DiskFullError):  # names the file and says what is kept
            raise exc
        raise CheckpointWriteError(self.path, record.epoch, exc) from exc

    def _snapshot(self, epoch: int, tensors: Mapping[str, torch.Tensor], meta: Mapping) -> CheckpointRecord:
        path, plain_meta = check_checkpoint_args(self.path, tensors, meta)
        device = self._cuda_device(tensors)
        record = CheckpointRecord(epoch, tensor_bytes=sum(t.numel() * t.element_size() for t in tensors.values()))
        self.records.append(record)
        host, mode = self._buffers(tensors, device)
        self.mode = record.mode = mode
        cuda = [n for n, t in tensors.items() if t.is_cuda]
        with torch.no_grad():
            for name, t in tensors.items():
                if not t.is_cuda or mode == "host":
                    host[name].copy_(t.detach())  # host state now; on CUDA in mode "host": a blocking D2H
            if mode == "host":
                self._start_writer(record, host, plain_meta)
                return record
            main = torch.cuda.current_stream(device)
            side = self._side
            side.wait_stream(main)  # the copies read what the epoch wrote
            with torch.cuda.stream(side):
                if mode == "device":
                    for name in cuda:
                        self._dev[name].copy_(tensors[name].detach(), non_blocking=True)
                    copied = torch.cuda.Event()
                    copied.record(side)
                    main.wait_event(copied)  # the next epoch overwrites the live tensors only after the D2D
                    for name in cuda:
                        host[name].copy_(self._dev[name], non_blocking=True)
                else:  # "direct": the D2H reads the live tensors
                    for name in cuda:
                        host[name].copy_(tensors[name].detach(), non_blocking=True)
                done = torch.cuda.Event()
                done.record(side)
            if mode == "direct":
                main.wait_event(done)
        self._pending = _Pending(record, host, plain_meta, done, dict(tensors))
        return record

    def _cuda_device(self, tensors: Mapping[str, torch.Tensor]) -> torch.device | None:
        """The one CUDA device of `tensors` (None: all on the host); ValueError naming the file for several."""
        devices = {t.device for t in tensors.values() if t.is_cuda}
        if len(devices) > 1:
            raise ValueError(f"checkpoint {self.path}: CUDA tensors on several devices {sorted(map(str, devices))}")
        return next(iter(devices), None)

    def _buffers(
        self, tensors: Mapping[str, torch.Tensor], device: torch.device | None
    ) -> tuple[dict[str, torch.Tensor], str]:
        """The host buffers for `tensors` (made at the first snapshot, reused while the names, shapes and dtypes
        stay the same) and the snapshot mode; on CUDA also the side stream and the device buffers."""
        layout = tuple((n, tuple(t.shape), t.dtype, t.is_cuda) for n, t in tensors.items())
        if layout != self._layout:
            self._host, self._dev, self._layout, self._pinned = {}, None, None, False
            if device is not None:
                try:
                    self._host = {
                        n: torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for n, t in tensors.items()
                    }
                    self._pinned = True
                except RuntimeError as exc:  # cudaHostAlloc failed
                    self._set_note(
                        f"pinned host memory not available ({str(exc).splitlines()[0]}); checkpoints "
                        f"copy from the GPU synchronously (a host sync, outside the loop)"
                    )
            if not self._pinned:
                self._host = {n: torch.empty(t.shape, dtype=t.dtype) for n, t in tensors.items()}
            if self._pinned:
                self._side = torch.cuda.Stream(device)
                if self.device_snapshot:
                    self._dev = self._device_buffers(tensors, device)
                else:
                    self._set_note("device snapshot off: the GPU waits for each checkpoint's D2H copy")
            self._layout = layout
        if device is None or not self._pinned:
            return self._host, "host"
        return self._host, "device" if self._dev is not None else "direct"

    def _device_buffers(
        self, tensors: Mapping[str, torch.Tensor], device: torch.device
    ) -> dict[str, torch.Tensor] | None:
        """Device buffers for the CUDA tensors (on the side stream's pool), None when they do not fit."""
        try:
            with torch.cuda.stream(self._side):
                return {n: torch.empty(t.shape, dtype=t.dtype, device=device) for n, t in tensors.items() if t.is_cuda}
        except torch.cuda.OutOfMemoryError as exc:
            need = sum(t.numel() * t.element_size() for t in tensors.values() if t.is_cuda)
            self._set_note(
                f"no room on {device} for a {need / 1e6:.0f} MB device snapshot "
                f"({str(exc).splitlines()[0]}); the GPU waits for each checkpoint's D2H copy instead"
            )
            return None

    def _set_note(self, line: str) -> None:
        self.mode_note = line
        self.note(line)

    def _hand_over(self) -> None:
        pending, self._pending = self._pending, None
        self._start_writer(pending.record, pending.host, pending.meta)

    def _start_writer(self, record: CheckpointRecord, host: dict[str, torch.Tensor], meta: dict) -> None:
        thread = threading.Thread(target=self._write, args=(record, host, meta), name=WRITER_THREAD, daemon=True)
        self._thread, self._writing = thread, record
        thread.start()

    def _write(self, record: CheckpointRecord, host: dict[str, torch.Tensor], meta: dict) -> None:
        """The writer thread: host tensors only, no CUDA API."""
        start = record.write_start = time.perf_counter()
        try:
            record.bytes = write_host_checkpoint(self.path, host, meta)
            record.written = True
        except BaseException as exc:  # noqa: BLE001 (kept and raised on the main thread)
            record.error = f"{type(exc).__name__}: {exc}"
            self._error = (exc, record)
        finally:
            record.write_s = time.perf_counter() - start
