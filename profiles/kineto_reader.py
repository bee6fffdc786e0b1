"""Read a torch.profiler (Kineto) Chrome-trace JSON file into the event schema of `hotloop.profiles.trace_schema`.

Source: the Kineto trace format (Chrome Trace Event Format, JSON Object Format: `{"traceEvents": [...], ...}`);
HTA `hta/common/trace_parser.py` for the parse-then-analyse split. Only complete events (`"ph": "X"`) are kept,
as the expected counts in tests/data/traces/README.md were made; flow (`s`/`f`), metadata (`M`) and instant (`i`)
events are skipped.

How it reads (streaming; no size limit): the file (plain or gzip) is read and UTF-8-decoded in chunks of
`_CHUNK` bytes into a sliding text window; a small hand-written scanner walks the top-level object and the
"traceEvents" array, and the events are decoded by the stdlib's C JSON decoder: the window's text up to its
last event boundary as one array (`json.loads("[" + slice + "]")`), or, where that fails (a boundary guessed
inside an event, invalid JSON, raw control characters, ...), one event at a time with
`json.JSONDecoder.raw_decode` at its offset, which gives the exact error and position. Of each batch only the
schema's fields of the "X" events are kept, in compact column arrays (float64 / int64 + mask / int8 kind codes /
int32 codes into a table of the distinct names, pids and tids), and the batch's dicts are dropped. So the
working memory is a few window chunks plus one batch (tens of MB) whatever the file size; `read_kineto` adds the
result frame (about 150 bytes per "X" event: 10 Int64 columns, 3 float64, 5 string columns sharing one str
object per distinct value), `iter_kineto` yields it frame by frame and so stays bounded for any size. The cyclic
garbage collector is paused while events are decoded (decoded JSON holds no reference cycles, and its passes
over millions of young dicts cost about as much as the decoding: `json.load` pays them), and restored as it was.
No JSON text or event dict outlives its batch, so nesting depth is the only limit the C decoder keeps: deeper
than Python's recursion limit is a TraceReadError, as are the other malformed inputs listed in `read_kineto`.
Source: Python's `json` module documentation (`JSONDecoder.raw_decode`, `strict=False`); the streaming layout is
this module's own. Measured against `json.load`, ijson (yajl2_c) and HTA: results/cpu/trace_read_bench/README.md.
"""

from __future__ import annotations

import codecs
import gc
import gzip
import json
import math
import re
import sys
import warnings
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import compress, repeat
from operator import is_not
from pathlib import Path

import numpy as np
import pandas as pd

from hotloop.profiles.input_files import InputFileError, open_input
from hotloop.profiles.trace_schema import KIND_DTYPE, KINDS, TraceReadError, TraceReadWarning, event_frame

_CHUNK = 2**20
"""Bytes read (and decompressed) per step of the text window; the window holds 1-2 chunks (measured: 256 KiB to
1 MiB read fastest, 4 MiB 15% slower; the decoded dicts of a window take ~5x its text)."""
_BATCH = 16384
"""Events decoded one by one (the careful path) before their schema fields are taken into the column arrays
and the dicts dropped; the fast path's batch is the events of one window (~2 MB of text)."""
_MAX_SLICE_FAILURES = 4
"""Failed whole-slice decodes after which a file is decoded one event at a time only."""
CATEGORY_KINDS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "driver",
    "gpu_user_annotation": "annotation",
    "cpu_op": "cpu_op",
    "user_annotation": "user_annotation",
}
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_CAT_CODE = {cat: _KIND_CODE[kind] for cat, kind in CATEGORY_KINDS.items()}
_OTHER = _KIND_CODE["other"]
_MEMCPY = _KIND_CODE["memcpy"]
_COPY_KIND = re.compile(r"Memcpy (\w+)")
_WS = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(r"[ \t\n\r]*(?:(,)[ \t\n\r]*|(\]))")
_TAIL = 64
"""A decode error this close to the end of the window may be the window's end, not the data's: read more first."""
_STRICT = json.JSONDecoder()
_LENIENT = json.JSONDecoder(strict=False)
_ARG_COLUMNS = ("stream", "device", "correlation", "external_id")
_ARG_KEYS = ("stream", "device", "correlation", "External id")
_DIM3 = tuple(f"{p}_{a}" for p in ("grid", "block") for a in "xyz")
_INT_COLUMNS = _DIM3 + _ARG_COLUMNS
_NUMBER = (int, float)
_INT64_MAX = 2**63 - 1
_EXACT_IN_FLOAT = 2**53
_EMPTY: dict = {}
_NONE = type(None)
_FLOAT_TYPES = {int, float}
_ID_TYPES = {int, str}
_BYTES_TYPES = {int, float, _NONE}


def read_kineto(
    path: str | Path, *, max_json_bytes: int | None = None, kinds: Iterable[str] | None = None
) -> pd.DataFrame:
    """The complete ("ph": "X") events of a Kineto trace as a DataFrame in the `hotloop.profiles.trace_schema` schema.

    `path`: a .json file, plain or gzip-compressed (detected by its magic bytes, whatever the suffix:
    .json, .json.gz, .pt.trace.json, ...), of any size: it is read as a stream (module docstring), so memory is
    the result frame (about 150 bytes per "X" event) plus a bounded working set, not a multiple of the file.
    `max_json_bytes` (int, optional; default no limit): an explicit opt-in cap on the decompressed JSON size in
    bytes, for callers that want to refuse big files; a file over it is a TraceReadError.
    `kinds` (optional): keep only the events of these schema kinds (values of `trace_schema.KINDS`, e.g.
    ("kernel", "runtime")); default all. Leaving out cpu_op and other (python_function) shrinks the frame of a
    real training trace several times; the whole file is still read and checked.
    One row per "X" event (of `kinds`), every such event kept as it is (zero or negative ts/dur included), sorted by
    start_us (stable). Category -> kind: kernel, gpu_memcpy -> memcpy, gpu_memset -> memset, cuda_runtime ->
    runtime, cuda_driver -> driver, gpu_user_annotation -> annotation, cpu_op, user_annotation; any other
    category (cuda_sync, overhead, python_function, Trace, ...) -> other. `ts`/`dur` are already microseconds.
    Kernel grid/block come from `args.grid`/`args.block` (a list of 3 ints, else NA); bytes, stream, device,
    correlation and External id from `args` (an int, else NA; bytes an int or float, else NaN); copy_kind from
    the memcpy name ("Memcpy DtoD (Device -> Device)" -> "DtoD"). A UTF-8 byte order mark at the start is skipped.

    Raw control characters inside JSON strings (invalid in strict JSON) are read leniently, as the characters
    themselves (`json` with strict=False; the meaning is unambiguous), with a TraceReadWarning saying so.

    Raises TraceReadError (a ValueError) naming the file for: a missing/unreadable file, a path that is not a
    regular file (a FIFO, a device, a folder: refused without waiting for a writer), a corrupt or truncated
    gzip stream, text that is not UTF-8, text that is not one JSON object, invalid JSON (with line and column),
    JSON nested deeper than Python's recursion limit allows the decoder, an integer of more than 4300 digits
    (Python's int_max_str_digits), an object without a "traceEvents" list, an event that is not an object, an "X"
    event that lacks name/ts/dur or has a ts/dur that is not a finite number (a string, NaN, Infinity, 1e999), a
    NaN/Infinity in args bytes/grid/block/stream/device/correlation/External id, an int in one of those Int64
    columns outside the int64 range, or decompressed JSON over `max_json_bytes` when that was given.
    ValueError for a `max_json_bytes` that is not a positive int or a `kinds` value not in KINDS.
    """
    _check_limit(max_json_bytes)
    cols = _Columns(_keep(kinds))
    with _Reader(path, max_json_bytes) as reader, _gc_paused():
        for first, batch in reader.batches(_BATCH):
            cols.add(path, first, batch)
        return cols.frame()


def iter_kineto(
    path: str | Path,
    *,
    batch_events: int = 1 << 18,
    max_json_bytes: int | None = None,
    kinds: Iterable[str] | None = None,
) -> Iterator[pd.DataFrame]:
    """The "X" events of a Kineto trace as a sequence of schema DataFrames, each for a run of consecutive
    traceEvents entries, in file order: memory stays bounded (one frame) whatever the file size.

    Each frame is in the `hotloop.profiles.trace_schema` schema with the rows of `read_kineto` for its entries,
    sorted by start_us within the frame only (Kineto files are not in time order; sort or aggregate across
    frames yourself). pd.concat of all frames, sorted by start_us (stable), equals `read_kineto(path)`; a trace
    without events gives one empty frame. `batch_events` (int >= 1): traceEvents entries (all "ph" kinds) per
    frame, at least (the last frame excepted) and at most that plus one decoded window (~2 MB of JSON, ~7k
    events); default 262,144 (~75 MB of JSON, a frame of ~30 MB). `max_json_bytes`, `kinds`: as in `read_kineto`.
    Raises what `read_kineto` raises (TraceReadError naming the file) when the iteration reaches the problem;
    ValueError (at the first next()) for a bad `batch_events`, `max_json_bytes` or `kinds`.
    """
    if type(batch_events) is not int or batch_events < 1:
        raise ValueError(f"batch_events must be an int >= 1, got {batch_events!r}")
    _check_limit(max_json_bytes)
    cols = _Columns(_keep(kinds))
    with _Reader(path, max_json_bytes) as reader:
        batches = reader.batches(min(_BATCH, batch_events))
        done = False
        while not done:
            with _gc_paused():  # only while this generator runs, never across its yield
                pending = 0
                for first, batch in batches:
                    cols.add(path, first, batch)
                    pending += len(batch)
                    if pending >= batch_events:
                        break
                else:
                    done = True
                frame = cols.frame(reset=True) if pending or done and not cols.emitted else None
            if frame is not None:
                yield frame


def _keep(kinds: Iterable[str] | None) -> np.ndarray | None:
    """A bool lookup table kind code -> kept, or None for all kinds."""
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = (kinds,)
    kinds = list(kinds)
    bad = [k for k in kinds if k not in _KIND_CODE]
    if bad:
        raise ValueError(f"kinds: {bad!r} not in the schema's KINDS {KINDS}")
    keep = np.zeros(len(KINDS), np.bool_)
    keep[[_KIND_CODE[k] for k in kinds]] = True
    return keep


def _check_limit(max_json_bytes: int | None) -> None:
    if max_json_bytes is not None and (type(max_json_bytes) is not int or max_json_bytes < 1):
        raise ValueError(f"max_json_bytes must be None or an int >= 1, got {max_json_bytes!r}")


@contextmanager
def _gc_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Reader:
    """A sliding window over a trace's decoded text, and the scanner of its top-level structure.

    `text[pos:]` is the part not consumed yet; `_refill(pos)` drops what is before `pos` and appends the next
    chunk. Line/column of a position are kept for error messages (newlines of dropped text are counted).
    """

    def __init__(self, path: str | Path, max_json_bytes: int | None) -> None:
        self.path = path
        self.limit = max_json_bytes
        self.raw = None
        self.stream = None
        self.text = ""
        self.eof = False
        self.nbytes = 0
        self.line0 = 1  # line number of text[0]
        self.col0 = 0  # characters between the last newline before text[0] and text[0]
        self.first = True
        self.lenient: list[int] = []
        self.utf8 = codecs.getincrementaldecoder("utf-8")()

    def __enter__(self) -> _Reader:
        try:
            self.raw = open_input(self.path, "trace")  # a FIFO or device refused, never waited on
            gz = self.raw.read(2) == b"\x1f\x8b"
            self.raw.seek(0)
        except InputFileError as exc:
            self.close()
            raise TraceReadError(self.path, exc.problem) from None
        except OSError as exc:
            self.close()
            raise TraceReadError(self.path, f"cannot read: {exc.strerror or exc}") from None
        self.stream = gzip.GzipFile(fileobj=self.raw) if gz else self.raw
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        if exc[0] is None and self.lenient:
            warnings.warn(
                f"{self.path}: {len(self.lenient)} JSON value(s) hold raw control characters inside "
                f"strings (first at line {self.lenient[0]}); read leniently, taking the characters as "
                "written",
                TraceReadWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        if self.stream is not None and self.stream is not self.raw:
            self.stream.close()
        if self.raw is not None:
            self.raw.close()
        self.raw = self.stream = None

    # -- the window ---------------------------------------------------------------------------------------------
    def _refill(self, pos: int) -> tuple[str, int]:
        """Drop text[:pos], append at least one more chunk (more while what is kept is bigger: a value longer
        than a chunk is re-decoded O(log n) times, not O(n / chunk)); returns (text, 0). Sets eof at the end."""
        text = self.text
        nl = text.count("\n", 0, pos)
        if nl:
            self.line0 += nl
            self.col0 = pos - text.rfind("\n", 0, pos) - 1
        else:
            self.col0 += pos
        keep = text[pos:]
        want = max(_CHUNK, len(keep))
        try:
            data = self.stream.read(want)
        except EOFError:
            raise TraceReadError(self.path, "truncated gzip file (compressed stream ends early)") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise TraceReadError(self.path, f"corrupt gzip file ({exc})") from None
        except OSError as exc:
            raise TraceReadError(self.path, f"cannot read: {exc.strerror or exc}") from None
        if self.limit is not None and self.nbytes + len(data) > self.limit:
            raise TraceReadError(
                self.path,
                f"JSON larger than max_json_bytes={self.limit} bytes (the cap this "
                "call set; leave it out to read the file whatever its size)",
            )
        if self.first and data.startswith(codecs.BOM_UTF8):
            data = data[3:]
            self.nbytes += 3
        held = len(self.utf8.getstate()[0])  # bytes of a character cut by the previous chunk
        try:
            new = self.utf8.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise TraceReadError(
                self.path, f"not UTF-8 text (byte {self.nbytes - held + exc.start}): not a Kineto JSON trace"
            ) from None
        self.first = False
        self.nbytes += len(data)
        self.eof = not data
        self.text = text = keep + new if keep else new
        return text, 0

    def _where(self, pos: int) -> str:
        text = self.text
        nl = text.count("\n", 0, pos)
        col = (pos - text.rfind("\n", 0, pos)) if nl else self.col0 + pos + 1
        return f"line {self.line0 + nl} column {col}"

    def _invalid(self, pos: int, msg: str) -> TraceReadError:
        return TraceReadError(self.path, f"invalid JSON at {self._where(pos)}: {msg}")

    # -- values ---------------------------------------------------------------------------------------------
    def _value(self, pos: int, what: str) -> tuple[object, int]:
        """Decode the JSON value at `pos` (reading more while the window may cut it): (value, end).

        `what` names the value in error messages ("traceEvents[12]", "the value of key 'x'")."""
        text = self.text
        decoder = _STRICT
        while True:
            pos = _WS.match(text, pos).end()
            if pos >= len(text):
                if not self.eof:
                    text, pos = self._refill(pos)
                    continue
                raise self._invalid(pos, "unexpected end of data")
            try:
                obj, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                if not self.eof and (exc.pos >= len(text) - _TAIL or exc.msg.startswith("Unterminated string")):
                    text, pos = self._refill(pos)
                    continue
                if decoder is _STRICT and exc.msg.startswith("Invalid control character"):
                    decoder = _LENIENT
                    self.lenient.append(self.line0 + text.count("\n", 0, exc.pos))
                    continue
                raise self._invalid(exc.pos, exc.msg) from None
            except RecursionError:
                raise TraceReadError(
                    self.path,
                    f"{what} at {self._where(pos)}: JSON nested too deeply for the "
                    "decoder (deeper than Python's recursion limit)",
                ) from None
            except ValueError as exc:  # int() of a number over sys.get_int_max_str_digits() digits
                m = re.compile(rf"\d{{{sys.get_int_max_str_digits() + 1},}}").search(text, pos)
                at = self._where(m.start()) if m else self._where(pos)
                raise TraceReadError(
                    self.path, f"{what}: a number at {at} has more digits than Python reads as an int ({exc})"
                ) from None
            if end >= len(text) and not self.eof:  # a number or literal may go on past the window
                text, pos = self._refill(pos)
                continue
            return obj, end

    def _skip_ws(self, pos: int) -> int:
        """Position of the next non-whitespace character (reading more as needed); len(text) only at EOF."""
        while True:
            pos = _WS.match(self.text, pos).end()
            if pos < len(self.text) or self.eof:
                return pos
            _, pos = self._refill(pos)

    def _expect(self, pos: int, chars: str) -> tuple[str, int]:
        pos = self._skip_ws(pos)
        if pos >= len(self.text):
            raise self._invalid(pos, "unexpected end of data")
        ch = self.text[pos]
        if ch not in chars:
            raise self._invalid(pos, f"expecting {' or '.join(map(repr, chars))}")
        return ch, pos + 1

    # -- structure ------------------------------------------------------------------------------------------
    def batches(self, size: int) -> Iterator[tuple[int, list]]:
        """Yield (index of the first, events) for the "traceEvents" entries, `size` at a time, in file order.

        Validates the whole file's JSON and its top-level shape (errors as TraceReadError)."""
        self._refill(0)
        pos = self._skip_ws(0)
        if pos >= len(self.text):
            raise self._invalid(pos, "unexpected end of data (empty file)")
        if self.text[pos] != "{":
            raise TraceReadError(
                self.path,
                "does not start with '{': a Kineto (torch.profiler) trace is one JSON "
                'object {"traceEvents": [...], ...}',
            )
        pos += 1
        found = False
        count = 0  # traceEvents entries so far (a second "traceEvents" key goes on counting)
        ch, pos = self._expect(pos, '"}')
        if ch == '"':
            pos -= 1  # the key's opening quote
            while True:
                pos = self._skip_ws(pos)
                key, pos = self._value(pos, "a key of the top-level object")
                if not isinstance(key, str):
                    raise self._invalid(pos, "expecting a property name in double quotes")
                _, pos = self._expect(pos, ":")
                pos = self._skip_ws(pos)
                if key == "traceEvents" and pos < len(self.text) and self.text[pos] == "[":
                    found = True
                    for first, batch, pos in self._array(pos + 1, size, count):
                        yield first, batch
                        count = first + len(batch)
                else:
                    _, pos = self._value(pos, f"the value of key {key!r}")
                ch, pos = self._expect(pos, ",}")
                if ch == "}":
                    break
        where = self._where(pos)
        pos = self._skip_ws(pos)
        if pos < len(self.text):
            raise TraceReadError(self.path, f"invalid JSON at {where}: extra data after the top-level object")
        if not found:
            raise TraceReadError(
                self.path,
                'no "traceEvents" list at the top level: not a Kineto (torch.profiler) Chrome-trace JSON object',
            )

    def _array(self, pos: int, size: int, first: int) -> Iterator[tuple[int, list, int]]:
        """After the "[" of traceEvents: yield (index of the first, events, position after them) until the array
        ends; the last batch's position is after the closing "]". A decode error is raised only after the events
        decoded before it have been yielded (so problems are reported in file order).

        Fast path: the window's text up to its last event boundary (a "}" followed by "," and "{") is decoded as
        one array, `json.loads("[" + slice + "]")`, all in C (keys shared within the batch). That succeeds only
        when the slice is exactly a run of whole events (a cut inside an event leaves it unbalanced), so the
        result is what decoding event by event gives; on any failure (a cut inside an event, invalid JSON, raw
        control characters, deep nesting, huge ints) the events are decoded one by one (`size` of them, with
        exact error positions), and after `_MAX_SLICE_FAILURES` failures only one by one.
        """
        pos = self._skip_ws(pos)
        if pos < len(self.text) and self.text[pos] == "]":
            yield first, [], pos + 1
            return
        loads = _STRICT.decode
        raw = _STRICT.raw_decode
        sep = _SEP.match
        failures = 0
        while True:
            text = self.text
            if not self.eof and len(text) - pos < _CHUNK:
                text, pos = self._refill(pos)
            if failures < _MAX_SLICE_FAILURES:
                cut = _last_boundary(text, pos)
                if cut > pos:
                    try:
                        batch = loads("[" + text[pos:cut] + "]")
                    except (ValueError, RecursionError):
                        failures += 1
                    else:
                        pos = sep(text, cut).end()  # the "," after the slice, and whitespace
                        yield first, batch, pos
                        first += len(batch)
                        continue
            batch = []
            app = batch.append
            n = len(text)
            while True:
                try:
                    ev, end = raw(text, pos)
                    if end >= n and not self.eof:
                        raise ValueError
                except (ValueError, RecursionError):  # the careful path: more data, lenient, or an error
                    try:
                        ev, end = self._value(pos, f"traceEvents[{first + len(batch)}]")
                    except TraceReadError:
                        if batch:
                            yield first, batch, pos
                        raise
                    text = self.text
                    n = len(text)
                app(ev)
                m = sep(text, end)
                while m is None:
                    end = self._skip_ws(end)
                    text = self.text
                    n = len(text)
                    if end >= n or text[end] not in ",]":
                        yield first, batch, end
                        raise self._invalid(end, "unexpected end of data" if end >= n else "expecting ',' or ']'")
                    m = sep(text, end)
                pos = m.end()
                if m.lastindex == 2:
                    yield first, batch, pos
                    return
                if len(batch) >= size:
                    yield first, batch, pos
                    first += len(batch)
                    break


def _last_boundary(text: str, pos: int) -> int:
    """The end (after its "}") of the last event in text[pos:] that is followed by "," and another "{", or -1.

    A candidate only: a "}, {" inside an event (a list of objects in args) looks the same; the caller's decode
    of the slice tells. Tries the last few "}," only (a slice with none that fits is decoded one by one)."""
    j = len(text)
    for _ in range(8):
        j = text.rfind("},", pos, j)
        if j < 0:
            return -1
        k = _WS.match(text, j + 2).end()
        if k < len(text) and text[k] == "{":
            return j + 1
    return -1


# -- columns --------------------------------------------------------------------------------------------------
class _Intern:
    """Distinct values -> int32 codes, over all batches (names, pids, tids)."""

    def __init__(self, to_str: bool) -> None:
        self.codes: dict[str, int] = {}
        self.to_str = to_str

    def encode(self, values: list) -> np.ndarray:
        if not values:
            return np.zeros(0, np.int32)
        local, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)
        table = self.codes
        if self.to_str:
            lut = [table.setdefault(u if type(u) is str else str(u), len(table)) for u in uniques]
        else:
            lut = [table.setdefault(u, len(table)) for u in uniques]
        return np.asarray(lut, np.int32)[local]

    def values(self) -> np.ndarray:
        out = np.empty(len(self.codes), dtype=object)
        out[:] = list(self.codes)
        return out


class _Growable:
    """An append-only 1-D array (capacity doubling; untouched capacity is never resident), so that the columns
    are built in place instead of as a list of parts concatenated at the end (which would hold both)."""

    def __init__(self, dtype) -> None:
        self.buf = np.empty(0, dtype)
        self.n = 0

    def append(self, values: np.ndarray) -> None:
        end = self.n + len(values)
        if end > len(self.buf):
            grown = np.empty(max(end, 2 * len(self.buf)), self.buf.dtype)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : end] = values
        self.n = end

    def array(self) -> np.ndarray:
        """The values (a view when the buffer is not much bigger, else a trimmed copy; the buffer is let go)."""
        buf, self.buf = self.buf, np.empty(0, self.buf.dtype)
        return buf[: self.n] if self.n * 4 >= len(buf) * 3 else buf[: self.n].copy()


class _Columns:
    """The schema fields of "X" events, batch by batch, as compact arrays; `frame()` builds the DataFrame."""

    def __init__(self, keep: np.ndarray | None = None) -> None:
        self.keep = keep
        self.names = _Intern(to_str=False)
        self.pids = _Intern(to_str=True)
        self.tids = _Intern(to_str=True)
        self.emitted = 0
        self._reset()

    def _reset(self) -> None:
        self.parts: dict[str, _Growable] = {
            c: _Growable(dtype)
            for c, dtype in (
                ("name", np.int32),
                ("kind", np.int8),
                ("start_us", np.float64),
                ("dur_us", np.float64),
                ("bytes", np.float64),
                ("pid", np.int32),
                ("tid", np.int32),
                *((c, np.int64) for c in _INT_COLUMNS),
                *((f"{c}_mask", np.bool_) for c in _INT_COLUMNS),
            )
        }

    def add(self, path: str | Path, first: int, batch: list) -> None:
        """Take the "X" events of `batch` (traceEvents[first:first + len(batch)]); raise TraceReadError for the
        first event of it (in order) with a problem."""
        if not batch:
            return
        got = _fast(batch)
        if got is None:
            got = _careful(path, first, batch)
        names, kinds, pids, tids, floats, ints = got
        rows = None
        if self.keep is not None:
            rows = self.keep[kinds]
            if rows.all():
                rows = None
            elif not rows.any():
                return
            else:
                names, pids, tids = (list(compress(v, rows)) for v in (names, pids, tids))
        p = self.parts
        p["name"].append(self.names.encode(names))
        p["pid"].append(self.pids.encode(pids))
        p["tid"].append(self.tids.encode(tids))
        p["kind"].append(kinds if rows is None else kinds[rows])
        for col, arr in zip(("start_us", "dur_us", "bytes"), floats):
            p[col].append(arr if rows is None else arr[rows])
        for col, (values, mask) in zip(_INT_COLUMNS, ints):
            p[col].append(values if rows is None else values[rows])
            p[f"{col}_mask"].append(mask if rows is None else mask[rows])

    def frame(self, reset: bool = False) -> pd.DataFrame:
        p = self.parts
        if reset:
            self._reset()
            self.emitted += 1

        def take(col: str, dtype) -> np.ndarray:
            return p.pop(col).array()

        start = take("start_us", np.float64)
        order = None
        if len(start) > 1 and not (start[1:] >= start[:-1]).all():
            order = np.argsort(start, kind="stable")
            start = start[order]

        def column(col: str, dtype) -> np.ndarray:
            arr = take(col, dtype)
            return arr[order] if order is not None else arr

        names = column("name", np.int32)
        kinds = column("kind", np.int8)
        name_values = self.names.values()
        copy_lut = np.empty(len(name_values), dtype=object)
        copy_lut[:] = [m.group(1) if (m := _COPY_KIND.match(s)) else "" for s in name_values]
        copy_kind = copy_lut[names]
        copy_kind[kinds != _MEMCPY] = ""
        # Series of the schema's dtypes, made without copies (event_frame takes them as they are).
        cols: dict[str, pd.Series] = {
            "name": pd.Series(name_values[names], dtype="str"),
            "kind": pd.Series(pd.Categorical.from_codes(kinds, dtype=KIND_DTYPE)),
            "start_us": pd.Series(start, copy=False),
            "dur_us": pd.Series(column("dur_us", np.float64), copy=False),
            "bytes": pd.Series(column("bytes", np.float64), copy=False),
            "copy_kind": pd.Series(copy_kind, dtype="str"),
        }
        del copy_kind, copy_lut, names, kinds, start
        for col in _INT_COLUMNS:
            values = column(col, np.int64)
            cols[col] = pd.Series(pd.arrays.IntegerArray(values, column(f"{col}_mask", np.bool_)), copy=False)
        cols["pid"] = pd.Series(self.pids.values()[column("pid", np.int32)], dtype="str")
        cols["tid"] = pd.Series(self.tids.values()[column("tid", np.int32)], dtype="str")
        return event_frame(cols)


def _ints(values: tuple, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """int64 values and NA mask of `n` int / None values; None when anything else is there or out of range."""
    missing = values.count(None)
    if missing == n:
        return np.zeros(n, np.int64), np.ones(n, np.bool_)
    if set(map(type, values)) != ({int, _NONE} if missing else {int}):
        return None
    arr = np.array(values, dtype=np.float64)  # None -> NaN; exact for |v| <= 2**53
    mask = np.isnan(arr)
    arr[mask] = 0
    if np.abs(arr).max() >= _EXACT_IN_FLOAT:
        try:
            return np.array([0 if v is None else v for v in values], dtype=np.int64), mask
        except OverflowError:
            return None
    return arr.astype(np.int64), mask


def _fast(batch: list):
    """The columns of the "X" events of `batch` when every one of them is plain (the usual case), in a few
    C-speed passes per field; None when any event needs the per-event path (`_careful`)."""
    if set(map(type, batch)) != {dict}:
        return None
    xs = [e for e in batch if e.get("ph") == "X"]
    n = len(xs)
    if not n:
        return [], np.zeros(0, np.int8), [], [], (np.zeros(0),) * 3, [(np.zeros(0, np.int64), np.zeros(0, bool))] * 10
    try:
        names, ts, dur, cats, pids, tids, args = zip(
            *[
                (e["name"], e["ts"], e["dur"], e.get("cat"), e.get("pid", ""), e.get("tid", ""), e.get("args"))
                for e in xs
            ]
        )
    except KeyError:
        return None
    if (
        set(map(type, names)) != {str}
        or not set(map(type, ts)) <= _FLOAT_TYPES
        or not set(map(type, dur)) <= _FLOAT_TYPES
        or not set(map(type, pids)) <= _ID_TYPES
        or not set(map(type, tids)) <= _ID_TYPES
    ):
        return None
    try:
        ts_a = np.array(ts, dtype=np.float64)
        dur_a = np.array(dur, dtype=np.float64)
        kinds = np.fromiter(map(_CAT_CODE.get, cats, repeat(_OTHER)), np.int8, n)
    except (OverflowError, TypeError):  # an int too big for a float; an unhashable cat
        return None
    if not (np.isfinite(ts_a).all() and np.isfinite(dur_a).all()):
        return None
    if set(map(type, args)) != {dict}:
        args = [a if type(a) is dict else _EMPTY for a in args]
    nbytes, grid, block, *id_values = zip(
        *[
            (
                a.get("bytes"),
                a.get("grid"),
                a.get("block"),
                a.get("stream"),
                a.get("device"),
                a.get("correlation"),
                a.get("External id"),
            )
            for a in args
        ]
    )
    types = set(map(type, nbytes))
    if not types <= _BYTES_TYPES or float in types and not all(map(math.isfinite, filter(_is_float, nbytes))):
        return None
    try:
        bytes_a = np.array(nbytes, dtype=np.float64)  # None -> NaN
    except OverflowError:
        return None
    ints = []
    for dims in (grid, block):
        values = np.zeros((n, 3), np.int64)
        mask = np.ones(n, np.bool_)
        if dims.count(None) < n:
            good = []
            for i in compress(range(n), map(is_not, dims, repeat(None))):
                d = dims[i]
                if type(d) is list and len(d) == 3 and type(d[0]) is int and type(d[1]) is int and type(d[2]) is int:
                    good.append(i)
                elif type(d) is list and any(type(v) is float and not math.isfinite(v) for v in d):
                    return None
            if good:
                try:
                    values[good] = [dims[i] for i in good]
                except OverflowError:
                    return None
                mask[good] = False
        ints += [(values[:, k].copy(), mask) for k in range(3)]
    for values in id_values:
        got = _ints(values, n)
        if got is None:
            return None
        ints.append(got)
    return names, kinds, pids, tids, (ts_a, dur_a, bytes_a), ints


def _is_float(v: object) -> bool:
    return type(v) is float


def _careful(path: str | Path, first: int, batch: list):
    """`_fast`'s columns one event at a time, with the exact rules of read_kineto's docstring; raises
    TraceReadError for the first event with a problem."""
    names, kinds, pids, tids = [], [], [], []
    floats: tuple[list, list, list] = ([], [], [])
    ints: list[tuple[list, list]] = [([], []) for _ in _INT_COLUMNS]
    for i, ev in enumerate(batch, start=first):
        if type(ev) is not dict:
            raise TraceReadError(path, f"traceEvents[{i}] is not a JSON object")
        if ev.get("ph") != "X":
            continue
        problem = _append(ev, names, kinds, pids, tids, floats, ints)
        if problem:
            raise TraceReadError(path, f"traceEvents[{i}] (ph 'X'): {problem}")
    return (
        names,
        np.array(kinds, dtype=np.int8),
        pids,
        tids,
        tuple(np.array(f, dtype=np.float64) for f in floats),
        [(np.array(v, dtype=np.int64), np.array(m, dtype=np.bool_)) for v, m in ints],
    )


def _short(v: object, limit: int = 60) -> str:
    """repr(v), cut to `limit` characters (a 400-digit number in a message helps nobody)."""
    text = repr(v) if not isinstance(v, int) or v.bit_length() < 200 else f"{str(v)[:20]}... ({len(str(v))} digits)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _finite(v: object) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too big for a float
        return False


def _append(ev: dict, names, kinds, pids, tids, floats, ints) -> str | None:
    """Append one "X" event's schema values; return the problem instead when it has one."""
    for field in ("name", "ts", "dur"):
        if field not in ev:
            return f"missing field {field!r}"
        if field != "name":
            v = ev[field]
            if type(v) not in _NUMBER:
                return f"field {field!r} is not a number: {_short(v)}"
            if not _finite(v):
                return f"field {field!r} is not a finite number: {_short(v)}"
    args = ev.get("args")
    if type(args) is not dict:
        args = _EMPTY
    nbytes = args.get("bytes")
    if type(nbytes) in _NUMBER and not _finite(nbytes):
        return f"args['bytes'] is not a finite number: {_short(nbytes)}"
    row_ints = []
    for prefix in ("grid", "block"):
        dims = args.get(prefix)
        if type(dims) is list and any(type(d) is float and not math.isfinite(d) for d in dims):
            return f"args[{prefix!r}] holds a value that is not a finite number: {_short(dims)}"
        if not (type(dims) is list and len(dims) == 3 and all(type(d) is int for d in dims)):
            dims = (None, None, None)
        for axis, d in zip("xyz", dims):
            row_ints.append((f"args[{prefix!r}][{'xyz'.index(axis)}]", d))
    for key in _ARG_KEYS:
        v = args.get(key)
        if type(v) is float and not math.isfinite(v):
            return f"args[{key!r}] is not a finite number: {v!r}"
        row_ints.append((f"args[{key!r}]", v if type(v) is int else None))
    for what, v in row_ints:
        if v is not None and not -_INT64_MAX - 1 <= v <= _INT64_MAX:
            return f"{what} = {_short(v)} is outside the int64 range"
    name = ev["name"]
    names.append(name if type(name) is str else str(name))
    cat = ev.get("cat")
    kinds.append(_CAT_CODE.get(cat, _OTHER) if type(cat) is str else _OTHER)
    floats[0].append(float(ev["ts"]))
    floats[1].append(float(ev["dur"]))
    floats[2].append(float(nbytes) if type(nbytes) in _NUMBER else float("nan"))
    for (values, mask), (_, v) in zip(ints, row_ints):
        values.append(0 if v is None else v)
        mask.append(v is None)
    pids.append(str(ev.get("pid", "")))
    tids.append(str(ev.get("tid", "")))
    return None
