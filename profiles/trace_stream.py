"""Streaming trace counts: what `hotloop inspect` reports for a trace -- the totals of
`hotloop.profiles.trace_counts.count_totals` (anomalies of `hotloop.profiles.trace_anomalies.count_anomalies`
included) and the per-step table of `trace_counts.count_per_step` -- from the trace given as a sequence of schema
frames in file order (`hotloop.profiles.kineto_reader.iter_kineto`), without ever holding the whole frame.

`count_frames(frames, step_range_name, domain)` gives exactly what the in-memory functions give on
`pd.concat(frames)` sorted by start_us (stable): the same counts, the same per-step table (same columns, dtypes and
values) and the same anomaly counts, reasons and window edges (tests/profiles/test_trace_stream.py runs both on
every trace of tests/data/traces/, on a synthetic trace and on shuffled random ones).

How (one pass over the frames, then a small computation over what was kept):

- Per frame, what needs only the event itself is reduced at once: the name-based flags (graph launch, the sync
  APIs, memcpy/fill kernel names, grid (1, 1, 1), DtoD copies) become bits, the time anomalies (ts <= 0, dur < 0,
  GPU dur 0, non-finite) become bits, the last valid end of each thread (pid, tid) and of the trace is kept as a
  running maximum, the anomalies of events that never belong to a step (ranges, GPU ranges, ...) are counted by
  reason straight away, and the step-range candidates (user_annotation rows named `step_range_name` or
  ProfilerStep#N) are kept as rows.
- What needs other events is kept compactly: per CUDA runtime/driver call its correlation id, start, thread and
  API name code and its bits (25 bytes), per GPU event (kernel, memcpy, memset) its correlation id and its bits
  (10 bytes). At the end the step ranges are built (`trace_counts.step_ranges_from`, the in-memory path's own
  code, with the kept thread ends), each call gets its step (`trace_counts.steps_at`), each correlation id the
  step of its earliest call with one, each GPU event the step of its correlation id, and the cross-event
  anomalies (a GPU event with no launching call, a launch with no GPU event outside a stream capture, window
  edges) come from the sorted sets of call and GPU correlation ids and the per-thread call order.

Memory: the reader's working set of one frame plus ~25 bytes per CUDA call and ~10 per GPU event (and the
step-range rows), not the events' payload; the final sorts over the kept arrays briefly double them. `hotloop
inspect` on the 5.1 GB synthetic trace of results/cpu/trace_read_bench/README.md ("hotloop inspect") peaks at
~0.4 GB, where the whole counted frame and its pandas analysis took 1.6 GB.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hotloop.profiles.trace_anomalies import (
    _CAPTURE_BEGIN,
    _CAPTURE_END,
    ANOMALY_COLUMNS,
    EDGE_KEYS,
    LAUNCH_API,
    anomaly_reasons,
)
from hotloop.profiles.trace_counts import (
    COUNT_COLUMNS,
    GRAPH_LAUNCH_APIS,
    PROFILER_STEP,
    SYNC_APIS,
    SYNC_COLUMNS,
    choose_step_range_events,
    step_ranges_from,
    steps_at,
)
from hotloop.profiles.trace_schema import KIND_DTYPE, KINDS, event_frame

_K = {k: i for i, k in enumerate(KINDS)}
_KERNEL, _MEMCPY, _MEMSET = _K["kernel"], _K["memcpy"], _K["memset"]
_RUNTIME, _DRIVER, _RANGE = _K["runtime"], _K["driver"], _K["user_annotation"]
_GPU_CODES = (_KERNEL, _MEMCPY, _MEMSET)
_GPU_NAMES = np.array([KINDS[k] for k in _GPU_CODES], dtype=object)
# Anomaly bits: bit k is ANOMALY_COLUMNS[k]; then "ts is exactly 0" (the reason says "ts 0", else "ts < 0") and,
# kept beside them, "correlation id is NA".
_A = {c: np.uint8(1 << k) for k, c in enumerate(ANOMALY_COLUMNS)}
_TS0 = np.uint8(1 << len(ANOMALY_COLUMNS))
_CORR_NA = np.uint8(1 << 7)
_ANY = np.uint8((1 << len(ANOMALY_COLUMNS)) - 1)
_KEY = np.uint8(_ANY | _TS0)
# GPU event bits: kind index in _GPU_CODES (2 bits), then the flags that need only the event.
_G_GRID1, _G_DTOD, _G_MEMCPY_NAME, _G_FILL = (np.uint8(1 << k) for k in range(2, 6))


@dataclass
class TraceCounts:
    """What `hotloop inspect` reports for one trace: `events` (events counted, i.e. rows of the counted frame),
    `totals` (as `trace_counts.count_totals`) and `steps` (as `trace_counts.count_per_step`; empty with its columns
    when the trace has no step ranges)."""

    events: int
    totals: dict
    steps: pd.DataFrame


def count_frames(
    frames: Iterable[pd.DataFrame], step_range_name: str = "step", domain: str | None = None
) -> TraceCounts:
    """The counts of a trace given as schema frames in file order (e.g. `iter_kineto(path, kinds=...)`): equal to
    `count_totals(df)` and `count_per_step(df, step_range_name, domain)` of df = the frames concatenated and sorted
    by start_us (stable), in memory bounded by the number of CUDA calls and GPU events (module docstring)."""
    counter = StreamCounter(step_range_name, domain)
    for frame in frames:
        counter.add(frame)
    return counter.result()


class _Parts:
    """Per-field lists of per-frame arrays, concatenated field by field (each list freed as it goes)."""

    def __init__(self, fields: dict[str, type]) -> None:
        self.dtypes = fields
        self.parts: dict[str, list[np.ndarray]] = {f: [] for f in fields}

    def add(self, **arrays: np.ndarray) -> None:
        for f, a in arrays.items():
            self.parts[f].append(np.asarray(a, self.dtypes[f]))

    def take(self, field: str) -> np.ndarray:
        parts = self.parts.pop(field)
        out = np.concatenate(parts) if parts else np.zeros(0, self.dtypes[field])
        parts.clear()
        return out


def _isin_sorted(values: np.ndarray, sorted_unique: np.ndarray) -> np.ndarray:
    if not sorted_unique.size:
        return np.zeros(len(values), bool)
    pos = np.minimum(np.searchsorted(sorted_unique, values), sorted_unique.size - 1)
    return sorted_unique[pos] == values


def _int_column(frame: pd.DataFrame, col: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with NA as 0, NA mask) of an Int64 column at `rows`."""
    s = frame[col]
    return s.to_numpy(np.int64, na_value=0)[rows], s.isna().to_numpy()[rows]


def _reason_texts(kinds: list[str], names: list[str], bits: np.ndarray) -> list[str]:
    """The reason text (`trace_anomalies.anomaly_reasons`, the in-memory path's own code) of each (kind, name,
    anomaly bits) key: one representative event per key."""
    rep = pd.DataFrame(
        {"kind": kinds, "name": pd.Series(names, dtype=object), "start_us": np.where(bits & _TS0, 0.0, -1.0)}
    )
    flags = pd.DataFrame({c: (bits & _A[c]) != 0 for c in ANOMALY_COLUMNS})
    return anomaly_reasons(rep, flags).tolist()


def _join(counts: dict[str, int]) -> str:
    """`trace_anomalies.join_reasons` from counted reasons: most frequent first (ties by text), " xN" for N > 1."""
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "; ".join(r if n == 1 else f"{r} x{n}" for r, n in ordered)


class StreamCounter:
    """`add` schema frames in file order, then `result()` (module docstring); `count_frames` does both."""

    def __init__(self, step_range_name: str = "step", domain: str | None = None) -> None:
        self.step_range_name, self.domain = step_range_name, domain
        self.events = 0
        self.empty: pd.DataFrame | None = None  # a 0-row frame of the input's columns and dtypes
        self.threads: dict[tuple, int] = {}
        self.thread_end = np.zeros(0)  # per thread code: latest valid end (-inf: none)
        self.trace_end = -np.inf
        self.api: dict[str, int] = {}  # API call name -> code
        self.api_info: list[tuple] = []  # per code: (name, sync index or -1, graph, launch, begin, end capture)
        self.ranges: list[pd.DataFrame] = []
        self.calls = _Parts(
            {"corr": np.int64, "start": np.float64, "thread": np.int32, "name": np.int32, "bits": np.uint8}
        )
        self.gpu = _Parts({"corr": np.int64, "bits": np.uint8, "gbits": np.uint8})
        self.reasons: Counter[str] = Counter()
        self.anomalous = 0
        self.flag_counts = np.zeros(len(ANOMALY_COLUMNS), np.int64)

    # -- per frame --------------------------------------------------------------------------------------------
    def add(self, frame: pd.DataFrame) -> None:
        """Take one schema frame (the next run of the trace's events in file order)."""
        if self.empty is None:
            self.empty = frame.iloc[:0]
        n = len(frame)
        if not n:
            return
        self.events += n
        kind = frame["kind"]
        kind = (kind.cat.codes if kind.dtype == KIND_DTYPE else kind.astype(KIND_DTYPE).cat.codes).to_numpy()
        start = frame["start_us"].to_numpy(np.float64)
        dur = frame["dur_us"].to_numpy(np.float64)
        gpu = np.isin(kind, _GPU_CODES)
        with np.errstate(invalid="ignore"):
            finite = np.isfinite(start) & np.isfinite(dur)
            ts_np = finite & (start <= 0)
            bits = (
                ts_np * _A["ts_not_positive"]
                | (finite & (dur < 0)) * _A["dur_negative"]
                | (gpu & finite & (dur == 0)) * _A["gpu_dur_zero"]
                | ~finite * _A["time_not_finite"]
                | (ts_np & (start == 0)) * _TS0
            ).astype(np.uint8)
            valid = finite & (start > 0) & (dur >= 0)
        thread = self._thread_codes(frame)
        self._thread_ends_add(thread[valid], (start + dur)[valid])

        calls = np.flatnonzero((kind == _RUNTIME) | (kind == _DRIVER))
        if calls.size:
            corr, na = _int_column(frame, "correlation", calls)
            self.calls.add(
                corr=corr,
                start=start[calls],
                thread=thread[calls],
                name=self._api_codes(frame["name"].to_numpy()[calls]),
                bits=bits[calls] | na * _CORR_NA,
            )
        g = np.flatnonzero(gpu)
        if g.size:
            self._add_gpu(frame, kind[g], g, bits[g])
        other = np.flatnonzero(~gpu & (kind != _RUNTIME) & (kind != _DRIVER) & ((bits & _ANY) != 0))
        if other.size:  # anomalous events that no step holds: counted by reason now
            self._count_reasons(
                pd.DataFrame(
                    {
                        "kind": frame["kind"].to_numpy()[other].astype(str),
                        "name": frame["name"].to_numpy()[other],
                        "bits": bits[other],
                    }
                )
            )
        ranges = np.flatnonzero(kind == _RANGE)
        if ranges.size:
            names = frame["name"].iloc[ranges]
            named = names.eq(self.step_range_name)
            if self.domain is not None:
                named &= frame["domain"].iloc[ranges].eq(self.domain)
            keep = (named | names.str.fullmatch(PROFILER_STEP)).to_numpy(bool)
            if keep.any():
                self.ranges.append(frame.iloc[ranges[keep]].copy())

    def _thread_codes(self, frame: pd.DataFrame) -> np.ndarray:
        """Per row: an int32 code of its (pid, tid), the same over all frames."""
        pc, pu = pd.factorize(frame["pid"], use_na_sentinel=False)
        tc, tu = pd.factorize(frame["tid"], use_na_sentinel=False)
        pair, inv = np.unique(pc.astype(np.int64) * len(tu) + tc, return_inverse=True)
        table = self.threads
        lut = np.array(
            [table.setdefault((pu[p // len(tu)], tu[p % len(tu)]), len(table)) for p in pair.tolist()], np.int32
        )
        if len(table) > len(self.thread_end):
            self.thread_end = np.concatenate([self.thread_end, np.full(len(table) - len(self.thread_end), -np.inf)])
        return lut[inv.reshape(-1)]

    def _thread_ends_add(self, thread: np.ndarray, end: np.ndarray) -> None:
        if end.size:
            np.maximum.at(self.thread_end, thread, end)
            self.trace_end = max(self.trace_end, float(end.max()))

    def _api_codes(self, names: np.ndarray) -> np.ndarray:
        """Per call: the code of its name; the API facts of each new name taken with the in-memory path's own
        pandas string operations (`trace_anomalies.api_names`, `trace_counts.event_flags`)."""
        local, uniques = pd.factorize(names, use_na_sentinel=False)
        uniques = [u if type(u) is str else str(u) for u in uniques]
        new = [u for u in uniques if u not in self.api]
        if new:
            api = pd.Series(new, dtype="str").str.replace(r"_pt(sz|ds)$", "", regex=True)
            sync = [SYNC_APIS.index(a) if a in SYNC_APIS else -1 for a in api]
            facts = zip(
                new,
                sync,
                api.isin(GRAPH_LAUNCH_APIS),
                api.str.contains(LAUNCH_API),
                api.str.contains(_CAPTURE_BEGIN),
                api.str.contains(_CAPTURE_END),
            )
            for f in facts:
                self.api[f[0]] = len(self.api_info)
                self.api_info.append(tuple(f))
        return np.array([self.api[u] for u in uniques], np.int32)[local]

    def _add_gpu(self, frame: pd.DataFrame, kind: np.ndarray, rows: np.ndarray, bits: np.ndarray) -> None:
        corr, na = _int_column(frame, "correlation", rows)
        gbits = np.searchsorted(_GPU_CODES, kind).astype(np.uint8)
        grid1 = np.ones(len(rows), bool)
        for col in ("grid_x", "grid_y", "grid_z"):
            grid1 &= frame[col].to_numpy(np.int64, na_value=0)[rows] == 1
        gbits |= grid1 * _G_GRID1
        gbits |= ((kind == _MEMCPY) & (frame["copy_kind"].to_numpy()[rows] == "DtoD")) * _G_DTOD
        kernels = kind == _KERNEL
        if kernels.any():
            names = frame["name"].iloc[rows[kernels]]
            local, uniques = pd.factorize(names, use_na_sentinel=False)
            u = pd.Series(uniques, dtype=names.dtype)
            memcpy = u.str.startswith("memcpy").to_numpy(bool)[local]
            fill = u.str.contains("fill", case=False, regex=False).to_numpy(bool)[local]
            gbits[kernels] |= (memcpy * _G_MEMCPY_NAME | fill * _G_FILL).astype(np.uint8)
        self.gpu.add(corr=corr, bits=bits | na * _CORR_NA, gbits=gbits)

    def _count_reasons(self, events: pd.DataFrame, step: np.ndarray | None = None) -> dict[tuple[int, str], int]:
        """Count anomalous `events` (columns kind, name, bits; `step` per event or None) by reason into the
        totals; returns {(step, reason): events} for the events with a step (>= 0)."""
        bits = events["bits"].to_numpy() & _KEY
        self.anomalous += len(events)
        self.flag_counts += [int(np.count_nonzero(bits & _A[c])) for c in ANOMALY_COLUMNS]
        keys = events.assign(bits=bits, step=-1 if step is None else step)
        groups = keys.groupby(["kind", "name", "bits"], sort=False, observed=True)
        table = groups.size()
        texts = _reason_texts(
            [k for k, _, _ in table.index],
            [n for _, n, _ in table.index],
            np.array([b for _, _, b in table.index], np.uint8),
        )
        for text, count in zip(texts, table.to_numpy()):
            self.reasons[text] += int(count)
        if step is None:
            return {}
        keys["reason"] = np.asarray(texts, dtype=object)[groups.ngroup().to_numpy()]
        held = keys[keys["step"].ge(0)]
        return {(int(s), r): int(n) for (s, r), n in held.groupby(["step", "reason"], sort=False).size().items()}

    # -- the end ---------------------------------------------------------------------------------------------
    def _thread_ends(self, rows: pd.DataFrame) -> pd.Series:
        """`trace_counts._thread_ends` from the kept maxima: per row, its thread's latest valid end, else the
        trace's (NaN when no event has a valid time)."""
        trace_end = self.trace_end if np.isfinite(self.trace_end) else np.nan
        out = {}
        for i, pid, tid in zip(rows.index, rows["pid"], rows["tid"]):
            code = self.threads.get((pid, tid))
            end = self.thread_end[code] if code is not None else -np.inf
            out[i] = end if np.isfinite(end) else trace_end
        return pd.Series(out, dtype="float64")

    def result(self) -> TraceCounts:
        """The counts of everything added (module docstring)."""
        empty = self.empty if self.empty is not None else event_frame({"start_us": [], "dur_us": []})
        cands = pd.concat(self.ranges, ignore_index=True) if self.ranges else empty
        self.ranges = []
        cands = cands.sort_values("start_us", kind="stable", ignore_index=True)
        ranges = step_ranges_from(choose_step_range_events(cands, self.step_range_name, self.domain), self._thread_ends)
        n_steps = len(ranges)

        # CUDA calls: their steps and the correlation id -> step map (each array freed once used: at the end the
        # per-call arrays and their sorts are the peak).
        c = self.calls
        corr, cbits, name = c.take("corr"), c.take("bits"), c.take("name")
        cna = (cbits & _CORR_NA) != 0
        start = c.take("start")
        cstep = steps_at(ranges, start).astype(np.int32)
        sel = np.flatnonzero((cstep >= 0) & ~cna)
        sel = sel[np.argsort(start[sel], kind="stable")]  # the in-memory frame's order: start, then file order
        launched, first = np.unique(corr[sel], return_index=True)
        launched_step = cstep[sel[first]]
        del sel, first
        info = [np.asarray(v) for v in zip(*self.api_info)] if self.api_info else [np.zeros(0, np.int8)] * 6
        in_capture = self._in_capture(c.take("thread"), start, (info[4].astype(np.int8) - info[5])[name])
        del start

        # GPU events: the step of their correlation id.
        g = self.gpu
        gcorr, gbits_a, ginfo = g.take("corr"), g.take("bits"), g.take("gbits")
        gna = (gbits_a & _CORR_NA) != 0
        gstep = np.full(len(gcorr), -1, np.int32)
        hit = np.flatnonzero(~gna & _isin_sorted(gcorr, launched))
        gstep[hit] = launched_step[np.searchsorted(launched, gcorr[hit])]
        del launched, launched_step, hit

        # Cross-event anomalies and window edges (`trace_anomalies._unmatched`).
        call_ids = np.unique(corr[~cna])
        gpu_lone = gna | ~_isin_sorted(gcorr, call_ids)
        gpu_edge = gpu_lone & ((~gna & (gcorr < call_ids[0])) if call_ids.size else True)
        gbits_a |= (gpu_lone & ~gpu_edge) * _A["gpu_without_launch"]
        n_gpu_edge = int(np.count_nonzero(gpu_edge))
        del call_ids, gpu_lone, gpu_edge
        gpu_ids = np.unique(gcorr[~gna])
        launch_lone = info[3].astype(bool)[name] & ~in_capture & (cna | ~_isin_sorted(corr, gpu_ids))
        launch_edge = launch_lone & ((~cna & (corr > gpu_ids[-1])) if gpu_ids.size else True)
        cbits |= (launch_lone & ~launch_edge) * _A["launch_without_gpu"]
        edges = dict(zip(EDGE_KEYS, (n_gpu_edge, int(np.count_nonzero(launch_edge)))))
        del gpu_ids, launch_lone, launch_edge, in_capture

        # Counts: one flag array per column, summed over the trace and per step.
        gkind = ginfo & 3
        kernel = gkind == 0
        graph_of = info[2].astype(bool)[name]
        graph_ids = np.unique(corr[graph_of & ~cna])
        del corr
        gpu_flags = {
            "kernels": lambda: kernel,
            "kernels_grid1": lambda: kernel & ((ginfo & _G_GRID1) != 0),
            "memcpy_dtod_events": lambda: (gkind == 1) & ((ginfo & _G_DTOD) != 0),
            "memcpy_kernels": lambda: kernel & ((ginfo & _G_MEMCPY_NAME) != 0),
            "memset_events": lambda: gkind == 2,
            "fill_kernels": lambda: kernel & ((ginfo & _G_FILL) != 0),
            "kernels_in_graphs": lambda: kernel & ~gna & _isin_sorted(gcorr, graph_ids),
        }
        sync_of = info[1].astype(np.int8)[name] if len(info[1]) else np.zeros(len(name), np.int8)
        call_flags = {
            "graph_launches": lambda: graph_of,
            **{col: (lambda k=k: sync_of == k) for k, col in enumerate(SYNC_COLUMNS)},
        }
        totals, per_step = {}, {}
        for col in (*COUNT_COLUMNS, *SYNC_COLUMNS):
            flag, step = (gpu_flags[col](), gstep) if col in gpu_flags else (call_flags[col](), cstep)
            totals[col] = int(np.count_nonzero(flag))
            per_step[col] = np.bincount(step[flag & (step >= 0)], minlength=n_steps).astype(np.int64)
        del gpu_flags, call_flags  # the flag closures, then the arrays they hold (names kept for them: None)
        kernel = graph_ids = graph_of = sync_of = gcorr = None

        # Anomalies of calls and GPU events (the others were counted frame by frame).
        held: Counter[tuple[int, str]] = Counter()
        bad = np.flatnonzero((cbits & _ANY) != 0)
        if bad.size:
            names = np.asarray([f[0] for f in self.api_info], dtype=object)
            held.update(
                self._count_reasons(
                    pd.DataFrame({"kind": "runtime", "name": names[name[bad]], "bits": cbits[bad]}), cstep[bad]
                )
            )
        bad = np.flatnonzero((gbits_a & _ANY) != 0)
        if bad.size:  # a GPU event's reason names its kind, not the event
            held.update(
                self._count_reasons(
                    pd.DataFrame({"kind": _GPU_NAMES[gkind[bad]], "name": "", "bits": gbits_a[bad]}), gstep[bad]
                )
            )
        top = sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        totals = {col: totals[col] for col in COUNT_COLUMNS} | {
            "sync_calls": {api: totals[col] for api, col in zip(SYNC_APIS, SYNC_COLUMNS) if totals[col]},
            "anomalies": {
                "events": self.anomalous,
                "counts": {col: int(n) for col, n in zip(ANOMALY_COLUMNS, self.flag_counts)},
                "reasons": {r: int(n) for r, n in top},
                "window_edge": edges,
            },
        }
        return TraceCounts(self.events, totals, self._steps(ranges, per_step, held))

    def _in_capture(self, thread: np.ndarray, start: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """Per call: made while its thread had a stream capture open (`trace_anomalies._in_capture`: calls of a
        thread in start order, ties in file order; begin calls minus end calls before it > 0)."""
        out = np.zeros(len(delta), bool)
        if not delta.any():
            return out
        order = np.lexsort((np.arange(len(delta)), start, thread))
        d = delta[order].astype(np.int64)
        t = thread[order]
        total = np.cumsum(d)
        group = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
        base = np.repeat(total[group] - d[group], np.diff(np.r_[group, len(d)]))
        out[order] = (total - base - d) > 0
        return out

    @staticmethod
    def _steps(ranges: pd.DataFrame, per_step: dict[str, np.ndarray], held: Counter) -> pd.DataFrame:
        """The `count_per_step` table: ranges, counts, then anomalies/anomaly (`trace_counts.step_anomalies`)."""
        by_step: dict[int, Counter] = {}
        for step, reason in zip(ranges["step"].tolist(), ranges["anomaly"].tolist()):
            if reason != "":
                by_step.setdefault(step, Counter())[reason] += 1
        for (step, reason), n in held.items():
            by_step.setdefault(step, Counter())[reason] += n
        steps = ranges["step"].tolist()
        anomalies = pd.DataFrame(
            {
                "anomalies": np.array([sum(by_step[s].values()) if s in by_step else 0 for s in steps], np.int64),
                "anomaly": np.array([_join(by_step[s]) if s in by_step else "" for s in steps], dtype=object),
            }
        )
        counts = pd.DataFrame(per_step)
        return pd.concat([ranges.drop(columns="anomaly"), counts, anomalies], axis=1)
