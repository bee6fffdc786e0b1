"""The trace-reader benchmark (lab.trace_read_bench) end to end on a tiny trace: one fresh process
per cell, peak RSS and CPU from that child's own rusage, the long-format CSV, and readers that cannot run given
as rows that say why."""

import csv

from lab.trace_read_bench import COLUMNS, main


def test_tiny_benchmark_writes_one_row_per_reader_with_a_reason_for_each_cell_not_run(tmp_path):
    out = tmp_path / "r.csv"
    rc = main(
        [
            "--sizes-gb",
            "0.002",
            "--readers",
            "json.load",
            "read_kineto",
            "iter_kineto",
            "ijson_columns",
            "--work-dir",
            str(tmp_path / "work"),
            "--csv",
            str(out),
        ]
    )
    assert rc == 0
    with open(out, newline="") as f:
        rows = {r["reader"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["json.load", "read_kineto", "iter_kineto", "ijson_columns"]
    assert set(rows["json.load"]) == set(COLUMNS)
    events = int(rows["json.load"]["events"])
    assert int(rows["json.load"]["rows"]) == events  # json.load: every entry
    assert rows["read_kineto"]["rows"] == rows["iter_kineto"]["rows"] and 0 < int(rows["read_kineto"]["rows"]) < events
    for reader in ("json.load", "read_kineto", "iter_kineto"):
        assert float(rows[reader]["peak_rss_mb"]) > 20 and float(rows[reader]["wall_s"]) >= 0
    assert rows["ijson_columns"]["note"].startswith("not run: no --hta-python")
    assert not list((tmp_path / "work").glob("*.json"))  # the trace is deleted after its size


def test_the_count_readers_on_an_existing_file_count_the_same_events_and_keep_the_file(tmp_path):
    from lab.trace_synth import write_trace

    trace = tmp_path / "given.json"
    summary = write_trace(trace, 5000)
    out = tmp_path / "r.csv"
    assert (
        main(
            [
                "--files",
                str(trace),
                "--readers",
                "inspect",
                "inspect_in_memory",
                "--work-dir",
                str(tmp_path / "work"),
                "--csv",
                str(out),
            ]
        )
        == 0
    )
    with open(out, newline="") as f:
        rows = {r["reader"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["inspect", "inspect_in_memory"] and trace.exists()
    assert rows["inspect"]["rows"] == rows["inspect_in_memory"]["rows"] and int(rows["inspect"]["rows"]) > 0
    assert int(rows["inspect"]["events"]) == summary.events and int(rows["inspect"]["json_bytes"]) == summary.json_bytes
    assert "trace_stream.py " in rows["inspect"]["note"] and float(rows["inspect"]["peak_rss_mb"]) > 20
