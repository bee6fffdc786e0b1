"""`hotloop inspect`: tables and --json per trace file, format told by the header, exit 2 naming an unreadable
file while the others are still reported (any exception of one file is its error; --json stays one JSON document
with the errors in it), the trace-anomalies line, and a quiet exit 141 when stdout is closed early. The parser is
built here the way hotloop.guards.commands.main wires it."""

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hotloop.guards.commands.inspect import add_parser as add_inspect_parser
from hotloop.guards.commands.inspect import run as run_inspect
from hotloop.profiles.inspect_cmd import read_trace

TRACES = Path(__file__).parents[1] / "data" / "traces"
NSYS = str(TRACES / "h200" / "nsys_matmul_nvtx.sqlite")
PROBE = str(TRACES / "h200" / "probe_eager_graph_twostream.json.gz")


def inspect(*argv):
    parser = argparse.ArgumentParser(prog="hotloop")
    add_inspect_parser(parser.add_subparsers(dest="command", required=True))
    return run_inspect(parser.parse_args(["inspect", *argv]))


@pytest.mark.smoke
def test_tables_per_file_and_a_step_table_only_where_steps_exist(capsys):
    assert inspect(PROBE, NSYS) == 0
    out = capsys.readouterr().out
    probe, nsys = out.split(f"== {NSYS}")
    assert probe.startswith(f"== {PROBE}") and "per step" not in probe
    assert "kernels_in_graphs       7" in probe and "sync_calls cudaDeviceSynchronize       5" in probe
    assert "per step (5 step ranges" in nsys and "cudaDeviceSynchronize_calls" in nsys


def test_json_report(capsys):
    assert inspect("--json", PROBE, NSYS) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert files[PROBE]["steps"] is None
    assert files[PROBE]["totals"]["kernels"] == 17 and files[PROBE]["totals"]["sync_calls"] == {
        "cudaDeviceSynchronize": 5
    }
    steps = files[NSYS]["steps"]
    assert [s["kernels"] for s in steps] == [2] * 5 and [s["memset_events"] for s in steps] == [1] * 5
    assert files[NSYS]["totals"]["kernels"] == 11


@pytest.mark.parametrize("as_json", [False, True])
def test_unreadable_file_exits_2_naming_it_and_the_others_are_still_reported(tmp_path, capsys, as_json):
    missing = str(tmp_path / "missing.json.gz")
    assert inspect(*(["--json"] if as_json else []), missing, PROBE) == 2
    captured = capsys.readouterr()
    assert f"hotloop inspect: error: {missing}: cannot read: No such file" in captured.err
    if as_json:
        doc = json.loads(captured.out)
        assert list(doc["files"]) == [PROBE] and "No such file" in doc["errors"][missing]
        assert doc["files"][PROBE]["totals"]["kernels"] == 17
    else:
        assert f"== {PROBE}" in captured.out and missing not in captured.out


def test_format_is_told_by_the_header_not_the_suffix(tmp_path):
    misnamed = tmp_path / "really_sqlite.json"
    shutil.copy(NSYS, misnamed)
    assert (read_trace(misnamed)["domain"] == "hotloop").sum() == 5


def test_a_step_range_that_matches_nothing_is_said(capsys):
    from pathlib import Path

    from hotloop.guards.cli import main

    trace = Path(__file__).parents[1] / "data" / "traces" / "h200" / "nsys_matmul_nvtx.sqlite"
    assert main(["inspect", "--step-range", "nosuch", str(trace)]) == 0
    captured = capsys.readouterr()
    assert "no step ranges named 'nosuch': totals only" in captured.err and "per step" not in captured.out


def test_a_sqlite_named_file_without_a_sqlite_header_is_named_as_such(tmp_path, capsys):
    from hotloop.guards.cli import main

    bad = tmp_path / "report.sqlite"
    bad.write_bytes(b"")
    assert main(["inspect", str(bad)]) == 2
    assert "named like an Nsight SQLite export but has no SQLite header" in capsys.readouterr().err


def _bad_files(tmp_path):
    """empty.json (0 bytes), deep.json (arrays nested 100000 deep inside traceEvents: a RecursionError for a
    recursive JSON parser) and good.json.gz (the H200 probe, readable)."""
    empty, deep, good = tmp_path / "empty.json", tmp_path / "deep.json", tmp_path / "good.json.gz"
    empty.write_bytes(b"")
    deep.write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    shutil.copy(PROBE, good)
    return str(empty), str(deep), str(good)


@pytest.mark.parametrize("as_json", [False, True])
def test_one_bad_file_does_not_lose_the_others(tmp_path, capsys, as_json):
    """Issue 22 item 4: `inspect --json empty.json deep.json good.json.gz` printed nothing and exited 1 (the
    RecursionError of deep.json escaped). Now the good file is reported, both errors are listed, exit 2."""
    empty, deep, good = _bad_files(tmp_path)
    assert inspect(*(["--json"] if as_json else []), empty, deep, good) == 2
    captured = capsys.readouterr()
    assert f"hotloop inspect: error: {empty}: " in captured.err and f"hotloop inspect: error: {deep}: " in captured.err
    assert "Traceback" not in captured.err
    if as_json:
        doc = json.loads(captured.out)  # stdout is one valid JSON document
        assert list(doc["files"]) == [good] and doc["files"][good]["totals"]["kernels"] == 17
        assert sorted(doc["errors"]) == sorted([empty, deep]) and all(doc["errors"].values())
    else:
        assert captured.out.startswith(f"== {good} (78 events counted)") and empty not in captured.out


def test_any_exception_of_one_file_is_that_files_error(tmp_path, capsys, monkeypatch):
    import hotloop.profiles.inspect_cmd as inspect_cmd

    real = inspect_cmd.trace_frames

    def flaky(path):  # a failure in the middle of the stream, after a frame was counted
        if str(path).endswith("bad.json"):
            yield from real(PROBE)
            raise ValueError("a parser bug")
        yield from real(path)

    monkeypatch.setattr(inspect_cmd, "trace_frames", flaky)
    bad = str(tmp_path / "bad.json")
    assert inspect("--json", bad, PROBE) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == {bad: "cannot read: ValueError: a parser bug"} and list(doc["files"]) == [PROBE]


def test_good_files_alone_have_no_errors_key_and_a_clean_anomalies_line(capsys):
    assert inspect("--json", PROBE) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "errors" not in doc and doc["files"][PROBE]["totals"]["anomalies"]["events"] == 0
    assert inspect(PROBE) == 0
    assert "\ntrace anomalies: none\n" in capsys.readouterr().out


def _kineto(path, events):
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, **e} for e in events]}))
    return str(path)


def test_trace_anomalies_line_and_counts_per_file(tmp_path, capsys):
    """A kernel with ts 0 and dur 0 (Kineto's unset CUPTI timestamps) and a launch whose kernel is missing while
    later kernels were recorded: counted in the file's line and in --json, and the step holding them named."""
    t = 1_700_000_000_000.0
    trace = _kineto(
        tmp_path / "damaged.json",
        [
            dict(cat="user_annotation", name="ProfilerStep#1", ts=t, dur=100),
            dict(cat="cuda_runtime", name="cudaLaunchKernel", ts=t + 1, dur=2, args={"correlation": 10}),
            dict(cat="kernel", name="k0", ts=0, dur=0, pid=0, tid=7, args={"correlation": 10, "grid": [8, 1, 1]}),
            dict(cat="cuda_runtime", name="cudaLaunchKernel", ts=t + 5, dur=2, args={"correlation": 11}),  # no kernel
            dict(cat="user_annotation", name="ProfilerStep#2", ts=t + 200, dur=100),
            dict(cat="cuda_runtime", name="cudaLaunchKernel", ts=t + 201, dur=2, args={"correlation": 12}),
            dict(cat="kernel", name="k2", ts=t + 210, dur=3, pid=0, tid=7, args={"correlation": 12, "grid": [8, 1, 1]}),
        ],
    )
    assert inspect(trace) == 0
    out = capsys.readouterr().out
    assert "trace anomalies: 2 events: cudaLaunchKernel with no GPU event x1; kernel with ts 0, dur 0 x1" in out
    assert "steps with anomalies (1; their timing is not comparable): step 0: " in out
    assert inspect("--json", trace) == 0
    doc = json.loads(capsys.readouterr().out)["files"][trace]
    counts = doc["totals"]["anomalies"]["counts"]
    assert (counts["ts_not_positive"], counts["gpu_dur_zero"], counts["launch_without_gpu"]) == (1, 1, 1)
    assert doc["totals"]["kernels"] == 2  # the ts-0 kernel still counts
    assert [s["kernels"] for s in doc["steps"]] == [1, 1] and [s["anomalies"] for s in doc["steps"]] == [2, 0]


def test_a_closed_stdout_is_a_quiet_exit_141(tmp_path):
    """Issue 22 item 4: `hotloop inspect ... | head` raised BrokenPipeError with a traceback. The per-step table of
    5000 steps (~1 MB of text) is far more than a pipe buffer, so head -1 closes the pipe while inspect writes."""
    events = []
    for k in range(5000):
        t = 1_000 + 10 * k
        events.append(dict(cat="user_annotation", name=f"ProfilerStep#{k}", ts=t, dur=5))
        events.append(
            dict(cat="cuda_runtime", name="cudaStreamSynchronize", ts=t + 1, dur=1, args={"correlation": k + 1})
        )
    trace = _kineto(tmp_path / "many.json", events)
    hotloop = shutil.which("hotloop")
    assert hotloop, "the hotloop console script is installed with the package"
    for flags in ("", "--json"):
        res = subprocess.run(
            ["bash", "-c", f'set -o pipefail; "{hotloop}" inspect {flags} "{trace}" | head -1'],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Traceback" not in res.stderr and "BrokenPipeError" not in res.stderr, res.stderr
        assert res.stdout.strip() in (f"== {trace} (10000 events counted)", "{")
        assert res.returncode == 141


def test_a_table_printed_in_chunks_is_the_whole_tables_text():
    """`table_parts` (the per-step table a chunk of rows at a time, so that a 100k-step table is never formatted
    whole) joins to `format_table`'s text: widths, NaN, negative numbers, strings with spaces, all-NaN columns."""
    import numpy as np
    import pandas as pd

    from hotloop.profiles.epoch_table import format_table
    from hotloop.profiles.inspect_cmd import table_parts

    rng = np.random.default_rng(0)
    n = 600
    df = pd.DataFrame(
        {
            "step": np.arange(n),
            "range_name": pd.Series([f"ProfilerStep#{i}" if i % 7 else "a step" for i in range(n)], dtype="str"),
            "start_us": 1.7e15 + rng.random(n) * 1e9,
            "dur_us": np.where(rng.random(n) < 0.01, np.nan, rng.random(n) * 1e5),
            "kernels": rng.integers(0, 10 ** rng.integers(1, 7, n)),
            "delta": rng.integers(-50, 5, n),
            "small": rng.random(n) * 1e-6,
            "empty": np.nan,
        }
    )
    for chunk in (3, 7, 599, 600):
        assert "\n".join(table_parts(df, chunk)) == format_table(df), chunk
    assert "\n".join(table_parts(df.iloc[::-1], 64)) == format_table(df.iloc[::-1])  # the widest value last


def test_a_report_printed_in_chunks_is_the_whole_reports_text(tmp_path):
    from hotloop.profiles.inspect_cmd import count_trace, format_file, format_file_parts
    from lab.trace_synth import write_trace

    path = tmp_path / "synth.json"
    write_trace(path, 20_000)
    for trace in (path, TRACES / "kineto-public" / "trace_diff_test_test.json.gz", NSYS):
        counts = count_trace(trace, "step")
        whole = format_file(str(trace), counts.events, counts.totals, counts.steps)
        assert "".join(format_file_parts(str(trace), counts.events, counts.totals, counts.steps, chunk=4)) == whole
    assert len(counts.steps) == 5 and "per step (5 step ranges" in whole
