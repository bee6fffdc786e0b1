"""`hotloop inspect`: tables and --json per trace file, format told by the header, exit 2 naming an unreadable
file while the others are still reported. The parser is built here the way guards/cli.py wires it."""

import argparse
import json
import shutil
from pathlib import Path

import pytest

from hotloop.profiles.inspect_cmd import add_inspect_parser, read_trace, run_inspect

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
        "cudaDeviceSynchronize": 5}
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
        files = json.loads(captured.out)["files"]
        assert files[missing]["totals"] is None and "No such file" in files[missing]["error"]
        assert files[PROBE]["totals"]["kernels"] == 17
    else:
        assert f"== {PROBE}" in captured.out and missing not in captured.out


def test_format_is_told_by_the_header_not_the_suffix(tmp_path):
    misnamed = tmp_path / "really_sqlite.json"
    shutil.copy(NSYS, misnamed)
    assert (read_trace(misnamed)["domain"] == "hotloop").sum() == 5


def test_a_step_range_that_matches_nothing_is_said(capsys):
    from hotloop.guards.cli import main

    from pathlib import Path

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
