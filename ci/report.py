"""ci/gate.sh's reporter: the job summary (markdown) and the console block that ends the job log.

Standard library only, on purpose: it must run when the project's environment is broken (a failed install).

Reads what the steps left in the run folder -- setup.log, pytest.log and junit.xml, gate.log -- and in the
gate's own run folder inside it (gate/: criteria.csv/.md, epochs.md, and any other top-level *.csv with a
`verdict` column, such as the rows of a baseline comparison) -- and:

* writes <run>/summary.md, and appends the same markdown to --step-summary (GitHub's $GITHUB_STEP_SUMMARY)
  when given;
* under GitHub Actions (GITHUB_ACTIONS=true) emits one `::error` annotation per failing row;
* prints the console block whose LAST lines are the failing rows: pytest's FAILED/ERROR lines, the gate's
  error, crash or hang line, then the criteria rows with verdict FAIL.

A gate that crashed (exit 70, an internal error: its traceback is gate/error.log; or any exit code the gate does
not define, such as a signal's) is reported as "the gate crashed", never as "a criterion or regression failed".

ci/gate.sh computes the exit code from the steps' exit codes and passes it in (--exit-code). The one thing this
script adds: it never reports a pass when it finds a failing row (a FAIL verdict although the gate exited 0).
Exit status: 0 summary written; 3 summary written, but it found a failing row although --exit-code was 0
(ci/gate.sh then exits 1); 2 bad arguments; 1 (a Python error) makes ci/gate.sh print the raw rows itself.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
GATE_EXIT = {
    0: "PASS",
    1: "a criterion or regression failed",
    2: "bad usage or input",
    3: "hang (watchdog)",
    70: "the gate crashed: internal error",
}
GATE_INTERNAL_ERROR = 70
"""`hotloop gate`'s exit code for an unexpected exception (hotloop.guards.commands.errors.INTERNAL_ERROR); traceback in
gate/error.log."""
PYTEST_EXIT = {
    0: "all selected tests passed",
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests selected",
}
KNOWN_CRITERIA_COLUMNS = {"id", "criterion", "metric", "limit", "measured", "status", "verdict", "why"}
STEP_TITLES = {
    "setup": "setup (pip install -e .[dev,gym], torch kept)",
    "pytest": 'pytest -m "smoke or perf"',
    "gate": "hotloop gate",
}


def _read(path: Path) -> str:
    try:
        return ANSI.sub("", path.read_text(errors="replace"))
    except OSError:
        return ""


def _lines(path: Path) -> list[str]:
    return _read(path).splitlines()


def parse_kv(items: list[str], what: str) -> list[tuple[str, str]]:
    """`key=value` strings -> ordered pairs; ValueError naming the bad item."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--{what} wants KEY=VALUE, got {item!r}")
        pairs.append((key, value))
    return pairs


def junit_counts(path: Path) -> dict[str, int] | None:
    """tests/failures/errors/skipped/passed summed over the JUnit XML's suites; None if unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {k: sum(int(s.get(k, 0) or 0) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def junit_failures(path: Path) -> list[str]:
    """`FAILED classname::name - message` for each failed/errored testcase of the JUnit XML."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in root.iter("testcase"):
        for kind, label in (("failure", "FAILED"), ("error", "ERROR")):
            node = case.find(kind)
            if node is not None:
                message = (node.get("message") or "").splitlines()[0:1]
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                out.append(f"{label} {name}" + (f" - {message[0]}" if message else ""))
    return out


def pytest_failures(run: Path, rc: int) -> list[str]:
    """The failing lines of the pytest step: its short-summary FAILED/ERROR lines (from -ra), else the JUnit
    failures, else (a usage error, no tests selected, a crash) the last lines of pytest.log."""
    log = _lines(run / "pytest.log")
    rows = [line for line in log if re.match(r"^(FAILED|ERROR) ", line)]
    if not rows:
        rows = junit_failures(run / "junit.xml")
    if not rows and rc != 0:
        rows = [line for line in log if line.strip()][-5:] or ["(pytest.log is empty)"]
    return rows


def pytest_result(run: Path, rc: int) -> str:
    counts = junit_counts(run / "junit.xml")
    text = PYTEST_EXIT.get(rc, f"exit {rc}")
    if counts:
        text += (
            f": {counts['passed']} passed, {counts['failures']} failed, {counts['errors']} errors, "
            f"{counts['skipped']} skipped"
        )
    return text


def verdict_rows(gate_dir: Path) -> list[tuple[str, dict[str, str]]]:
    """(file name, row) for every row with verdict FAIL in criteria.csv, then in any other top-level CSV of the
    gate's run folder that has a `verdict` column (sorted by name)."""
    files = sorted(gate_dir.glob("*.csv"), key=lambda p: (p.name != "criteria.csv", p.name))
    found = []
    for path in files:
        try:
            with path.open(newline="") as fh:
                reader = csv.DictReader(fh)
                if "verdict" not in (reader.fieldnames or []):
                    continue
                found.extend((path.name, row) for row in reader if (row.get("verdict") or "").strip() == "FAIL")
        except (OSError, csv.Error):
            continue
    return found


def format_verdict_row(row: dict[str, str]) -> str:
    """`FAIL <criterion or metric>[ [id]]: measured M, limit L, <other non-empty columns as key=value>`."""
    name = row.get("criterion") or row.get("metric") or "?"
    name += f" [{row['id']}]" if (row.get("id") or "").strip() and row.get("criterion") else ""
    parts = [f"measured {row['measured']}"] if (row.get("measured") or "").strip() else []
    parts += [f"limit {row['limit']}"] if (row.get("limit") or "").strip() else []
    parts += [f"{k}={v}" for k, v in row.items() if k and k not in KNOWN_CRITERIA_COLUMNS and (v or "").strip()]
    return f"FAIL {name}: {', '.join(parts)}" if parts else f"FAIL {name}"


def gate_result(rc: int, gate_dir: Path) -> str:
    """What the gate's exit code `rc` means, for the steps table and the failing section's title: GATE_EXIT's
    words, with the traceback's path for an internal error (70); any code the gate does not define is a crash."""
    if rc == GATE_INTERNAL_ERROR:
        return f"{GATE_EXIT[rc]}, see {gate_dir / 'error.log'}"
    return GATE_EXIT.get(rc, f"the gate crashed: exit {rc} (killed by a signal or an unexpected exit), see gate.log")


def gate_failure(run: Path, rc: int, gate_dir: Path | None = None) -> list[str]:
    """What explains a failed gate other than its FAIL rows: the watchdog's HANG line, the internal-error line
    (exit 70; else the last lines of gate_dir/error.log, the traceback), an error line, or the last lines of
    gate.log (a traceback's end)."""
    log = [line for line in _lines(run / "gate.log") if line.strip()]
    hang = [line.strip() for line in log if "HANG:" in line]
    if hang:
        return hang
    if rc == GATE_INTERNAL_ERROR:
        crash = [line.strip() for line in log if "internal error" in line and "hotloop" in line]
        trace = [line.rstrip() for line in _lines((gate_dir or run / "gate") / "error.log") if line.strip()][-4:]
        if crash or trace:
            return crash or trace
    errors = [line.strip() for line in log if re.search(r"\berror\b", line) and "hotloop" in line]
    return errors or [line.rstrip() for line in log[-8:]] or ["(gate.log is empty)"]


def _step_rc(steps: dict[str, str], name: str) -> int | None:
    value = steps.get(name, "not run")
    return int(value) if value.lstrip("-").isdigit() else None


def build(run: Path, gate_dir: Path, exit_code: int, info: list[tuple[str, str]], steps: dict[str, str]):
    """Returns (markdown, failing, exit_code): the summary's markdown, the failing rows as (section, lines)
    pairs, and the exit code to report (`exit_code`, or 1 when it is 0 but something failed)."""
    failing: list[tuple[str, list[str]]] = []
    step_rows = []
    for name in ("setup", "pytest", "gate"):
        value = steps.get(name, "not run")
        rc = _step_rc(steps, name)
        if rc is None:
            result = value
        elif name == "pytest":
            result = pytest_result(run, rc)
        elif name == "gate":
            result = gate_result(rc, gate_dir)
        else:
            result = "ok" if rc == 0 else "failed: see setup.log"
        step_rows.append((STEP_TITLES[name], "-" if rc is None else str(rc), result))
        if value == "interrupted":
            failing.append(
                (
                    f"{name} interrupted (ci/gate.sh was stopped)",
                    [line.rstrip() for line in _lines(run / f"{name}.log") if line.strip()][-8:],
                )
            )
        if rc in (None, 0):
            continue
        if name == "setup":
            failing.append(
                (f"setup (exit {rc})", [line.rstrip() for line in _lines(run / "setup.log") if line.strip()][-8:])
            )
        elif name == "pytest":
            failing.append((f"pytest (exit {rc}): {pytest_result(run, rc)}", pytest_failures(run, rc)))
        else:
            rows = verdict_rows(gate_dir)
            if rc != 1 or not rows:  # exit 1 with FAIL rows is explained by the rows themselves
                failing.append(
                    (f"hotloop gate (exit {rc}): {gate_result(rc, gate_dir)}", gate_failure(run, rc, gate_dir))
                )
    rows = verdict_rows(gate_dir)
    if rows:
        failing.append(
            (
                "criteria (verdict FAIL)",
                [format_verdict_row(r) + ("" if f == "criteria.csv" else f"  [{f}]") for f, r in rows],
            )
        )

    if exit_code == 0 and failing:  # e.g. a FAIL row although the gate exited 0: never report a pass
        exit_code = 1
    status = "PASS" if exit_code == 0 else f"FAIL (exit {exit_code})"
    md = [f"## hotloop CI gate: {status}", "", "| | |", "|---|---|"]
    md += [f"| {k} | {v.replace('|', '/') or '-'} |" for k, v in info]
    md += ["", "### Steps", "", "| step | exit | result |", "|---|---|---|"]
    md += [f"| {a} | {b} | {c} |" for a, b, c in step_rows]
    if failing:
        md += ["", "### Failing", ""]
        for section, lines in failing:
            md += [f"**{section}**", "", "```", *lines, "```", ""]
    criteria, epochs = _read(gate_dir / "criteria.md").strip(), _read(gate_dir / "epochs.md").strip()
    md += ["", "### Criteria (verdicts)", "", criteria or "_no criteria table: the gate did not finish (see gate.log)_"]
    md += ["", "### Per-epoch table", "", epochs or "_no per-epoch table: no epoch finished (see gate.log)_", ""]
    return "\n".join(md), failing, exit_code


def _annotation(text: str, prop: bool = False) -> str:
    """Escape for a GitHub workflow command: its message, or (prop) a property value such as title=."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--gate-dir", type=Path, help="the gate's run folder (default: RUN_DIR/gate)")
    p.add_argument("--exit-code", type=int, required=True, help="the exit code ci/gate.sh decided")
    p.add_argument("--step-summary", type=Path, help="also append the markdown here ($GITHUB_STEP_SUMMARY)")
    p.add_argument("--info", action="append", default=[], metavar="KEY=VALUE", help="a row of the header table")
    p.add_argument(
        "--step",
        action="append",
        default=[],
        metavar="NAME=RC",
        help="setup/pytest/gate = exit code, or a word such as 'skipped'",
    )
    args = p.parse_args(argv)
    try:
        info, steps = parse_kv(args.info, "info"), dict(parse_kv(args.step, "step"))
    except ValueError as exc:
        print(f"ci/report.py: error: {exc}", file=sys.stderr)
        return 2
    run = args.run_dir
    md, failing, exit_code = build(run, args.gate_dir or run / "gate", args.exit_code, info, steps)
    (run / "summary.md").write_text(md)
    where = [str(run / "summary.md")]
    if args.step_summary:
        with args.step_summary.open("a") as fh:
            fh.write(md + "\n")
        where.append(str(args.step_summary))

    out = sys.stdout
    out.write(f"\nci/gate.sh: summary written to {' and '.join(where)}\n")
    out.write(f"ci/gate.sh: run folder {run}\n")
    out.write(
        "ci/gate.sh: "
        + ", ".join(f"{k} {v if not v.lstrip('-').isdigit() else 'exit ' + v}" for k, v in steps.items())
        + "\n"
    )
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for section, lines in failing:
            for line in lines:
                out.write(f"::error title={_annotation(section.split(':')[0], True)}::{_annotation(line)}\n")
    if exit_code == 0:
        out.write("ci/gate.sh: PASS\n")
    else:
        out.write(f"ci/gate.sh: FAIL (exit {exit_code}); the failing rows:\n")
        for section, lines in failing:
            out.write(f"--- {section}\n")
            out.writelines(f"  {line}\n" for line in lines)
    out.flush()
    return 3 if exit_code != args.exit_code else 0


if __name__ == "__main__":
    sys.exit(main())
