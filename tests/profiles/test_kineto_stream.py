"""The streaming Kineto reader (hotloop.profiles.kineto_reader) and the synthetic trace generator
(lab.trace_synth): no size cap, the same frames whatever the window/batch sizes, bounded memory for
iter_kineto, every malformed input of issue 22 a TraceReadError naming the file (each case failed on the
pre-streaming reader: a RecursionError, a ValueError, a silent NaN, a BOM refused), and the generator's output
read with the counts of a plain json.load-based reference."""

import gc
import gzip
import inspect
import json
import math
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

import hotloop.profiles.kineto_reader as kr
from hotloop.profiles.kineto_reader import CATEGORY_KINDS, iter_kineto, read_kineto
from hotloop.profiles.trace_counts import count_totals
from hotloop.profiles.trace_schema import COLUMNS, TraceReadError, TraceReadWarning, event_frame
from lab.trace_synth import write_trace

TRACES = Path(__file__).parents[1] / "data" / "traces"
KINETO_FILES = sorted(TRACES.glob("**/*.json.gz"))
DEEP = 100_000


def _event(ts="1", dur="2", grid="[1, 1, 1]", corr="5", x="0"):
    return (
        '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": %s, "dur": %s, '
        '"args": {"grid": %s, "block": [32, 1, 1], "correlation": %s, "x": %s}}' % (ts, dur, grid, corr, x)
    )


def _trace_text(extra="", **fields):
    return '{"schemaVersion": 1, ' + extra + '"traceEvents": [' + _event() + ", " + _event(**fields) + "]}"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- no size cap ------------------------------------------------------------------------------------------------
def test_no_size_cap_by_default_and_an_opt_in_cap_names_itself(tmp_path):
    assert inspect.signature(read_kineto).parameters["max_json_bytes"].default is None
    path = _write(tmp_path, "t.json", _trace_text())
    assert len(read_kineto(path)) == 2
    with pytest.raises(TraceReadError, match=r"t\.json: JSON larger than max_json_bytes=100 bytes") as exc:
        read_kineto(path, max_json_bytes=100)
    assert "pass a larger limit" not in str(exc.value)
    with pytest.raises(ValueError, match="max_json_bytes must be None or an int >= 1"):
        read_kineto(path, max_json_bytes=0)


# -- the same frame however the text is cut -----------------------------------------------------------------------
@pytest.mark.parametrize("chunk,batch", [(1, 1), (7, 3), (1000, 50)])
@pytest.mark.parametrize("trace", KINETO_FILES, ids=lambda p: p.name)
def test_tiny_windows_and_batches_read_the_same_frame(monkeypatch, trace, chunk, batch):
    expected = read_kineto(trace)
    monkeypatch.setattr(kr, "_CHUNK", chunk)
    monkeypatch.setattr(kr, "_BATCH", batch)
    pd.testing.assert_frame_equal(read_kineto(trace), expected)


@pytest.mark.parametrize("trace", KINETO_FILES, ids=lambda p: p.name)
def test_iter_kineto_frames_concatenate_to_read_kineto(trace):
    expected = read_kineto(trace)
    frames = list(iter_kineto(trace, batch_events=1000))
    assert all(list(f.columns) == list(COLUMNS) and f["start_us"].is_monotonic_increasing for f in frames)
    joined = pd.concat(frames, ignore_index=True).sort_values("start_us", kind="stable", ignore_index=True)
    pd.testing.assert_frame_equal(joined, expected)


def test_kinds_keeps_only_those_kinds():
    trace = TRACES / "kineto-public" / "nccl_parser_config_nccl_data.json.gz"
    full = read_kineto(trace)
    gpu = read_kineto(trace, kinds=("kernel", "memcpy", "memset", "runtime"))
    expected = full[full["kind"].isin(["kernel", "memcpy", "memset", "runtime"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(gpu, expected)
    with pytest.raises(ValueError, match=r"kinds: \['kernels'\] not in the schema's KINDS"):
        read_kineto(trace, kinds=["kernels"])


def test_an_event_longer_than_the_window_and_a_raw_control_character_across_windows(tmp_path, monkeypatch):
    long_name = "aten::" + "x" * 5000
    events = [
        {"ph": "X", "cat": "cpu_op", "name": long_name, "pid": 1, "tid": 1, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "PLACEHOLDER", "pid": 1, "tid": 1, "ts": 3, "dur": 1},
    ]
    path = _write(tmp_path, "long.json", json.dumps({"traceEvents": events}).replace("PLACEHOLDER", "a\tb"))
    monkeypatch.setattr(kr, "_CHUNK", 64)
    with pytest.warns(TraceReadWarning, match=r"long\.json: 1 JSON value"):
        df = read_kineto(path)
    assert df["name"].tolist() == [long_name, "a\tb"]


def test_the_garbage_collector_is_paused_only_inside_the_reader(tmp_path):
    good = _write(tmp_path, "good.json", _trace_text())
    bad = _write(tmp_path, "bad.json", _trace_text(ts="NaN"))
    assert gc.isenabled()
    read_kineto(good)
    assert gc.isenabled()
    with pytest.raises(TraceReadError):
        read_kineto(bad)
    assert gc.isenabled()
    for _ in iter_kineto(good):
        assert gc.isenabled()  # the consumer's code between frames runs with the collector on
    gc.disable()
    try:
        read_kineto(good)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_a_problem_in_an_early_event_is_reported_before_invalid_json_later(tmp_path):
    text = '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, ' + '{"ph": "i"}, ' * 20000 + "oops]}"
    with pytest.raises(TraceReadError, match=r"traceEvents\[0\] \(ph 'X'\): missing field 'dur'"):
        read_kineto(_write(tmp_path, "order.json", text))


# -- bounded memory -----------------------------------------------------------------------------------------------
def _traced_peak(path: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        rows = sum(len(f) for f in iter_kineto(path, batch_events=8192))
        return rows, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_iter_kineto_memory_does_not_grow_with_the_file(tmp_path):
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    write_trace(small, 20_000)
    size = write_trace(big, 100_000).json_bytes  # ~28 MB of JSON
    (rows_small, peak_small), (rows_big, peak_big) = _traced_peak(small), _traced_peak(big)
    assert rows_big > 4 * rows_small
    assert peak_big < 1.3 * peak_small + 2**20, f"{peak_small / 2**20:.1f} -> {peak_big / 2**20:.1f} MiB"
    assert peak_big < size / 2  # the pre-streaming reader held the whole text, and more


# -- malformed input: each a TraceReadError naming the file (the pre-streaming reader failed each one) ---------------
MALFORMED = {
    # nesting: RecursionError before
    "deep_args": (
        _trace_text(x="[" * DEEP + "]" * DEEP),
        r"traceEvents\[1\] at line 1 column \d+: JSON nested too "
        "deeply",
    ),
    "deep_objects": (_trace_text(x='{"a": ' * DEEP + "1" + "}" * DEEP), r"traceEvents\[1\] .*nested too deeply"),
    "deep_entry": ('{"traceEvents": [' + "[" * DEEP + "]" * DEEP + "]}", r"traceEvents\[0\] .*nested too deeply"),
    "deep_other_key": (
        _trace_text(extra='"deviceProperties": ' + "[" * DEEP + "]" * DEEP + ", "),
        r"the value of key 'deviceProperties' at line 1 column 42: JSON nested too deeply",
    ),
    # huge numbers: ValueError (int max str digits) / OverflowError before
    "5000_digit_arg": (
        _trace_text(x="7" * 5000),
        r"traceEvents\[1\]: a number at line 1 column \d+ has more digits "
        "than Python reads as an int",
    ),
    "5000_digit_ts": (_trace_text(ts="7" * 5000), r"traceEvents\[1\]: a number .* more digits"),
    "400_digit_ts": (
        _trace_text(ts="7" * 400),
        r"field 'ts' is not a finite number: 77777777777777777777\.\.\. "
        r"\(400 digits\)",
    ),
    "2**64_correlation": (
        _trace_text(corr=str(2**64)),
        r"args\['correlation'\] = 18446744073709551616 is outside "
        "the int64 range",
    ),
    "2**64_grid": (_trace_text(grid=f"[{2**64}, 1, 1]"), r"args\['grid'\]\[0\] = 18446744073709551616 is outside"),
    # NaN / Infinity in numeric fields: read silently as NaN / inf before
    "nan_ts": (_trace_text(ts="NaN"), r"traceEvents\[1\] \(ph 'X'\): field 'ts' is not a finite number: nan"),
    "inf_dur": (_trace_text(dur="Infinity"), r"field 'dur' is not a finite number: inf"),
    "-inf_ts": (_trace_text(ts="-Infinity"), r"field 'ts' is not a finite number: -inf"),
    "1e999_dur": (_trace_text(dur="1e999"), r"field 'dur' is not a finite number: inf"),
    "nan_grid": (
        _trace_text(grid="[NaN, 1, 1]"),
        r"args\['grid'\] holds a value that is not a finite number: "
        r"\[nan, 1, 1\]",
    ),
    "inf_grid": (_trace_text(grid="[1, Infinity, 1]"), r"args\['grid'\] holds .*\[1, inf, 1\]"),
    "nan_correlation": (_trace_text(corr="NaN"), r"args\['correlation'\] is not a finite number: nan"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_malformed_input_is_a_trace_read_error_naming_the_file(tmp_path, case, gz):
    text, match = MALFORMED[case]
    path = tmp_path / f"{case}.json{'.gz' * gz}"
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    with pytest.raises(TraceReadError, match=match) as exc:
        read_kineto(path)
    assert str(exc.value).startswith(f"{path}: ")
    with pytest.raises(TraceReadError, match=match):  # the streaming iterator says the same
        list(iter_kineto(path))


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_utf8_byte_order_mark_is_read_as_nothing(tmp_path, gz):
    data = "\ufeff".encode() + _trace_text().encode()
    path = tmp_path / f"bom.json{'.gz' * gz}"
    path.write_bytes(gzip.compress(data) if gz else data)
    df = read_kineto(path)
    assert len(df) == 2 and df["grid_x"].tolist() == [1, 1]


def test_moderate_nesting_and_odd_but_finite_values_still_read(tmp_path):
    text = _trace_text(x="[" * 500 + "]" * 500, ts="-5", dur="0", grid="[1.0, 1, 1]", corr="7.5")
    df = read_kineto(_write(tmp_path, "ok.json", text))
    assert df["start_us"].tolist() == [-5.0, 1.0] and df["dur_us"].tolist() == [0.0, 2.0]  # kept as they are
    assert pd.isna(df.loc[0, "grid_x"]) and pd.isna(df.loc[0, "correlation"])  # not ints: NA, as before


# -- the generator ------------------------------------------------------------------------------------------------
def _reference_frame(path: Path) -> pd.DataFrame:
    """The schema frame built from a plain json.load of the file, field by field (the rules of read_kineto's
    docstring), without any of the streaming reader's code."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    cols: dict[str, list] = {c: [] for c in COLUMNS if c != "domain"}
    for ev in events:
        if ev.get("ph") != "X":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        kind = CATEGORY_KINDS.get(ev.get("cat"), "other")
        cols["name"].append(str(ev["name"]))
        cols["kind"].append(kind)
        cols["start_us"].append(float(ev["ts"]))
        cols["dur_us"].append(float(ev["dur"]))
        b = args.get("bytes")
        cols["bytes"].append(float(b) if type(b) in (int, float) else math.nan)
        cols["copy_kind"].append(ev["name"].split()[1] if kind == "memcpy" else "")
        for prefix in ("grid", "block"):
            dims = args.get(prefix)
            ok = type(dims) is list and len(dims) == 3 and all(type(d) is int for d in dims)
            for axis, d in zip("xyz", dims if ok else (None,) * 3):
                cols[f"{prefix}_{axis}"].append(d)
        for col, key in (
            ("stream", "stream"),
            ("device", "device"),
            ("correlation", "correlation"),
            ("external_id", "External id"),
        ):
            cols[col].append(args.get(key) if type(args.get(key)) is int else None)
        cols["pid"].append(str(ev.get("pid", "")))
        cols["tid"].append(str(ev.get("tid", "")))
    return event_frame(cols)


@pytest.mark.parametrize("name", ["synth.json", "synth.json.gz"])
def test_generated_trace_reads_as_the_json_load_reference_with_the_generators_counts(tmp_path, name):
    summary = write_trace(tmp_path / name, 30_000, seed=3)
    path = Path(summary.path)
    assert summary.events == 30_000
    df = read_kineto(path)
    pd.testing.assert_frame_equal(df, _reference_frame(path))
    t = count_totals(df)
    assert (
        t["kernels"],
        t["kernels_grid1"],
        t["memcpy_dtod_events"],
        t["memset_events"],
        t["graph_launches"],
        t["kernels_in_graphs"],
    ) == (
        summary.kernels,
        summary.kernels_grid1,
        summary.memcpy_dtod_events,
        summary.memset_events,
        summary.graph_launches,
        summary.kernels_in_graphs,
    )
    assert t["sync_calls"] == summary.sync_calls
    assert len(df) == sum(n for key, n in summary.by_ph_cat.items() if key.startswith("X/"))
    kinds = df["kind"].value_counts()
    assert kinds["other"] > kinds["kernel"] and kinds["cpu_op"] > kinds["kernel"]  # dominated by CPU-side events
    assert (df["dur_us"] == 0).any()  # Kineto writes zero-length events; the reader keeps them


LAB_PARENT = Path(__file__).resolve().parents[2] / "results"
"""The folder `python -m lab.trace_synth` runs from (the lab code, results/lab/, is not installed)."""


def test_generator_cli_writes_exactly_n_events_and_prints_its_summary(tmp_path):
    out = tmp_path / "cli.json.gz"
    proc = subprocess.run(
        [sys.executable, "-m", "lab.trace_synth", "--events", "1234", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        cwd=LAB_PARENT,
    )
    summary = json.loads(proc.stdout)
    with gzip.open(out, "rt") as f:
        doc = json.load(f)
    assert summary["events"] == len(doc["traceEvents"]) == 1234
    bad = subprocess.run(
        [sys.executable, "-m", "lab.trace_synth", "--events", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=LAB_PARENT,
    )
    assert bad.returncode == 2 and "events must be an int >= 1" in bad.stderr
