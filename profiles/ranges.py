"""Named ranges for the trainer's phases: one helper, `phase_range`, that opens an NVTX range and a torch.profiler
`record_function` of the same name, so Nsight Systems and Kineto traces show the same ranges.

Where ranges belong: around host-side launches (an epoch, a learner step, a CUDA graph replay, an eager phase's
launches), never inside a Triton/CUDA kernel and never inside a region being captured into a CUDA graph. A range
pushed during capture is recorded once on the host and is not part of the graph, so replays carry no range
(docs/h200_facts.md, "What torch.profiler (Kineto) traces show"); wrap `graph.replay()` in one range named after
the phase(s) it runs instead. NVTX source: the `nvtx` package (https://nvidia.github.io/NVTX/python/), domain DOMAIN.

Run `python -m hotloop.profiles.ranges` to print the cost of one range on this machine (`range_cost_ns`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable

import torch
from torch._C._autograd import _profiler_enabled

DOMAIN = "hotloop"
PHASE_COLORS = {  # ARGB, one fixed color per phase
    "epoch": 0xFF4E79A7,
    "step": 0xFFF28E2B,
    "sample": 0xFF76B7B2,
    "forward": 0xFF59A14F,
    "ddqn_forward": 0xFF8CD17D,
    "loss": 0xFFEDC948,
    "backward": 0xFFE15759,
    "optimizer": 0xFFB07AA1,
    "spectral_norm": 0xFFFF9DA7,
    "priority_update": 0xFF9C755F,
    "env_step": 0xFF499894,
    "readback": 0xFFD37295,
    "evaluate": 0xFF86BCB6,
}
DEFAULT_COLOR = 0xFFBAB0AC
"""Color of a range whose name is not in PHASE_COLORS and that was given no color."""


@functools.cache
def nvtx_backend() -> tuple[str, Callable[[str, int | str], None], Callable[[], None]]:
    """(backend name, push(name, color), pop()) of the NVTX emitter used by `phase_range`, chosen once:
    "nvtx" (the `nvtx` package, domain DOMAIN, with colors), else "torch.cuda.nvtx" (a CUDA or ROCm torch build;
    no colors, default domain), else "none" (no-ops: a CPU-only torch without the `nvtx` package)."""
    try:
        import nvtx
    except ImportError:
        nvtx = None
    if nvtx is not None:
        domain = nvtx.get_domain(DOMAIN)
        attributes: dict[tuple[str, int | str], object] = {}

        def push(name: str, color: int | str) -> None:
            key = (name, color)
            if key not in attributes:
                attributes[key] = domain.get_event_attributes(message=name, color=color)
            domain.push_range(attributes[key])

        return "nvtx", push, domain.pop_range
    if torch.version.cuda or torch.version.hip:
        return "torch.cuda.nvtx", lambda name, color: torch.cuda.nvtx.range_push(name), torch.cuda.nvtx.range_pop
    return "none", lambda name, color: None, lambda: None


class phase_range(contextlib.ContextDecorator):
    """`with phase_range("sample"): ...` or `@phase_range("step")`: an NVTX range (see `nvtx_backend`) and, while
    a torch profiler is recording, a `torch.profiler.record_function` of the same name (a `user_annotation`
    event in the Kineto trace, plus a `gpu_user_annotation` span over the GPU work it launched eagerly).

    Args:
        name: the range's name; the phases of PHASE_COLORS have fixed colors.
        color: ARGB int or a color name the `nvtx` package knows; default PHASE_COLORS[name], else DEFAULT_COLOR.
    The record_function is skipped when no profiler is recording (it costs microseconds per range even then).
    Ranges nest; an exception inside closes the range and propagates. Ranges are per thread (NVTX push/pop).
    """

    def __init__(self, name: str, color: int | str | None = None) -> None:
        self.name = name
        self.color = PHASE_COLORS.get(name, DEFAULT_COLOR) if color is None else color
        self._open: list[torch.profiler.record_function | None] = []

    def _recreate_cm(self) -> phase_range:
        return phase_range(self.name, self.color)

    def __enter__(self) -> phase_range:
        _, push, pop = nvtx_backend()
        push(self.name, self.color)
        record = torch.profiler.record_function(self.name) if _profiler_enabled() else None
        if record is not None:
            try:
                record.__enter__()
            except BaseException:
                pop()
                raise
        self._open.append(record)
        return self

    def __exit__(self, *exc: object) -> bool:
        record = self._open.pop()
        try:
            if record is not None:
                record.__exit__(*exc)
        finally:
            nvtx_backend()[2]()
        return False


def range_cost_ns(n: int = 100_000, name: str = "step", repeats: int = 5) -> float:
    """Median over `repeats` batches of the cost, in ns, of one `with phase_range(name): pass` (construct, enter,
    exit) on this machine with no profiler attached, less an empty loop's cost per iteration.

    Under Nsight Systems (NVTX injected) a range costs more; multiply by ranges per step and divide by the step
    time for the % of a hot-loop step. Raises ValueError if n or repeats < 1.
    """
    if n < 1 or repeats < 1:
        raise ValueError(f"range_cost_ns: n and repeats must be >= 1, got n={n}, repeats={repeats}")
    costs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            pass
        t1 = time.perf_counter_ns()
        for _ in range(n):
            with phase_range(name):
                pass
        t2 = time.perf_counter_ns()
        costs.append(((t2 - t1) - (t1 - t0)) / n)
    return sorted(costs)[len(costs) // 2]


if __name__ == "__main__":
    print(
        f"phase_range: {range_cost_ns():.0f} ns per range (enter+exit), NVTX backend {nvtx_backend()[0]!r}, "
        f"no profiler recording"
    )
