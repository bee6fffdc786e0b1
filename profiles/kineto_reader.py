"""Read a torch.profiler (Kineto) Chrome-trace JSON file into the event schema of `hotloop.profiles.trace_schema`.

Source: the Kineto trace format (Chrome Trace Event Format, JSON Object Format: `{"traceEvents": [...], ...}`);
HTA `hta/common/trace_parser.py` for the parse-then-analyse split. Only complete events (`"ph": "X"`) are kept,
as the expected counts in tests/data/traces/README.md were made; flow (`s`/`f`), metadata (`M`) and instant (`i`)
events are skipped.

Memory: the decompressed text is held in memory (at most `max_json_bytes`, default 512 MiB; a larger file is a
TraceReadError naming the limit, not an out-of-memory kill), but events are decoded one at a time and only the
schema's columns are kept, so no list of all event dicts is ever built. Peak memory is about 2-3x the
decompressed JSON size. (ijson is not a dependency; this stdlib decoder is the only path.)
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from hotloop.profiles.trace_schema import TraceReadError, TraceReadWarning, event_frame

DEFAULT_MAX_JSON_BYTES = 512 * 2**20
_CHUNK = 2**20
CATEGORY_KINDS = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_runtime": "runtime",
    "cuda_driver": "driver", "gpu_user_annotation": "annotation", "cpu_op": "cpu_op",
    "user_annotation": "user_annotation",
}
_COPY_KIND = re.compile(r"Memcpy (\w+)")
_WS = re.compile(r"[ \t\n\r]*")
_STRICT = json.JSONDecoder()
_LENIENT = json.JSONDecoder(strict=False)


def read_kineto(path: str | Path, *, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> pd.DataFrame:
    """The complete ("ph": "X") events of a Kineto trace as a DataFrame in the `hotloop.profiles.trace_schema` schema.

    `path`: a .json file, plain or gzip-compressed (detected by its magic bytes, whatever the suffix:
    .json, .json.gz, .pt.trace.json, ...). Category -> kind: kernel, gpu_memcpy -> memcpy, gpu_memset -> memset,
    cuda_runtime -> runtime, cuda_driver -> driver, gpu_user_annotation -> annotation, cpu_op, user_annotation;
    any other category (cuda_sync, overhead, python_function, Trace, ...) -> other. `ts`/`dur` are already
    microseconds. Kernel grid/block come from `args.grid`/`args.block`; bytes, stream, device, correlation and
    External id from `args`; copy_kind from the memcpy name ("Memcpy DtoD (Device -> Device)" -> "DtoD").

    Raw control characters inside JSON strings (invalid in strict JSON) are read leniently, as the characters
    themselves (`json` with strict=False; the meaning is unambiguous), with a TraceReadWarning saying so.

    Raises TraceReadError (a ValueError) naming the file for: a missing/unreadable file, a corrupt or truncated
    gzip stream, text that is not UTF-8, decompressed text over `max_json_bytes`, text that is not one JSON
    object, invalid JSON (with line and column), an object without a "traceEvents" list, or an event that is not
    an object, or an "X" event that lacks name/ts/dur or has a non-numeric ts/dur.
    """
    text = _read_text(Path(path), max_json_bytes)
    lenient: list[int] = []
    try:
        frame = _frame(path, _trace_events(path, text, lenient))
    except json.JSONDecodeError as exc:
        raise TraceReadError(path, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if lenient:
        warnings.warn(f"{path}: {len(lenient)} JSON value(s) hold raw control characters inside strings "
                      f"(first at line {lenient[0]}); read leniently, taking the characters as written",
                      TraceReadWarning, stacklevel=2)
    return frame


def _read_text(path: Path, max_json_bytes: int) -> str:
    data = bytearray()
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if gz else raw
            while len(data) <= max_json_bytes and (chunk := stream.read(_CHUNK)):
                data += chunk
    except EOFError:
        raise TraceReadError(path, "truncated gzip file (compressed stream ends early)") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise TraceReadError(path, f"corrupt gzip file ({exc})") from None
    except OSError as exc:
        raise TraceReadError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > max_json_bytes:
        raise TraceReadError(path, f"JSON larger than max_json_bytes={max_json_bytes} bytes; pass a larger limit "
                                   "if the machine has the memory (about 3x the JSON size)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceReadError(path, f"not UTF-8 text (byte {exc.start}): not a Kineto JSON trace") from None


def _trace_events(path: str | Path, text: str, lenient: list[int]) -> Iterator[tuple[int, object]]:
    """Yield (index, event) of the top-level "traceEvents" array, decoding one value at a time.

    Raises json.JSONDecodeError for invalid JSON, TraceReadError when there is no "traceEvents" list.
    """
    pos = 0

    def skip(expected: str | None = None) -> str:
        nonlocal pos
        pos = _WS.match(text, pos).end()
        if pos >= len(text):
            raise json.JSONDecodeError("unexpected end of data", text, pos)
        ch = text[pos]
        if expected is not None:
            if ch not in expected:
                raise json.JSONDecodeError(f"expecting {' or '.join(map(repr, expected))}", text, pos)
            pos += 1
        return ch

    def value() -> object:
        nonlocal pos
        skip()
        try:
            obj, pos = _STRICT.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            if not exc.msg.startswith("Invalid control character"):
                raise
            obj, pos = _LENIENT.raw_decode(text, pos)
            lenient.append(exc.lineno)
        return obj

    def items(close: str) -> Iterator[None]:
        """After an opening bracket: yield once per comma-separated item, consuming the closing bracket."""
        nonlocal pos
        if skip() == close:
            pos += 1
            return
        while True:
            yield
            if skip("," + close) == close:
                return

    if skip() != "{":
        raise TraceReadError(path, "does not start with '{': a Kineto (torch.profiler) trace is one JSON object "
                                   '{"traceEvents": [...], ...}')
    pos += 1
    found = False
    for _ in items("}"):
        key = value()
        if not isinstance(key, str):
            raise json.JSONDecodeError("expecting a property name in double quotes", text, pos)
        skip(":")
        if key == "traceEvents" and skip() == "[":
            found = True
            pos += 1
            for i, _ in enumerate(items("]")):
                yield i, value()
        else:
            value()
    if _WS.match(text, pos).end() != len(text):
        raise json.JSONDecodeError("extra data after the top-level object", text, pos)
    if not found:
        raise TraceReadError(path, 'no "traceEvents" list at the top level: not a Kineto (torch.profiler) '
                                   "Chrome-trace JSON object")


def _frame(path: str | Path, events: Iterator[tuple[int, object]]) -> pd.DataFrame:
    cols: dict[str, list] = {c: [] for c in _ARG_COLUMNS + (
        "name", "kind", "start_us", "dur_us", "bytes", "copy_kind", "grid_x", "grid_y", "grid_z", "block_x",
        "block_y", "block_z", "pid", "tid")}
    for i, ev in events:
        if type(ev) is not dict:
            raise TraceReadError(path, f"traceEvents[{i}] is not a JSON object")
        if ev.get("ph") == "X":
            problem = _append(cols, ev)
            if problem:
                raise TraceReadError(path, f"traceEvents[{i}] (ph 'X'): {problem}")
    return event_frame(cols)


_ARG_COLUMNS = ("stream", "device", "correlation", "external_id")
_ARG_KEYS = ("stream", "device", "correlation", "External id")
_NUMBER = (int, float)
_NO_DIM3 = (None, None, None)


def _append(cols: dict[str, list], ev: dict) -> str | None:
    """Append one "X" event's schema values to `cols`; return the problem instead if it lacks name/ts/dur."""
    for field in ("name", "ts", "dur"):
        if field not in ev:
            return f"missing field {field!r}"
        if field != "name" and type(ev[field]) not in _NUMBER:
            return f"field {field!r} is not a number: {ev[field]!r}"
    args = ev.get("args")
    if type(args) is not dict:
        args = {}
    name = str(ev["name"])
    kind = CATEGORY_KINDS.get(ev.get("cat"), "other")
    copy = _COPY_KIND.match(name) if kind == "memcpy" else None
    nbytes = args.get("bytes")
    cols["name"].append(name)
    cols["kind"].append(kind)
    cols["start_us"].append(float(ev["ts"]))
    cols["dur_us"].append(float(ev["dur"]))
    cols["bytes"].append(float(nbytes) if type(nbytes) in _NUMBER else float("nan"))
    cols["copy_kind"].append(copy.group(1) if copy else "")
    for prefix in ("grid", "block"):
        dims = args.get(prefix)
        if not (type(dims) is list and len(dims) == 3 and all(type(d) is int for d in dims)):
            dims = _NO_DIM3
        for axis, d in zip("xyz", dims):
            cols[f"{prefix}_{axis}"].append(d)
    for col, key in zip(_ARG_COLUMNS, _ARG_KEYS):
        v = args.get(key)
        cols[col].append(v if type(v) is int else None)
    cols["pid"].append(str(ev.get("pid", "")))
    cols["tid"].append(str(ev.get("tid", "")))
    return None
