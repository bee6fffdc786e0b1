"""Structural work of the training loop over a run's steady epochs, outside the guarded window:
`LoopStructureCensus`.

The guarded window (hotloop.guards.guard) judges D2D copies, memsets / fill kernels and grid (1,1,1) launches per
iteration over K consecutive loop iterations only; a `clone()` of the flat parameters every 200 iterations, an extra
fill every 300 or a one-block kernel every 250 may never fall inside it. This census watches the same span as the
sync census (hotloop.guards.loop_syncs): the loop body (`Trainer.iterate`) of every epoch after the first, from the
epoch's start to its "readback" phase, and counts, per loop iteration and phase, what would launch them:

- every ATen op called on a CUDA tensor (a `TorchDispatchMode`, so `torch.zeros`, `x.clone()`, `t[...] = 0`,
  `.to()`, `copy_` are seen as the op they reach: aten.zeros, aten.clone, aten.fill_, aten._to_copy, aten.copy_),
  classed by `classify_op`: a copy between two CUDA tensors of one device with the same dtype and a dense layout
  is a D2D memcpy (what the window's trace counts as "Memcpy DtoD"); an op whose kernel is a FillFunctor (fill_,
  zero_, zeros, ones, full, *_like, new_*, masked_fill, index_fill, scalar_tensor) is a memset / fill; an op that
  launches a kernel and whose every CUDA operand and output holds at most ONE_BLOCK_ELEMENTS elements is a grid
  (1,1,1) launch (estimated: torch's elementwise kernels give a block 128 threads x at least 4 elements);
- every Triton launch (`JITFunction.run`, and the interpreter's `InterpretedFunction.run`), with its grid: a grid
  whose product is 1 is a grid (1,1,1) launch (exact);
- the phase ranges (hotloop.profiles.ranges.phase_range; one wrapper on enter, the open ones read at an event):
  the step range numbers the iterations, the innermost other range is the phase.

Not seen (the window's trace sees them in its K iterations only): the kernels of a CUDA graph replay (no launch
from Python: the window holds the loop's graphs every iteration), memsets and copies an op makes inside its own
implementation (a cub sort's scratch memset, cuBLAS workspaces), kernels launched from C++ extensions that bypass
the dispatcher, the exact grid of an ATen kernel (a reduction of more than ONE_BLOCK_ELEMENTS inputs that still
runs in one block is missed), ops of other threads than the census's (autograd's backward threads are seen:
torch carries the mode to them), and work before the first iteration of an epoch (reported, not judged: below).

`new_work` decides what the window never held (rules, no tuned numbers): an event counts for a criterion of the
window (hotloop.guards.criteria.CRITERIA: "no D2D weight sync", "memsets only where needed" over the learner's
phases and the loop code of a step in no phase; "no single-block kernels" over every phase and outside steps, as
the window judges them); the events of one (criterion, phase, call site, op) form a stream; the stream is held by
the window when every K consecutive iterations hold it (no stretch of K iterations without it, from its first
occurrence to the end of the span: the window's K iterations see it at the same rate and judge it), or when it
occurs at the same iterations of every watched epoch, all among the first K (Trainer.iterate's own start: the
window is one Trainer.iterate(K) call, which runs them too; a first-iteration effect, or per-epoch work at the
epoch's start). Work before an epoch's first iteration runs once per epoch, outside the iterations (the iterate
call's setup, which the window's call also runs, or run_epoch's own): reported, not judged. A stream held by
neither rule is new: it FAILs its criterion, named with its period in iterations (the most common gap between
occurrences), call site, op and phase. A site whose count per iteration rises above what the window held (2 copies
every 300 iterations where every iteration has 1) is a stream of its own (`level`).

The census costs nothing on a machine without CUDA (there is no device work to count: `begin` does nothing); on
CUDA it costs a Python call per phase range and per ATen op of the loop (the hotloop learner's loop runs CUDA
graphs: a handful of ops per `log_interval` iterations) and per Triton launch; `cost` estimates it, and `hotloop
gate --census-overhead` measures it A/B on the device (hotloop.guards.gate.census_overhead).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hotloop.guards.criteria import CRITERIA, Criterion
from hotloop.profiles.ranges import phase_range

D2D, MEMSET, GRID1 = "D2D copy", "memset/fill", "grid (1,1,1)"
"""The kinds of structural work the census counts."""
KIND_COLUMNS = {D2D: "learner_d2d_copies", MEMSET: "learner_memsets", GRID1: "kernels_grid1"}
"""Kind -> the per-step column of the window's criterion it counts for (the row is found by it in CRITERIA)."""
LEARNER_KINDS = (D2D, MEMSET)
"""Kinds judged, as the window judges them, over the learner's phases and the loop code of a step in no phase range;
the others over every phase and outside steps."""
ONE_BLOCK_ELEMENTS = 512
"""An ATen op on CUDA whose every operand and output holds at most this many elements is counted as a grid (1,1,1)
launch: torch's elementwise kernels run 128 threads per block, each on at least 4 elements
(aten/src/ATen/native/cuda/thread_constants.h, CUDALoops.cuh: block_work_size = num_threads * thread_work_size),
and a reduction of at most 512 inputs fits one block."""
OUTSIDE = "(outside steps)"
NO_PHASE = "(no phase)"
BEFORE_FIRST = -1
RECENT_RANGES = 256
"""Phase ranges remembered (the last entered): an event's phases are those of them still open. A step of the
reference learner enters about 8; an open range entered more than this many ranges ago is not seen."""
"""The iteration number of an event before the epoch's first step range."""
EVENT_COLUMNS = ["epoch", "iteration", "in_step", "path", "kind", "what", "site"]
STREAM_COLUMNS = [
    "criterion",
    "kind",
    "phase",
    "site",
    "what",
    "level",
    "occurrences",
    "epochs",
    "first",
    "period",
    "gaps",
    "judged",
    "held",
    "new",
    "why",
]
_ROOT = str(Path(__file__).resolve().parents[1]) + "/"
_SKIP_DIRS = tuple(str(Path(m.__file__).parent) + "/" for m in (torch,)) + (str(Path(__file__).parent) + "/",)


def census_criteria(criteria: Sequence[Criterion] = CRITERIA) -> dict[str, Criterion]:
    """Kind -> the criterion of `criteria` whose column is KIND_COLUMNS[kind] (KeyError naming a missing one)."""
    by_column = {c.column: c for c in criteria if c.column}
    missing = [col for col in KIND_COLUMNS.values() if col not in by_column]
    if missing:
        raise KeyError(f"no criterion judges the column(s) {missing}")
    return {kind: by_column[col] for kind, col in KIND_COLUMNS.items()}


# --- classifying an ATen op ------------------------------------------------------------------------------------------

_NO_KERNEL = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "detach",
        "detach_",
        "alias",
        "lift",
        "lift_fresh",
        "_local_scalar_dense",
        "set_",
        "resize_",
        "resize_as_",
        "record_stream",
        "is_nonzero",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "size",
        "stride",
        "numel",
        "dim",
        "is_contiguous",
        "is_pinned",
        "_unsafe_view",
        "_reshape_alias",
        "as_strided",
        "_make_dep_token",
        "_pin_memory",
        "_nested_tensor_size",
    }
)
"""ATen ops that launch no kernel (besides views: OpOverload.is_view). `_local_scalar_dense` (.item()) is a copy to
the host and a sync: the sync census's."""
_COPIES = {
    "copy_": (1, 0),
    "_copy_from": (0, 1),
    "clone": (0, None),
    "_to_copy": (0, None),
    "lift_fresh_copy": (0, None),
    "copy": (1, None),
}
"""Copy ops -> (source argument, destination argument; None: the output)."""
_FILLS = frozenset(
    {
        "fill",
        "fill_",
        "zero_",
        "zero",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "scalar_tensor",
        "masked_fill",
        "masked_fill_",
        "index_fill",
        "index_fill_",
    }
)
"""Ops whose kernel is a fill (FillFunctor, masked_fill / index_fill kernels: names the window counts as *fill*)."""
_NONE, _COPY, _FILL, _OTHER = 0, 1, 2, 3
_CATEGORY: dict[object, int] = {}


def _category(func) -> int:
    cat = _CATEGORY.get(func)
    if cat is None:
        name = _op_name(func)
        if getattr(func, "is_view", False) or name in _NO_KERNEL:
            cat = _NONE
        elif name in _COPIES:
            cat = _COPY
        elif name in _FILLS:
            cat = _FILL
        else:
            cat = _OTHER
        _CATEGORY[func] = cat
    return cat


def _op_name(func) -> str:
    """ "clone" for aten.clone.default (the overload packet's name without its namespace)."""
    name = getattr(func, "_opname", None)
    return name if isinstance(name, str) else str(func).split(".")[-2 if str(func).count(".") >= 2 else -1]


def _tensors(values: Iterable) -> Iterable[torch.Tensor]:
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


def _memcpy_eligible(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether copying `src` into `dst` (same device) is one cudaMemcpyAsync, as ATen's copy_ decides it
    (aten/src/ATen/native/cuda/Copy.cu, copy_device_to_device: same dtype, conj and neg bits, and operands whose
    elements are dense in one common order)."""
    if src.dtype != dst.dtype or src.numel() != dst.numel() or src.shape != dst.shape:
        return False
    if src.is_conj() != dst.is_conj() or src.is_neg() != dst.is_neg():
        return False
    if src.is_contiguous() and dst.is_contiguous():
        return True
    if src.stride() != dst.stride():
        return False
    from torch._prims_common import is_non_overlapping_and_dense

    return is_non_overlapping_and_dense(src)


def classify_op(func, args: tuple, kwargs: Mapping, out: object, device_type: str = "cuda") -> list[tuple[str, str]]:
    """The structural work an ATen op (`func`, an OpOverload, called with `args`/`kwargs`, returning `out`) launched
    on tensors of `device_type`, as [(kind, what)]: kind D2D (a copy between two tensors of one device that is a
    memcpy: `_memcpy_eligible`), MEMSET (a fill op: _FILLS) and/or GRID1 (a kernel whose every operand and output
    on the device holds at most ONE_BLOCK_ELEMENTS elements, > 0: one block, estimated); what = "aten.<op>" with
    the bytes or elements. [] for an op that launches no kernel (views, allocations, copies to or from the host) or
    touches no tensor of `device_type`. Reads tensor metadata only (no device read)."""
    cat = _category(func)
    if cat == _NONE:
        return []
    name = _op_name(func)
    if cat == _COPY:
        src_at, dst_at = _COPIES[name]
        src = args[src_at] if len(args) > src_at else None
        dst = out if dst_at is None else (args[dst_at] if len(args) > dst_at else None)
        if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)):
            return []
        if src.device.type != device_type or dst.device != src.device or dst.numel() == 0:
            return []  # to or from the host (a memcpy, not a kernel), another device, or nothing copied
        if _memcpy_eligible(src, dst):
            return [(D2D, f"aten.{name} ({dst.numel() * dst.element_size()} bytes)")]
        n = dst.numel()
        return [(GRID1, f"aten.{name} (copy kernel, {n} elements)")] if n <= ONE_BLOCK_ELEMENTS else []
    on_device = [
        t
        for t in (
            *_tensors(args),
            *_tensors(kwargs.values()),
            *_tensors(out if isinstance(out, (list, tuple)) else (out,)),
        )
        if t.device.type == device_type
    ]
    if not on_device:
        return []
    largest = max(t.numel() for t in on_device)
    if largest == 0:
        return []
    found = []
    if cat == _FILL:
        found.append((MEMSET, f"aten.{name} ({largest} elements)"))
    if largest <= ONE_BLOCK_ELEMENTS:
        found.append((GRID1, f"aten.{name} ({largest} elements: one block)"))
    return found


def classify_triton(name: str, grid: Sequence[int]) -> list[tuple[str, str]]:
    """[(GRID1, "<name> (Triton, grid (1, 1, 1))")] when the launch grid's product is 1, else []."""
    dims = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    return [(GRID1, f"{name} (Triton, grid {dims})")] if dims[0] * dims[1] * dims[2] == 1 else []


def _site() -> str:
    """ "file:line in function" of the innermost frame outside torch, triton and hotloop.guards (paths relative to the
    checkout for its own files)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIP_DIRS) and "/triton/" not in name:
            return f"{name.removeprefix(_ROOT)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"


# --- the hooks ------------------------------------------------------------------------------------------------------


class _Mode(TorchDispatchMode):
    """Counts every ATen op while active and records the structural ones (classify_op)."""

    def __init__(self, census: LoopStructureCensus) -> None:
        super().__init__()
        self.census = census

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch._dynamo.disable wrapper around __torch_dispatch__ (torch >= 2.12 adds one by default): its first
        call imports torch._dynamo (seconds, inside the first watched epoch) and every call pays an eval-frame
        switch; nothing here is compiled."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        census = self.census
        census.ops += 1
        if _CATEGORY.get(func, -1) != _NONE:
            found = classify_op(func, args, kwargs, out, census.device_type)
            if found:
                census._record(found)
        return out


def _triton_classes() -> list[type]:
    """The Triton classes whose `run(self, *args, grid, warmup, **kwargs)` launches a kernel (compiled and
    interpreted); [] without Triton."""
    classes = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except ImportError:
        return classes
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    return classes


def _launch_grid(fn, grid, args: tuple, kwargs: Mapping) -> tuple[int, ...] | None:
    """The grid a Triton launch runs (a callable grid is given the launch's named arguments); None when unknown."""
    if callable(grid):
        try:
            import inspect

            target = getattr(fn, "fn", fn)
            bound = inspect.signature(target).bind_partial(
                *args, **{k: v for k, v in kwargs.items() if k in inspect.signature(target).parameters}
            )
            bound.apply_defaults()
            grid = grid({**bound.arguments, **kwargs})
        except Exception:  # a grid function that needs what the autotuner adds: unknown, never a crash
            return None
    try:
        return tuple(int(g) for g in grid)
    except (TypeError, ValueError):
        return None


def _triton_name(fn) -> str:
    target = getattr(fn, "fn", fn)
    return getattr(target, "__name__", type(fn).__name__)


class _Hooks:
    """The census's hooks while an epoch is open: the dispatch mode, the Triton launch wrappers and the phase-range
    wrappers (installed on the classes, removed in `close`)."""

    def __init__(self, census: LoopStructureCensus) -> None:
        self.census = census
        self.mode = _Mode(census)
        self.saved: list[tuple[type, str, object]] = []

    def open(self) -> None:
        census = self.census
        enter, step, recent, count = phase_range.__enter__, census.step_range, census._recent, census._count

        def ranged_enter(rng):  # one wrapper, on enter only: the open ranges are read when an event needs them
            count[0] += 1
            if rng.name == step:
                count[1] += 1
            recent.append(rng)
            return enter(rng)

        self._patch(phase_range, "__enter__", ranged_enter)
        for cls in _triton_classes():
            run = cls.run

            def counted_run(fn, *args, grid, warmup, _run=run, **kwargs):
                if not warmup:
                    census._launch(fn, grid, args, kwargs)
                return _run(fn, *args, grid=grid, warmup=warmup, **kwargs)

            self._patch(cls, "run", counted_run)
        try:
            self.mode.__enter__()
        except BaseException:
            self.close(mode=False)
            raise

    def _patch(self, cls: type, name: str, value: object) -> None:
        self.saved.append((cls, name, cls.__dict__[name]))
        setattr(cls, name, value)

    def close(self, mode: bool = True) -> None:
        try:
            if mode:
                self.mode.__exit__(None, None, None)
        finally:
            for cls, name, value in reversed(self.saved):
                setattr(cls, name, value)
            self.saved.clear()


# --- the census -----------------------------------------------------------------------------------------------------


@dataclass
class LoopStructureCensus:
    """Counts the training loop's D2D copies, memsets / fills and grid (1,1,1) launches per iteration and phase over
    every epoch after the first it is given (module docstring).

    Drive it as hotloop.guards.loop_syncs.LoopSyncCensus: `begin(epoch)` right before an epoch's loop, `end()` when
    the loop has queued its last launch (the "readback" phase; idempotent). `cuda` (default:
    torch.cuda.is_available()): whether there is device work to count; without it `begin` does nothing.
    `device_type`: the tensors counted ("cuda"; tests count "cpu" ones). `step_range`: the name of the range
    around each loop iteration (hotloop.trainer.loop.STEP_RANGE). After the run: `epochs` (watched), `skipped` (the
    first epoch's number), `iterations` {epoch: step ranges entered}, `frame()` (one row per event, EVENT_COLUMNS),
    `new_work(window_steps, learner)` (the streams, `new_work`), `judge(...)` (per criterion), `cost()`.
    Raises RuntimeError from `begin` while an epoch is open.
    """

    cuda: bool = field(default_factory=torch.cuda.is_available)
    device_type: str = "cuda"
    step_range: str = "step"
    epochs: list[int] = field(default_factory=list)
    skipped: int | None = None
    iterations: dict[int, int] = field(default_factory=dict)
    events: list[tuple] = field(default_factory=list)
    ops: int = 0
    launches: int = 0
    ranges: int = 0
    span_s: float = 0.0
    record_s: float = 0.0
    _hooks: _Hooks | None = None
    _recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_RANGES))
    _count: list[int] = field(default_factory=lambda: [0, 0])  # ranges entered, step ranges entered (this epoch)
    _epoch: int = 0
    _started: float = 0.0

    def begin(self, epoch: int) -> None:
        if self._hooks is not None:
            raise RuntimeError("LoopStructureCensus.begin: an epoch is already open (call end() first)")
        if not self.cuda:
            return
        if self.skipped is None:  # the run's first epoch compiles and captures
            self.skipped = epoch
            return
        self._epoch, self._count[:] = epoch, [0, 0]
        self._recent.clear()
        self.iterations[epoch] = 0
        self.epochs.append(epoch)
        hooks = _Hooks(self)
        hooks.open()
        self._hooks = hooks
        self._started = time.perf_counter()

    def end(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is None:
            return
        self.span_s += time.perf_counter() - self._started
        hooks.close()
        self.ranges += self._count[0]
        self.iterations[self._epoch] = self._count[1]
        self._recent.clear()

    # called by the hooks
    def _open_ranges(self) -> list[str]:
        """The names of the phase ranges open now, outermost first: the recently entered ones (RECENT_RANGES) whose
        record of open entries (phase_range._open) is not empty."""
        seen: dict[int, str] = {}
        for rng in self._recent:
            if getattr(rng, "_open", None):
                seen.pop(id(rng), None)
                seen[id(rng)] = rng.name
        return list(seen.values())

    def _launch(self, fn, grid, args: tuple, kwargs: Mapping) -> None:
        self.launches += 1
        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
        if first is None or first.device.type != self.device_type:
            return
        dims = _launch_grid(fn, grid, args, kwargs)
        if dims is not None and (found := classify_triton(_triton_name(fn), dims)):
            self._record(found)

    def _record(self, found: list[tuple[str, str]]) -> None:
        start = time.perf_counter()
        if self.device_type == "cuda" and torch.cuda.is_current_stream_capturing():
            return  # captured into a graph: launched by its replays, whose kernels the window holds
        stack = self._open_ranges()
        in_step = self.step_range in stack
        iteration = self._count[1] - 1 if self._count[1] else BEFORE_FIRST
        path = tuple(n for n in stack if n != self.step_range and "#" not in n)
        site = _site()
        for kind, what in found:
            self.events.append((self._epoch, iteration, in_step, path, kind, what, site))
        self.record_s += time.perf_counter() - start

    # results
    def frame(self) -> pd.DataFrame:
        """One row per event: EVENT_COLUMNS (epoch, iteration in the epoch (BEFORE_FIRST before its first step),
        in_step, path (the enclosing phase ranges, outermost first, the step range left out), kind, what, site)."""
        return pd.DataFrame(self.events, columns=EVENT_COLUMNS)

    def new_work(self, window_steps: int, learner: Sequence[str] | None) -> pd.DataFrame:
        """`new_work` over this census's events and iterations."""
        return new_work(self.frame(), self.iterations, window_steps, learner)

    def span_text(self) -> str:
        """ "epochs 2-3" / "epoch 2"."""
        if not self.epochs:
            return "no epoch"
        many = len(self.epochs) > 1
        return f"epoch{'s' * many} {self.epochs[0]}" + (f"-{self.epochs[-1]}" if many else "")

    def judge(
        self, window_steps: int, learner: Sequence[str] | None, criteria: Sequence[Criterion] = CRITERIA
    ) -> dict[str, tuple[int | None, str]]:
        """Criterion id -> (added, text) for each census criterion (`census_criteria`): added = the most new
        work (streams the window never held, `new_work`) one iteration holds, text = those streams ("<what> at
        <site> in <phase>: every N iterations (xM in epochs 2-3, first at epoch 2 iteration 199)"; "; "-joined) or
        "none new in the loop of epochs 2-3 (N iterations)". (None, "not applicable (no CUDA)") without CUDA;
        (None, "not measured (...)") when no epoch was watched."""
        rows = census_criteria(criteria)
        if not self.cuda:
            return {c.id: (None, "not applicable (no CUDA)") for c in rows.values()}
        if not self.epochs:
            why = "not measured (no epoch after the first: the first compiles and captures; run --epochs 2 or more)"
            return {c.id: (None, why) for c in rows.values()}
        streams = self.new_work(window_steps, learner)
        total = sum(self.iterations.values())
        out = {}
        for kind, c in rows.items():
            mine = streams[streams["criterion"].eq(c.id) & streams["new"]]
            if mine.empty:
                out[c.id] = (0, f"none new in the loop of {self.span_text()} ({total} iterations)")
                continue
            added = _worst_iteration(self.frame(), mine, self.iterations)
            out[c.id] = (added, "; ".join(_describe(r) for r in mine.itertuples()))
        return out

    def cost(self, calibrate: bool = True) -> dict[str, float | int]:
        """What the census cost: {"span_s" (the watched loops' wall time), "ops" (ATen ops seen), "launches"
        (Triton launches), "ranges" (phase ranges entered), "events", "record_s" (measured: recording events), and
        with `calibrate` "range_ns", "op_ns" (this machine's extra cost of one wrapped range and of one op under the
        dispatch mode: `calibrate_costs`), "estimated_s" (ranges x range_ns + (ops + launches) x op_ns + record_s)
        and "estimated_ratio" (of span_s)}. The device's own view is `hotloop gate --census-overhead`."""
        out: dict[str, float | int] = {
            "span_s": round(self.span_s, 4),
            "ops": self.ops,
            "launches": self.launches,
            "ranges": self.ranges,
            "events": len(self.events),
            "record_s": round(self.record_s, 6),
        }
        if calibrate:
            range_ns, op_ns = calibrate_costs()
            est = (self.ranges * range_ns + (self.ops + self.launches) * op_ns) * 1e-9 + self.record_s
            out |= {
                "range_ns": round(range_ns, 1),
                "op_ns": round(op_ns, 1),
                "estimated_s": round(est, 6),
                "estimated_ratio": round(est / self.span_s, 6) if self.span_s > 0 else float("nan"),
            }
        return out


def calibrate_costs(n: int = 2000, repeats: int = 5) -> tuple[float, float]:
    """(range_ns, op_ns): the extra ns of one `phase_range` enter + exit while the census's wrappers are installed,
    and of one small ATen op (an add_ on a CPU tensor the census does not count) under its dispatch mode, on this
    machine: medians over `repeats` batches of `n`. Runs outside any census epoch."""
    probe = LoopStructureCensus(cuda=True, device_type="meta")
    t = torch.zeros(1)

    def ranges() -> float:
        start = time.perf_counter_ns()
        for _ in range(n):
            with phase_range("calibrate"):
                pass
        return (time.perf_counter_ns() - start) / n

    def ops() -> float:
        start = time.perf_counter_ns()
        for _ in range(n):
            t.add_(1)
        return (time.perf_counter_ns() - start) / n

    plain_r, plain_o, hooked_r, hooked_o = [], [], [], []
    for _ in range(repeats):
        plain_r.append(ranges())
        plain_o.append(ops())
        hooks = _Hooks(probe)
        hooks.open()
        try:
            hooked_r.append(ranges())
            hooked_o.append(ops())
        finally:
            hooks.close()
    return (
        max(0.0, statistics.median(hooked_r) - statistics.median(plain_r)),
        max(0.0, statistics.median(hooked_o) - statistics.median(plain_o)),
    )


# --- what the window never held -------------------------------------------------------------------------------------


def new_work(
    events: pd.DataFrame,
    iterations: Mapping[int, int],
    window_steps: int,
    learner: Sequence[str] | None,
    criteria: Sequence[Criterion] = CRITERIA,
) -> pd.DataFrame:
    """The streams of structural work in `events` (EVENT_COLUMNS, as `LoopStructureCensus.frame`) over the watched
    epochs' `iterations` ({epoch: loop iterations}), judged against a window of `window_steps` (K) consecutive
    iterations (module docstring: the rules). `learner`: the learner's phases (hotloop.trainer.loop.learner_phases;
    None: every event of a step counts as the learner's).

    One row per (criterion, phase, site, what, level), STREAM_COLUMNS: criterion (the id of the window's row it
    counts for), kind, phase (the innermost phase; NO_PHASE in a step in no phase range; OUTSIDE between steps),
    level (the stream counts the iterations holding at least `level` of these events), occurrences, epochs (its
    count per epoch, "2:5 3:5"), first ("epoch E iteration I"), period (the most common gap between occurrences, in
    iterations; the smallest of the most common; <NA> for one occurrence), gaps ("200" or "200-400"), judged (False:
    the window's row does not judge this phase, or the event ran before the epoch's first iteration), held (the
    window held it: a rule of the module docstring), new (judged and not held), why. Raises ValueError for
    window_steps < 1."""
    if window_steps < 1:
        raise ValueError(f"window_steps must be >= 1, got {window_steps}")
    rows_of = census_criteria(criteria)
    if events.empty:
        return pd.DataFrame(columns=STREAM_COLUMNS)
    epochs = sorted(iterations)
    offset, total = {}, 0
    for e in epochs:
        offset[e] = total
        total += int(iterations[e])
    wanted = set(learner) if learner is not None else None
    groups: dict[tuple, Counter] = defaultdict(Counter)
    unjudged: dict[tuple, Counter] = defaultdict(Counter)
    reasons: dict[tuple, str] = {}
    for ev in events.itertuples(index=False):
        path = tuple(ev.path)
        phase = path[-1] if path and ev.in_step else (OUTSIDE if not ev.in_step else NO_PHASE)
        crit = rows_of[ev.kind].id
        key = (crit, ev.kind, phase, ev.site, ev.what)
        if ev.iteration < 0:
            reasons[key] = (
                "before the epoch's first iteration: per-epoch setup outside the iterations (the "
                "iterate call's own, which the window's call also runs, or run_epoch's)"
            )
            unjudged[key][(ev.epoch, ev.iteration)] += 1
            continue
        if ev.kind in LEARNER_KINDS:
            in_scope = ev.in_step and (not path or wanted is None or bool(wanted.intersection(path)))
            if not in_scope:
                reasons[key] = (
                    f"{'outside steps' if not ev.in_step else 'phase ' + phase}: not the learner's "
                    f"(the window judges {crit!r} over the learner's phases and a step's unphased code)"
                )
                unjudged[key][(ev.epoch, ev.iteration)] += 1
                continue
        groups[key][(ev.epoch, ev.iteration)] += 1
    out = []
    for key, counts in unjudged.items():
        out.append(
            _stream_row(key, 1, sorted(counts), counts, offset, iterations, judged=False, held=False, why=reasons[key])
        )
    for key, counts in groups.items():
        for level in range(1, max(counts.values()) + 1):
            at = sorted(k for k, n in counts.items() if n >= level)
            held, why = _held([offset[e] + i for e, i in at], at, total, iterations, window_steps)
            out.append(_stream_row(key, level, at, counts, offset, iterations, judged=True, held=held, why=why))
    table = pd.DataFrame(out, columns=STREAM_COLUMNS)
    return table.sort_values(
        ["new", "criterion", "phase", "site"], ascending=[False, True, True, True], ignore_index=True
    )


def _held(
    where: list[int], at: list[tuple[int, int]], total: int, iterations: Mapping[int, int], k: int
) -> tuple[bool, str]:
    """Whether a window of k iterations holds the stream occurring at global iterations `where` (sorted; `at` the
    same as (epoch, iteration)), and why."""
    if len(where) >= 2:
        stretches = [b - a - 1 for a, b in zip(where, where[1:])] + [total - 1 - where[-1]]
        if max(stretches) <= k - 1:
            return True, (
                f"every {k} consecutive iterations hold it (longest stretch without: {max(stretches)}): "
                f"the window sees it at this rate"
            )
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for e, i in at:
        per_epoch[e].append(i)
    sets = [tuple(per_epoch.get(e, ())) for e in sorted(iterations)]
    if sets and sets[0] and all(s == sets[0] for s in sets) and max(sets[0]) < k:
        return True, (
            f"at iteration{'s' * (len(sets[0]) > 1)} {', '.join(map(str, sets[0]))} of every epoch, within "
            f"the first {k}: Trainer.iterate's own start, which the window's iterate({k}) call runs too"
        )
    return False, f"a window of {k} consecutive iterations can miss it"


def _stream_row(
    key: tuple,
    level: int,
    at: list[tuple[int, int]],
    counts: Counter,
    offset: Mapping[int, int],
    iterations: Mapping[int, int],
    *,
    judged: bool,
    held: bool,
    why: str,
) -> dict:
    crit, kind, phase, site, what = key
    where = [offset.get(e, 0) + max(i, 0) for e, i in at]
    gaps = [b - a for a, b in zip(where, where[1:])]
    period = min(g for g, n in Counter(gaps).items() if n == max(Counter(gaps).values())) if gaps else pd.NA
    per_epoch = Counter(e for e, _ in at)
    first_e, first_i = at[0]
    return dict(
        criterion=crit,
        kind=kind,
        phase=phase,
        site=site,
        what=what,
        level=level,
        occurrences=len(at),
        epochs=" ".join(f"{e}:{per_epoch[e]}" for e in sorted(per_epoch)),
        first=(
            f"epoch {first_e} before its first iteration" if first_i < 0 else f"epoch {first_e} iteration {first_i}"
        ),
        period=period,
        gaps=(f"{min(gaps)}" if gaps and min(gaps) == max(gaps) else f"{min(gaps)}-{max(gaps)}" if gaps else ""),
        judged=judged,
        held=held,
        new=judged and not held,
        why=why,
    )


def _worst_iteration(events: pd.DataFrame, streams: pd.DataFrame, iterations: Mapping[int, int]) -> int:
    """The most events of the new `streams` (rows of `new_work`) that one iteration holds: per iteration, each new
    (stream, level) that occurs there adds one."""
    per_iteration: Counter = Counter()
    for s in streams.itertuples():
        mine = events[
            events["kind"].eq(s.kind)
            & events["site"].eq(s.site)
            & events["what"].eq(s.what)
            & events["iteration"].ge(0)
        ]
        counts = Counter(zip(mine["epoch"], mine["iteration"], mine["path"].map(tuple), mine["in_step"]))
        for (e, i, path, in_step), n in counts.items():
            phase = path[-1] if path and in_step else (OUTSIDE if not in_step else NO_PHASE)
            if phase == s.phase and n >= s.level:
                per_iteration[(e, i)] += 1
    return max(per_iteration.values(), default=0)


def _describe(row) -> str:
    """ "<what> at <site> in <phase>: every N iterations (xM in epochs: 2:5 3:5; first at epoch 2 iteration 199)"."""
    level = f" (x{row.level} in one iteration)" if row.level > 1 else ""
    every = (
        f"every {row.period} iterations" + (f" (gaps {row.gaps})" if "-" in str(row.gaps) else "")
        if not pd.isna(row.period)
        else "once"
    )
    return (
        f"{row.what}{level} at {row.site} in {row.phase}: {every} (x{row.occurrences}, per epoch {row.epochs}; "
        f"first at {row.first})"
    )


class CensusGroup:
    """Several censuses driven as one (hotloop.guards.run.run_training takes one `loop_census`): `begin(epoch)`
    begins each in order, `end()` ends each in reverse order (every one, even when one raises; the first error is
    raised after). A census whose begin raised is not ended."""

    def __init__(self, censuses: Sequence[object]) -> None:
        self.censuses = [c for c in censuses if c is not None]
        self._open: list[object] = []

    def begin(self, epoch: int) -> None:
        for census in self.censuses:
            census.begin(epoch)
            self._open.append(census)

    def end(self) -> None:
        error = None
        while self._open:
            census = self._open.pop()
            try:
                census.end()
            except BaseException as exc:  # end the others first
                error = error or exc
        if error is not None:
            raise error
