"""Python-side host-sync detection: `SyncHooks` wraps torch's sync and device-read-back entry points while it is
active and records every hit with its call site and step.

Why hooks as well as the trace: on our H200 `torch.cuda.set_sync_debug_mode("error")` did not fire for
`torch.cuda.synchronize()` or `torch.cuda.Event.synchronize()` (docs/h200_facts.md, "Host syncs"), and a
trace cannot name the Python line that synced. The trace side is `hotloop.guards.step_metrics`; `hotloop.guards.guard`
joins both.

Hooked APIs and the criterion (its id; docs/criteria.md) each hit counts against (HOOKED_APIS):

- `torch.cuda.synchronize`, `torch.accelerator.synchronize` (cudaDeviceSynchronize) and
  `torch.cuda.Event.synchronize` (cudaEventSynchronize): `no_event_sync`.
- `torch.cuda.Stream.synchronize` (cudaStreamSynchronize): `no_stream_sync`.
- `torch.Tensor.item / .cpu / .tolist / .numpy / .__bool__` on a CUDA tensor: `no_stream_sync` (torch copies the
  value with cudaMemcpyAsync and then waits with cudaStreamSynchronize: at::_local_scalar_dense / copy_, so the
  trace shows the same read-back as a stream sync).
- `torch.Tensor.copy_`, `.to`, `.cuda` with non_blocking=True between a CUDA tensor and pageable (not pinned) host
  memory: `no_event_sync`, as the trace's rule counts such a copy (hotloop.guards.step_metrics). The driver makes a
  cudaMemcpyAsync to pageable memory return only once the copy is done, and may wait for the stream before one
  from pageable memory (CUDA Runtime API, "API synchronization behavior"); torch raises no sync debug warning for
  either. `.to(cpu, non_blocking=True)` is not counted: torch pins its output (at::_to_copy).

Completion queries, recorded apart (`QUERY_APIS`, `SyncHooks.queries`, `QueryHit`): `torch.cuda.Event.query`
(cudaEventQuery) and `torch.cuda.Stream.query` (cudaStreamQuery; `torch.cuda.current_stream()` is a
torch.cuda.Stream) never wait, so a query is no sync and counts against no criterion by itself; but a host that
queries until the GPU is done (`while not event.query(): pass`) waits as `event.synchronize()` does, and no sync
hook, sync debug warning or cuda*Synchronize call shows it. Each query is recorded with its call site, what it
returned (`ready`), when it started and how long it took (`start_s`, `dur_s`, host seconds on
time.perf_counter's clock) and, where a tracker sets `SyncHooks.phases` (hotloop.guards.loop_syncs), the phase
ranges around it. Which of them are polling (beyond the loop's own, e.g. the readback's one query per publication)
is decided by the criteria's allowance (hotloop.guards.criteria.query_allowance, hotloop.guards.step_metrics.
polling_flags), not here. A query inside a counted sync call is not recorded.

Tensor rules (`is_device_sync`, `is_pageable_async_copy`): a read-back counts only when the tensor is on a CUDA
device. A CPU tensor's `.item()` reads host memory and waits for no device, so it is not a host sync and is not
recorded. A copy counts only when non_blocking is True (the only value torch accepts as true there), one side is
on a CUDA device, the other is pageable host memory and it copies at least one element: a blocking copy is torch's
own sync (its debug warning), a contiguous same-dtype copy with pinned memory is asynchronous.

Limits: the hooks replace module/class attributes, so code that bound a function before the hooks were entered
(`from torch.cuda import synchronize`), C++ callers and the immutable device-generic `torch.Stream` /
`torch.Event` types (their syncs and their queries) are not seen (the trace sees those syncs and queries), nor are the
copies torch stages through a pageable temporary from C++ when a non_blocking copy with pinned memory is non-contiguous,
broadcast or converts the dtype (aten/src/ATen/native/cuda/Copy.cu, copy_requires_temporaries; the trace's "Pageable"
rule counts those). Inside a counted call no hooked call counts: a Tensor subclass's __torch_function__ re-dispatching
`.item()` counts once, and another sync such an override makes inside the counted call is not seen by the hooks.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

STREAM_SYNC, EVENT_SYNC = "no_stream_sync", "no_event_sync"
"""The ids of the criteria a hooked sync counts against (hotloop.guards.criteria: the rows whose hook_column counts
these hits; tests/guards/test_criteria_ids.py checks every HOOKED_APIS value is such an id)."""
TENSOR_READBACKS = ("item", "cpu", "tolist", "numpy", "__bool__")
TENSOR_COPIES = ("copy_", "to", "cuda")
HOOKED_APIS: dict[str, str] = {
    "torch.cuda.synchronize": EVENT_SYNC,
    "torch.accelerator.synchronize": EVENT_SYNC,
    "torch.cuda.Stream.synchronize": STREAM_SYNC,
    "torch.cuda.Event.synchronize": EVENT_SYNC,
    **{f"torch.Tensor.{m}": STREAM_SYNC for m in TENSOR_READBACKS},
    **{f"torch.Tensor.{m}": EVENT_SYNC for m in TENSOR_COPIES},
}
HIT_COLUMNS = ("step", "api", "criterion", "site", "function", "thread")
QUERY_APIS = ("torch.cuda.Event.query", "torch.cuda.Stream.query")
"""The completion queries the hooks record (apart from the syncs: a query is no sync by itself)."""
QUERY_HIT_COLUMNS = ("step", "api", "site", "function", "thread", "ready", "start_s", "dur_s", "phases")
# Frames in these directories are internals: a hit's call site is the first frame outside them.
_INTERNAL_DIRS = (str(Path(torch.__file__).parent) + "/", str(Path(__file__).parent) + "/")
_MISSING = object()


def is_device_sync(tensor: object) -> bool:
    """Whether reading `tensor` on the host (`.item()`, `.cpu()`, `.tolist()`, `.numpy()`, `bool()`) is a host sync:
    True exactly when it is a tensor on a CUDA device (`tensor.is_cuda`); False for CPU, meta and other tensors and
    for non-tensors. Source: at::_local_scalar_dense / copy_ wait on the stream only for CUDA data."""
    return isinstance(tensor, torch.Tensor) and bool(tensor.is_cuda)


def _pageable_host(tensor: object) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and not tensor.is_cuda
        and tensor.device.type == "cpu"
        and not tensor.is_pinned()
    )


def is_pageable_async_copy(dst: object, src: object, non_blocking: object) -> bool:
    """Whether copying `src` into `dst` is a non_blocking copy between a CUDA tensor and pageable host memory, which
    the driver makes synchronous (module docstring): True exactly when `non_blocking` is True (the bool; torch
    rejects any other value there), `dst` holds at least one element, one of the two is a tensor on a CUDA device
    and the other a CPU tensor that is not pinned. False for anything else, non-tensors included."""
    return (
        non_blocking is True
        and _nonempty(dst)
        and ((is_device_sync(src) and _pageable_host(dst)) or (is_device_sync(dst) and _pageable_host(src)))
    )


def _nonempty(tensor: object) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.numel() > 0


def _bool_arg(args: tuple, kwargs: dict, name: str) -> bool:
    """Whether `name` is passed as True: the keyword, else the first bool among the positional arguments after self
    (in every overload of Tensor.to and Tensor.cuda, non_blocking is the first bool parameter). Only the bool True
    counts, as torch accepts no other value there (an int or a tensor is its TypeError)."""
    if name in kwargs:
        return kwargs[name] is True
    return next((a for a in args[1:] if isinstance(a, bool)), False) is True


def _to_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether Tensor.to(*args[1:], **kwargs) targets a CUDA device (a device, its name or index, or a tensor)."""
    for target in (kwargs.get("device"), kwargs.get("tensor"), *args[1:]):
        if target is None or isinstance(target, (bool, torch.dtype, torch.memory_format)):
            continue
        if isinstance(target, torch.Tensor):
            return bool(target.is_cuda)
        return isinstance(target, int) or torch.device(target).type == "cuda"
    return False


def _copy_counts(args: tuple, kwargs: dict) -> bool:
    src = args[1] if len(args) > 1 else kwargs.get("other")  # torch names copy_'s source `other`
    return is_pageable_async_copy(args[0], src, args[2] if len(args) > 2 else kwargs.get("non_blocking", False))


def _to_counts(args: tuple, kwargs: dict) -> bool:  # host -> device only: a non_blocking .to(cpu) pins its output
    return (
        _bool_arg(args, kwargs, "non_blocking")
        and _to_cuda(args, kwargs)
        and _nonempty(args[0])
        and _pageable_host(args[0])
    )


def _cuda_counts(args: tuple, kwargs: dict) -> bool:
    return _bool_arg(args, kwargs, "non_blocking") and _nonempty(args[0]) and _pageable_host(args[0])


_TENSOR_RULES = {
    **{m: lambda args, kwargs: is_device_sync(args[0]) for m in TENSOR_READBACKS},
    "copy_": _copy_counts,
    "to": _to_counts,
    "cuda": _cuda_counts,
}


def counts_as_sync(api: str, args: tuple, kwargs: dict) -> bool:
    """Whether the call `api`(*args, **kwargs) of a HOOKED_APIS function is a host sync by the tensor rules (module
    docstring); the non-tensor APIs always are. Arguments it cannot read count as no sync (the call itself then
    raises its own error)."""
    owner, attr = api.rsplit(".", 1)
    if owner != "torch.Tensor":
        return True
    rule = _TENSOR_RULES[attr]  # every torch.Tensor method of HOOKED_APIS has one
    try:
        return rule(args, kwargs)
    except Exception:  # noqa: BLE001 (any argument it cannot read: the wrapped call raises its own error)
        return False


@dataclass(frozen=True)
class SyncHit:
    """One hooked call: `api` (a HOOKED_APIS key), the `criterion` id it counts against, `step` (the hooks' step index
    when it happened, None outside steps), `site` ("file:line" of the first frame outside torch and guards/),
    `function` (that frame's function name), `thread` (thread name)."""

    step: int | None
    api: str
    criterion: str
    site: str
    function: str
    thread: str


@dataclass(frozen=True)
class QueryHit:
    """One hooked completion query: `step`, `api` (a QUERY_APIS name), `site`, `function`, `thread` as SyncHit's;
    `ready` (what the query returned: True when the work was done), `start_s` (time.perf_counter() at the call) and
    `dur_s` (seconds inside it), `phases` (the phase ranges open around it, outermost first, when a tracker sets
    SyncHooks.phases; () otherwise: the guarded window places a query by its trace marker)."""

    step: int | None
    api: str
    site: str
    function: str
    thread: str
    ready: bool
    start_s: float
    dur_s: float
    phases: tuple[str, ...] = ()


class SyncHooks:
    """Context manager that records host syncs made through torch's Python API while active.

    On enter it wraps every HOOKED_APIS function in place and, only when `torch.cuda.is_available()`, sets
    `torch.cuda.set_sync_debug_mode("warn")` (torch then also warns from C++ for the syncs it knows). On exit, also
    when the body raised, it puts back every original attribute (an attribute that was inherited, e.g.
    `Tensor.item` from torch._C.TensorBase, is deleted again) and the previous debug mode. Hits are appended to
    `hits` (list of SyncHit) with `step` = the current value of the `step` attribute: set `hooks.step = k` before
    step k. The QUERY_APIS are wrapped too: each completion query is appended to `queries` (list of QueryHit, with
    `step` and `phases`, the current values of those attributes), never to `hits`.
    Raises RuntimeError when entered while already active. The hooks are process-wide (all threads).
    """

    def __init__(self) -> None:
        self.hits: list[SyncHit] = []
        self.queries: list[QueryHit] = []
        self.step: int | None = None
        self.phases: tuple[str, ...] | list[str] = ()
        self._saved: list[tuple[object, str, object]] = []
        self._debug_mode: int | None = None
        self._local = threading.local()

    def __enter__(self) -> SyncHooks:
        if self._saved:
            raise RuntimeError("SyncHooks is already active")
        try:
            for api, criterion in HOOKED_APIS.items():
                owner_name, attr = api.rsplit(".", 1)
                owner = _resolve(owner_name)
                self._saved.append((owner, attr, vars(owner).get(attr, _MISSING)))
                setattr(owner, attr, self._wrap(getattr(owner, attr), api, criterion))
            for api in QUERY_APIS:
                owner_name, attr = api.rsplit(".", 1)
                owner = _resolve(owner_name)
                self._saved.append((owner, attr, vars(owner).get(attr, _MISSING)))
                setattr(owner, attr, self._wrap_query(getattr(owner, attr), api))
            if torch.cuda.is_available():
                self._debug_mode = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("warn")
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()

    def frame(self) -> pd.DataFrame:
        """The hits as a DataFrame with columns HIT_COLUMNS (step is Int64, NA outside steps), in call order."""
        df = pd.DataFrame([asdict(h) for h in self.hits], columns=list(HIT_COLUMNS))
        return df.astype({"step": "Int64"})

    def query_frame(self) -> pd.DataFrame:
        """The completion queries as a DataFrame with columns QUERY_HIT_COLUMNS (step Int64, ready bool, phases a
        tuple per row), in call order."""
        df = pd.DataFrame([asdict(q) for q in self.queries], columns=list(QUERY_HIT_COLUMNS))
        df["phases"] = pd.Series([q.phases for q in self.queries], index=df.index, dtype=object)
        return df.astype({"step": "Int64", "ready": bool, "start_s": "float64", "dur_s": "float64"})

    def _restore(self) -> None:
        while self._saved:
            owner, attr, original = self._saved.pop()
            if original is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        if self._debug_mode is not None:
            torch.cuda.set_sync_debug_mode(self._debug_mode)
            self._debug_mode = None

    def in_counted_call(self) -> bool:
        """Whether this thread is inside a hooked call that recorded a hit (a sync warning raised there is that
        call's: hotloop.guards.loop_syncs)."""
        return bool(getattr(self._local, "depth", 0))

    def _wrap(self, original, api: str, criterion: str):
        local = self._local

        @functools.wraps(original)
        def hooked(*args, **kwargs):
            if getattr(local, "depth", 0) or not counts_as_sync(api, args, kwargs):
                return original(*args, **kwargs)  # inside a counted call (it counts once), or no sync
            site, function = call_site()
            self.hits.append(SyncHit(self.step, api, criterion, site, function, threading.current_thread().name))
            local.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                local.depth = 0

        return hooked

    def _wrap_query(self, original, api: str):
        local = self._local

        @functools.wraps(original)
        def hooked(*args, **kwargs):
            if getattr(local, "depth", 0):
                return original(*args, **kwargs)  # inside a counted sync call: that call's
            site, function = call_site()
            start = time.perf_counter()
            ready = original(*args, **kwargs)
            self.queries.append(
                QueryHit(
                    self.step,
                    api,
                    site,
                    function,
                    threading.current_thread().name,
                    bool(ready),
                    start,
                    time.perf_counter() - start,
                    tuple(self.phases),
                )
            )
            return ready

        return hooked


def spin_spans(queries: pd.DataFrame) -> pd.Series:
    """Per query of `queries` (a SyncHooks.query_frame(), in call order): the host seconds of the polling run it
    starts, 0.0 for a query that starts none. A run is a series of queries by one thread at one call site in one
    step (`step`, NA counting as one value), each but the last one not ready: from the first one's start to the last
    one's end, the Python loop between them included (a lone query: its own duration). The time the host spent
    polling; no verdict is made on it."""
    out = pd.Series(0.0, index=queries.index, dtype="float64")
    last: dict[str, tuple] = {}  # thread -> (site, step, ready, run's first index)
    for i, site, step, thread, ready, start, dur in zip(
        queries.index,
        queries["site"],
        queries["step"],
        queries["thread"],
        queries["ready"],
        queries["start_s"],
        queries["dur_s"],
    ):
        step = None if pd.isna(step) else int(step)
        prev = last.get(thread)
        if prev is not None and prev[:2] == (site, step) and not prev[2]:
            first = prev[3]
        else:
            first = i
            out[i] = 0.0
        out[first] = start + dur - queries.at[first, "start_s"]
        last[thread] = (site, step, bool(ready), first)
    return out


def _resolve(dotted: str) -> object:
    """torch.cuda / torch.accelerator / torch.cuda.Stream / torch.Tensor ... from their dotted names."""
    obj: object = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


_WARNING_MODULES = ("warnings", "_py_warnings")  # Python 3.14 moved warnings' code into _py_warnings


def call_site() -> tuple[str, str]:
    """("file:line", function) of the innermost frame outside torch, guards/ and the warnings modules, above the
    caller's caller (the hooked call's wrapper, or the warnings' show hook: hotloop.guards.loop_syncs)
    (("<unknown>", "") if none)."""
    frame = sys._getframe(2)
    while frame is not None:
        if (
            not frame.f_code.co_filename.startswith(_INTERNAL_DIRS)
            and frame.f_globals.get("__name__") not in _WARNING_MODULES
        ):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}", frame.f_code.co_name
        frame = frame.f_back
    return "<unknown>", ""
