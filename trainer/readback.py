"""Non-blocking metric readback: device scalars copied into a pinned, double-buffered host array.

`AsyncReadback.publish` enqueues, on the current stream, a `non_blocking` device-to-host copy of a few float32
metrics into one of two pinned host buffers and records a CUDA event after it; `poll` hands back the newest
publication whose event has completed (`Event.query()`, which never waits). The hot loop therefore reads its
metrics one or more steps late instead of stalling the stream with `.item()` / `.tolist()`.
Source: the pinned double-buffer pattern of asynchronous device-to-host copies, CUDA C Programming Guide,
"Asynchronous Concurrent Execution" (copies to page-locked host memory overlap kernels; events mark completion).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch


class Reading(NamedTuple):
    """One completed publication: `step` (the host int given to publish) and `values` (name -> host float, in the
    order of the names given to AsyncReadback). All values come from that one publication."""

    step: int
    values: dict[str, float]


class EventLike(Protocol):
    """What AsyncReadback needs of an event: torch.cuda.Event's record(stream), query() and synchronize()."""

    def record(self, stream: torch.cuda.Stream | None = None) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...


class AsyncReadback:
    """Two host float32 buffers of len(names) values each (pinned when `device` is CUDA), filled alternately.

    Args:
        names: the metric names, non-empty, unique, non-empty strings; publish's sources flatten into them in order.
        device: where the sources live (cpu or cuda). On CPU the buffers are plain host tensors, the copy is
            synchronous and a publication is ready at once (no event), unless `event_factory` is given.
        event_factory: makes one event per publication (called with no arguments); default torch.cuda.Event on CUDA,
            none on CPU. Tests pass a fake whose query() they control.
    Attributes: `dropped` (int) counts publications refused because the buffer they needed was still in flight.
    Raises ValueError for empty/duplicate/non-string names, or a device that is not cpu or an available cuda.
    """

    def __init__(
        self, names: Sequence[str], device: torch.device | str, event_factory: Callable[[], EventLike] | None = None
    ) -> None:
        names = tuple(names)
        if not names:
            raise ValueError("names must hold at least one metric name, got none")
        bad = [n for n in names if not isinstance(n, str) or not n]
        if bad:
            raise ValueError(f"names must be non-empty strings, got {bad!r}")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"names must be unique, got duplicates {dupes!r}")
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device {device} must be cpu or cuda")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {device} was asked for but CUDA is not available on this machine")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        self.names = names
        self.device = device
        self._cuda = device.type == "cuda"
        if event_factory is None and self._cuda:
            event_factory = torch.cuda.Event
        self.event_factory = event_factory
        self._buffers = [torch.zeros(len(names), dtype=torch.float32, pin_memory=self._cuda) for _ in range(2)]
        self._events: list[EventLike | None] = [None, None]  # None: the buffer's copy has completed (or none made)
        self._steps: list[int | None] = [None, None]  # step of the publication each buffer holds
        self._seqs = [0, 0]  # publication number each buffer holds (0: none)
        self._published = 0
        self._returned = 0  # publication number of the last Reading returned
        self._latest: Reading | None = None
        self.dropped = 0

    @property
    def latest(self) -> Reading | None:
        """The last Reading returned by poll (or wait), None before the first."""
        return self._latest

    def publish(self, sources: Sequence[torch.Tensor], step: int) -> bool:
        """Enqueue on the current stream of `device` a non_blocking copy of `sources` (float32 tensors on `device`,
        any shapes, flattened in order; total numel == len(names)) into the free host buffer and record an event
        after it. `step` (host int) is remembered with the buffer. Returns True when enqueued; False, counting
        `dropped`, when the buffer to write is still in flight (its event's query() is False): it is never
        overwritten. No host sync: no synchronize(), .item(), .cpu() or .tolist() on device tensors. The sources
        must be written on the current stream (or the caller orders their stream before it).
        Raises ValueError for a non-int step, non-tensor/non-float32/wrong-device sources or a wrong total numel
        (checked on every call from host-side metadata only)."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"step must be a host int, got {type(step).__name__} {step!r}")
        self._check(sources)
        newest = 0 if self._seqs[0] > self._seqs[1] else 1
        target = 1 - newest  # the buffer not holding the newest publication
        if not self._completed(target):
            self.dropped += 1
            return False
        buf, offset = self._buffers[target], 0
        with torch.no_grad():  # a source that requires grad links no graph
            for src in sources:
                n = src.numel()
                buf[offset : offset + n].view(src.shape).copy_(src, non_blocking=True)
                offset += n
        event = None
        if self.event_factory is not None:
            event = self.event_factory()
            event.record(torch.cuda.current_stream(self.device) if self._cuda else None)
        self._published += 1
        self._events[target], self._steps[target], self._seqs[target] = event, step, self._published
        return True

    def poll(self) -> Reading | None:
        """The newest completed publication not returned before, as a Reading of host floats, or None when none is
        new (also while the newest ones are in flight). Never blocks: completion is read with event.query().
        A publication older than one already returned is never returned."""
        for i in sorted((0, 1), key=lambda k: -self._seqs[k]):
            if self._seqs[i] > self._returned and self._completed(i):
                values = dict(zip(self.names, self._buffers[i].tolist()))  # host buffer: no device read-back
                self._returned = self._seqs[i]
                self._latest = Reading(self._steps[i], values)
                return self._latest
        return None

    def wait(self) -> Reading | None:
        """Block until every publication in flight has completed (event.synchronize()), then poll(). The one
        blocking call of this class: for the end of a run only, never in the hot loop."""
        for i in (0, 1):
            if self._events[i] is not None:
                self._events[i].synchronize()
                self._events[i] = None
        return self.poll()

    def _completed(self, i: int) -> bool:
        """Whether buffer i's copy has completed (no event, or event.query() is True; the event is then dropped)."""
        if self._events[i] is None:
            return True
        if self._events[i].query():
            self._events[i] = None
            return True
        return False

    def _check(self, sources: Sequence[torch.Tensor]) -> None:
        """ValueError unless sources are float32 tensors on self.device whose numels add up to len(names)."""
        if isinstance(sources, torch.Tensor) or not isinstance(sources, Sequence):
            raise ValueError(f"sources must be a sequence of tensors, got {type(sources).__name__}")
        total = 0
        for k, src in enumerate(sources):
            if not isinstance(src, torch.Tensor):
                raise ValueError(f"sources[{k}] must be a tensor, got {type(src).__name__}")
            if src.dtype != torch.float32:
                raise ValueError(f"sources[{k}] must be float32, got {src.dtype}")
            if src.device != self.device:
                raise ValueError(f"sources[{k}] must be on {self.device}, got {src.device}")
            total += src.numel()
        if total != len(self.names):
            raise ValueError(
                f"sources hold {total} values in all, but there are {len(self.names)} names {list(self.names)}"
            )
