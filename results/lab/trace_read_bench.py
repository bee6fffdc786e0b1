"""Benchmark of Kineto trace readers: wall time, CPU time and peak RSS on synthetic traces of given sizes.

`PYTHONPATH=results python -m lab.trace_read_bench --sizes-gb 0.5 1.6 5 --work-dir /tmp/trace_read_bench
--csv results/cpu/trace_read_bench/results.csv [--hta-python PYTHON] [--gzip-sizes-gb 0.5] [--keep-files]
[--readers R ...] [--files TRACE ...]`

For each size it writes a trace with `lab.trace_synth` (the event count chosen from the bytes per
event of a sample, so the JSON text is about that many GB, 1 GB = 1e9 bytes), then runs every reader on it, each
in a fresh subprocess (`--child READER FILE`), one after the other; the parent takes the child's peak RSS and CPU
time from `os.wait4` (the child's own rusage: ru_maxrss, ru_utime + ru_stime) and the read's wall time from the
child (around the read only: interpreter start and imports left out). A cell whose estimated peak memory (the
reader's RSS per JSON byte measured at the previous size, or an upper guess before the first) would exceed 85% of
MemAvailable is not run; its row says so ("not run: would need ~N GB"). Each child also runs under an address
space limit of MemAvailable, so a wrong guess ends in a MemoryError row, not in the kernel's OOM killer.
Each row is appended to the CSV as soon as it is measured (long format: `COLUMNS`). The trace files are deleted
after their size is done unless --keep-files. `--files` measures existing traces instead (no sizes generated,
nothing deleted; `events` is then the traceEvents entries counted by a quick scan for `"ph"`).

Readers (`READERS`): json.load (the stdlib, the whole document as dicts); read_kineto and iter_kineto (this
repo's streaming reader: the whole schema frame / frames of 262,144 entries, counted and dropped);
read_kineto_pre_stream (the reader before streaming, `git show PRE_STREAM_COMMIT:profiles/kineto_reader.py`, run
with its 512 MiB cap lifted); ijson_columns (ijson's yajl2_c backend yielding the events, put into the same
schema columns as read_kineto: the library alternative to the hand-written scanner); hta_json and hta_ijson (HTA's
`parse_trace_dataframe`, its default JSON backend and its recommended IJSON_BATCH_AND_COMPRESS; HTA keeps its
own columns and, in the ijson mode, skips some event kinds). ijson and HTA run under `--hta-python` (a Python that
has HolisticTraceAnalysis and ijson installed, e.g. a venv made with --system-site-packages), else they are rows
saying that they could not run.

Count readers (`hotloop inspect`'s work, on the same footing): inspect (`inspect_cmd.count_trace`: iter_kineto
frames counted by `hotloop.profiles.trace_stream`, then the report text written to /dev/null) and
inspect_in_memory (what inspect did before: `read_trace`'s whole frame of the counted kinds, `count_totals` and
`count_per_step` over it, the per-step table formatted whole); their `rows` are the events counted.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

COUNT_MODULES = ("inspect_cmd", "trace_stream", "trace_counts", "trace_anomalies")
"""The modules of the count readers (inspect, inspect_in_memory) besides the reader: their sha256 go in the note."""
PRE_STREAM_COMMIT = "3f396fc"
"""The last commit whose profiles/kineto_reader.py read the whole text into memory (512 MiB cap)."""
READERS = (
    "json.load",
    "read_kineto",
    "iter_kineto",
    "read_kineto_pre_stream",
    "ijson_columns",
    "hta_json",
    "hta_ijson",
    "inspect",
    "inspect_in_memory",
)
COLUMNS = (
    "reader",
    "file",
    "file_gb",
    "json_bytes",
    "events",
    "rows",
    "wall_s",
    "cpu_s",
    "mb_per_s",
    "peak_rss_mb",
    "rss_per_json_byte",
    "load1",
    "commit",
    "reader_sha",
    "date",
    "note",
)
EXTERNAL = {"ijson_columns", "hta_json", "hta_ijson"}
# Peak RSS per JSON byte assumed before a reader was measured on this machine (upper guesses: json.load 4.4x in
# issue 22, HTA's pandas frame of all fields more).
_GUESS = {
    "json.load": 5.0,
    "read_kineto_pre_stream": 5.0,
    "hta_json": 8.0,
    "hta_ijson": 6.0,
    "ijson_columns": 1.0,
    "read_kineto": 1.0,
    "iter_kineto": 0.5,
    "inspect": 0.5,
    "inspect_in_memory": 1.0,
}
_ROOT = Path(__file__).resolve().parents[2]  # the checkout (this file: results/lab/)


# -- children -----------------------------------------------------------------------------------------------------
def _child(reader: str, path: str) -> dict:
    """Run one reader on `path`; returns {"rows": ..., "wall_s": ...} (rows: what the reader returns)."""
    if reader == "json.load":
        import gzip

        t0 = time.perf_counter()
        with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
            doc = json.load(f)
        wall = time.perf_counter() - t0
        return {"rows": len(doc["traceEvents"]), "wall_s": wall}
    if reader == "read_kineto":
        from hotloop.profiles.kineto_reader import read_kineto

        t0 = time.perf_counter()
        df = read_kineto(path)
        return {"rows": len(df), "wall_s": time.perf_counter() - t0}
    if reader == "iter_kineto":
        from hotloop.profiles.kineto_reader import iter_kineto

        t0 = time.perf_counter()
        rows = 0
        kinds: dict[str, int] = {}
        for frame in iter_kineto(path):
            rows += len(frame)
            for kind, n in frame["kind"].value_counts().items():
                kinds[kind] = kinds.get(kind, 0) + int(n)
        return {"rows": rows, "wall_s": time.perf_counter() - t0}
    if reader in ("inspect", "inspect_in_memory"):
        from hotloop.profiles.inspect_cmd import count_trace, format_file_parts, read_trace
        from hotloop.profiles.trace_counts import count_per_step, count_totals

        t0 = time.perf_counter()
        if reader == "inspect":
            counts = count_trace(path)
            events, totals, steps, chunk = counts.events, counts.totals, counts.steps, None
        else:
            df = read_trace(path)
            steps, totals, events = count_per_step(df), count_totals(df), len(df)
            chunk = len(steps) + 1  # the whole table at once, as format_file printed it before
        with open(os.devnull, "w") as out:
            for part in format_file_parts(path, events, totals, steps, **({"chunk": chunk} if chunk else {})):
                out.write(part)
        return {"rows": events, "wall_s": time.perf_counter() - t0}
    if reader == "read_kineto_pre_stream":
        import importlib.util
        import tempfile

        src = subprocess.run(
            ["git", "-C", str(_ROOT), "show", f"{PRE_STREAM_COMMIT}:profiles/kineto_reader.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location("kineto_reader_pre_stream", f.name)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        os.unlink(f.name)
        t0 = time.perf_counter()
        df = mod.read_kineto(path, max_json_bytes=2**42)
        return {"rows": len(df), "wall_s": time.perf_counter() - t0}
    if reader == "ijson_columns":
        import gzip

        import ijson  # noqa: F401  (ImportError -> a row saying so)

        import hotloop.profiles.kineto_reader as kr

        t0 = time.perf_counter()
        cols = kr._Columns()
        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f, kr._gc_paused():
            batch: list = []
            first = 0
            for ev in ijson.items(f, "traceEvents.item", use_float=True):
                batch.append(ev)
                if len(batch) == kr._BATCH:
                    cols.add(path, first, batch)
                    first += len(batch)
                    batch = []
            cols.add(path, first, batch)
            df = cols.frame()
        return {"rows": len(df), "wall_s": time.perf_counter() - t0, "ijson_backend": ijson.backend}
    if reader in ("hta_json", "hta_ijson"):
        import logging

        logging.disable(logging.WARNING)
        from hta.common.trace_parser import parse_trace_dataframe
        from hta.configs.parser_config import ParserBackend, ParserConfig

        cfg = ParserConfig()
        cfg.parser_backend = ParserBackend.JSON if reader == "hta_json" else ParserBackend.IJSON_BATCH_AND_COMPRESS
        t0 = time.perf_counter()
        _, df, _ = parse_trace_dataframe(path, cfg)
        return {"rows": len(df), "wall_s": time.perf_counter() - t0}
    raise ValueError(f"reader: {reader!r} not in {READERS}")


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _run_child(python: str, reader: str, path: Path, limit: int) -> tuple[dict | None, str, float, float]:
    """(child's JSON or None, error text, peak RSS in MB, CPU seconds) of one measurement in a fresh process.

    The child is reaped with os.wait4, whose rusage is that child's alone (RUSAGE_CHILDREN would be the maximum
    over every child so far)."""
    import tempfile

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [python, "-m", "lab.trace_read_bench", "--child", reader, str(path)],
            stdout=out,
            stderr=err,
            text=True,
            preexec_fn=limit_memory,
            cwd=str(_ROOT / "results"),
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    rss_mb = usage.ru_maxrss / 1024  # KiB on Linux
    cpu = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or [f"exit status {proc.returncode} (no stderr)"])[-1]
        return None, last[:200], rss_mb, cpu
    return json.loads(stdout.strip().splitlines()[-1]), "", rss_mb, cpu


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(_ROOT), *args], capture_output=True, text=True).stdout.strip()


def _existing(path: Path):
    """A SynthSummary-like record of an existing trace: sizes, and traceEvents entries counted by their "ph" keys
    (a quick byte scan; exact for Kineto's and trace_synth's layout)."""
    import gzip
    from types import SimpleNamespace

    opener = gzip.open if path.name.endswith(".gz") else open
    events = json_bytes = 0
    with opener(path, "rb") as f:
        tail = b""
        while block := f.read(1 << 24):
            json_bytes += len(block)
            events += (tail + block).count(b'"ph"') - tail.count(b'"ph"')
            tail = block[-3:]
    return SimpleNamespace(json_bytes=json_bytes, file_bytes=path.stat().st_size, events=events)


def _bytes_per_event(work: Path) -> float:
    from lab.trace_synth import write_trace

    sample = work / "sample.json"
    s = write_trace(sample, 50_000)
    sample.unlink()
    return s.json_bytes / s.events


def main(argv: list[str] | None = None) -> int:
    """CLI (module docstring). Exit 0 when every cell ran or was skipped with a reason, 1 when a reader failed."""
    p = argparse.ArgumentParser(
        prog="PYTHONPATH=results python -m lab.trace_read_bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--child", nargs=2, metavar=("READER", "FILE"), help=argparse.SUPPRESS)
    p.add_argument("--sizes-gb", type=float, nargs="+", default=[0.5, 1.6, 5.0], help="JSON sizes, GB (1e9 bytes)")
    p.add_argument(
        "--gzip-sizes-gb",
        type=float,
        nargs="*",
        default=[],
        help="sizes also run as .json.gz (json.load, read_kineto, iter_kineto only)",
    )
    p.add_argument("--readers", nargs="+", default=list(READERS), choices=READERS)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/trace_read_bench"), help="where the traces go")
    p.add_argument("--csv", type=Path, required=False, help="results CSV, appended to (header written if new)")
    p.add_argument("--hta-python", default=None, help="Python with HolisticTraceAnalysis and ijson installed")
    p.add_argument("--keep-files", action="store_true")
    p.add_argument(
        "--files",
        type=Path,
        nargs="+",
        default=None,
        help="measure these existing traces instead of generating sizes (kept)",
    )
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    if args.csv is None:
        p.error("--csv is required")
    from lab.trace_synth import write_trace

    args.work_dir.mkdir(parents=True, exist_ok=True)
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = _git(
        "status",
        "--porcelain",
        "profiles/kineto_reader.py",
        "profiles/trace_schema.py",
        *(f"profiles/{m}.py" for m in COUNT_MODULES),
    )
    if dirty:
        commit += "+uncommitted"
    sha = hashlib.sha256((_ROOT / "profiles" / "kineto_reader.py").read_bytes()).hexdigest()[:12]
    count_shas = " ".join(
        f"{m}.py {hashlib.sha256((_ROOT / 'profiles' / f'{m}.py').read_bytes()).hexdigest()[:12]}"
        for m in COUNT_MODULES
    )
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    ratio = dict(_GUESS)
    bpe = _bytes_per_event(args.work_dir)
    print(
        f"# {platform.node()} {os.cpu_count()} CPUs, {_mem_available() / 1e9:.1f} GB available, "
        f"{bpe:.1f} JSON bytes/event, commit {commit}, kineto_reader.py sha256 {sha}",
        flush=True,
    )
    new = not args.csv.exists()
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    failed = False
    with open(args.csv, "a", newline="") as f:
        out = csv.DictWriter(f, COLUMNS)
        if new:
            out.writeheader()
        plan = [(gb, False) for gb in args.sizes_gb] + [(gb, True) for gb in args.gzip_sizes_gb]
        if args.files:
            plan = [(path, path.name.endswith(".gz")) for path in args.files]
        for gb, gz in plan:
            if args.files:
                path, s = gb, _existing(gb)
            else:
                path = args.work_dir / f"synth_{gb:g}gb.json{'.gz' * gz}"
                t0 = time.perf_counter()
                s = write_trace(path, max(1, round(gb * 1e9 / bpe)))
                print(
                    f"# wrote {path}: {s.json_bytes / 1e9:.2f} GB JSON, {s.file_bytes / 1e9:.2f} GB on disk, "
                    f"{s.events} events in {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
            readers = [
                r
                for r in args.readers
                if not gz or r in ("json.load", "read_kineto", "iter_kineto", "inspect", "inspect_in_memory")
            ]
            for reader in readers:
                row = {
                    "reader": reader,
                    "file": path.name,
                    "file_gb": round(s.json_bytes / 1e9, 3),
                    "json_bytes": s.json_bytes,
                    "events": s.events,
                    "commit": commit,
                    "reader_sha": sha,
                    "date": date,
                    "load1": round(os.getloadavg()[0], 2),
                }
                avail = _mem_available()
                need = ratio[reader] * s.json_bytes
                python = args.hta_python if reader in EXTERNAL else sys.executable
                if reader in EXTERNAL and not python:
                    row["note"] = "not run: no --hta-python (HolisticTraceAnalysis / ijson not installed here)"
                elif need > 0.85 * avail:
                    row["note"] = (
                        f"not run: would need ~{need / 1e9:.0f} GB ({ratio[reader]:.1f}x the JSON, as "
                        f"measured at the smaller size), {avail / 1e9:.0f} GB available"
                    )
                else:
                    got, err, rss_mb, cpu = _run_child(python, reader, path, avail)
                    row.update(peak_rss_mb=round(rss_mb), cpu_s=round(cpu, 1))
                    if got is None:
                        row["note"] = f"failed: {err}"
                        failed = True
                    else:
                        ratio[reader] = max(rss_mb * 2**20 / s.json_bytes, 0.05)
                        row.update(
                            rows=got["rows"],
                            wall_s=round(got["wall_s"], 1),
                            mb_per_s=round(s.json_bytes / 1e6 / got["wall_s"], 1),
                            rss_per_json_byte=round(rss_mb * 2**20 / s.json_bytes, 3),
                            note=f"ijson backend {got['ijson_backend']}"
                            if "ijson_backend" in got
                            else count_shas
                            if reader in ("inspect", "inspect_in_memory")
                            else "",
                        )
                out.writerow(row)
                f.flush()
                print(
                    ", ".join(
                        f"{k}={row.get(k, '')}"
                        for k in (
                            "reader",
                            "file_gb",
                            "rows",
                            "wall_s",
                            "cpu_s",
                            "mb_per_s",
                            "peak_rss_mb",
                            "load1",
                            "note",
                        )
                    ),
                    flush=True,
                )
            if not args.keep_files and not args.files:
                path.unlink()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
