"""Time of one interval per epoch on the device's timeline, without a host sync inside the epoch."""

from __future__ import annotations

import time

import torch


class EpochTimer:
    """`start()` at the epoch's start, `stop()` where its timed work ends, `elapsed_ms()` once the epoch's own
    readback is done. On CUDA two `torch.cuda.Event(enable_timing=True)` are recorded on the device's current
    stream (no sync at record time) and `elapsed_ms` reads their difference: the GPU timeline between the two
    records, idle gaps included. On any other device `time.perf_counter()` is read at start/stop (host time).

    Args:
        device: the torch.device (or its string) the epoch runs on.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.uses_cuda_events = self.device.type == "cuda"
        if self.uses_cuda_events:
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._end_event = torch.cuda.Event(enable_timing=True)
        self._started = self._stopped = False
        self._t0 = self._t1 = 0.0

    def start(self) -> None:
        """Mark the interval's start (records the start event / reads the host clock)."""
        if self.uses_cuda_events:
            self._start_event.record(torch.cuda.current_stream(self.device))
        else:
            self._t0 = time.perf_counter()
        self._started, self._stopped = True, False

    def stop(self) -> None:
        """Mark the interval's end (records the end event / reads the host clock). Raises RuntimeError before
        `start()`."""
        if not self._started:
            raise RuntimeError("EpochTimer.stop() before start()")
        if self.uses_cuda_events:
            self._end_event.record(torch.cuda.current_stream(self.device))
        else:
            self._t1 = time.perf_counter()
        self._stopped = True

    def elapsed_ms(self) -> float:
        """Milliseconds between start() and stop(). On CUDA this waits for the end event if the GPU has not reached
        it yet (call it after the epoch's readback, when it has). Raises RuntimeError unless start() and stop()
        were both called."""
        if not self._stopped:
            raise RuntimeError("EpochTimer.elapsed_ms() needs start() and then stop()")
        if self.uses_cuda_events:
            if not self._end_event.query():
                self._end_event.synchronize()
            return float(self._start_event.elapsed_time(self._end_event))
        return (self._t1 - self._t0) * 1e3
