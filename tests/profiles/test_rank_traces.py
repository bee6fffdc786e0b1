"""profiles/rank_traces.py and `hotloop inspect FOLDER`: rank traces found under a folder, per-rank counts and their
spread (against counts made per file), names and metadata of a written rank trace, clear errors."""

import argparse
import gzip
import json
import shutil

import pytest
import torch

from hotloop.guards.commands.inspect import add_parser as add_inspect_parser
from hotloop.guards.commands.inspect import run as run_inspect
from hotloop.profiles.inspect_cmd import count_trace
from hotloop.profiles.rank_traces import find_rank_traces, rank_spread, rank_trace_name, write_rank_trace
from lab.trace_synth import write_trace


def inspect(*argv):
    parser = argparse.ArgumentParser(prog="hotloop")
    add_inspect_parser(parser.add_subparsers(dest="command", required=True))
    return run_inspect(parser.parse_args(["inspect", *argv]))


@pytest.fixture
def run_folder(tmp_path):
    """A run folder as `hotloop train --nproc 2` lays it out: rank 0's trace at the top, rank 1's in rank1/; two
    synthetic traces of different sizes (their counts differ)."""
    write_trace(tmp_path / "trace_rank0.json.gz", 3000, seed=0)
    (tmp_path / "rank1").mkdir()
    write_trace(tmp_path / "rank1" / "trace_rank1.json.gz", 4000, seed=1)
    (tmp_path / "epochs.csv").write_text("epoch\n1\n")  # other files of the folder are not traces
    return tmp_path


def test_inspect_folder_prints_per_rank_counts_and_their_spread(run_folder, capsys):
    t0 = count_trace(run_folder / "trace_rank0.json.gz").totals
    t1 = count_trace(run_folder / "rank1" / "trace_rank1.json.gz").totals
    assert t0["kernels"] != t1["kernels"]
    assert inspect(str(run_folder)) == 0
    out = capsys.readouterr().out
    files, ranks = out.split(f"== ranks of {run_folder} (2 of 2 rank traces read")
    assert f"== {run_folder / 'trace_rank0.json.gz'}" in files and f"== {run_folder / 'rank1'}" in files
    row = next(line.split() for line in ranks.splitlines() if line.split()[:1] == ["kernels"])
    lo, hi = sorted((t0["kernels"], t1["kernels"]))
    assert [float(x) for x in row[1:6]] == [t0["kernels"], t1["kernels"], lo, hi, hi - lo]


def test_inspect_folder_json_has_the_ranks_table(run_folder, capsys):
    assert inspect("--json", str(run_folder)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["files"]) == 2 and "errors" not in doc
    rows = {r["count"]: r for r in doc["ranks"][str(run_folder)]}
    k = rows["kernels"]
    assert k["spread"] == abs(k["rank0"] - k["rank1"]) and k["min"] <= k["max"]


def test_a_gate_nproc_folder_is_read_as_its_ranks(tmp_path, capsys):
    # `hotloop gate --nproc 2` keeps each rank's window as trace.json.gz: rank 0 at the top, rank 1 in rank1/
    write_trace(tmp_path / "trace.json.gz", 3000, seed=0)
    (tmp_path / "rank1").mkdir()
    write_trace(tmp_path / "rank1" / "trace.json.gz", 4000, seed=1)
    (tmp_path / "rank2").mkdir()  # a rank folder without a trace (a rank that failed early) is not a rank trace
    assert find_rank_traces(tmp_path) == {0: tmp_path / "trace.json.gz", 1: tmp_path / "rank1" / "trace.json.gz"}
    assert inspect(str(tmp_path)) == 0
    assert f"== ranks of {tmp_path} (2 of 2 rank traces read" in capsys.readouterr().out


def test_a_folder_without_rank_traces_is_its_error(tmp_path, capsys):
    write_trace(tmp_path / "trace.json.gz", 3000, seed=0)  # one process's trace, no rank<R>/: no ranks
    assert inspect(str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "no rank traces" in err and err.count(str(tmp_path)) == 1, err


def test_two_traces_of_one_rank_are_refused(run_folder):
    shutil.copy(run_folder / "trace_rank0.json.gz", run_folder / "rank1" / "trace_rank0.json")
    with pytest.raises(ValueError, match="two traces of rank 0"):
        find_rank_traces(run_folder)


def test_rank_spread_of_equal_ranks_is_zero_and_median_ratio():
    t = {"kernels": 10, "graph_launches": 0, "sync_calls": {"cudaStreamSynchronize": 2}}
    table = rank_spread({0: t, 1: t, 2: {**t, "kernels": 13}}).set_index("count")
    assert table.loc["kernels", "spread"] == 3 and table.loc["kernels", "max_over_median"] == pytest.approx(1.3)
    assert table.loc["sync_calls cudaStreamSynchronize", "spread"] == 0
    assert table["max_over_median"].isna()["graph_launches"]  # median 0: no ratio
    with pytest.raises(ValueError, match="no ranks"):
        rank_spread({})


def test_write_rank_trace_names_the_rank_in_file_and_metadata(tmp_path):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(4).add_(1)
    path = write_rank_trace(prof, tmp_path / rank_trace_name(1), rank=1, world_size=2, backend="gloo")
    assert path.name == "trace_rank1.json.gz"
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    assert trace["distributedInfo"] == {"backend": "gloo", "rank": 1, "world_size": 2}
    assert trace["traceEvents"]
    assert find_rank_traces(tmp_path) == {1: path}
    with pytest.raises(ValueError, match="outside"):
        write_rank_trace(prof, tmp_path / "x.json.gz", rank=2, world_size=2, backend="gloo")
    with pytest.raises(ValueError, match="rank must be"):
        rank_trace_name(-1)
