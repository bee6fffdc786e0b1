"""Criteria by id (issue 40, item 2): the registry (hotloop.guards.criteria.CRITERIA) is the one place a criterion
is defined; code, faults, mutants and the gate's tables name it by id, and no code compares display names.

The fixture `h2d_criterion` adds a hypothetical trace-count criterion the way a developer would, and
`test_a_new_trace_count_criterion_is_judged_and_shown_everywhere` shows it needs no more than:
1. its registry entry (guards/criteria.py, CRITERIA),
2. its counter: one per-event column in `_event_metrics` (guards/step_metrics.py; Kineto and Nsight traces both
   reach it through the trace schema),
3. its mutant (ci/mutants/<id>.patch and its [[mutant]] entry in ci/mutants/mutants.toml; tests/guards/test_mutate.py
   requires one per gate criterion),
4. its test (like this one),
plus docs/criteria.md's table, generated (`hotloop criteria --markdown`). Here 1 and 2 are monkeypatched in.
Checked once for real (2026-12-06): with H2D written into guards/criteria.py and its counter into
guards/step_metrics.py, tests/guards and tests/ci failed only on the docs table (regenerate it) and on
test_mutate's one-mutant-per-criterion check (write its mutant); nothing else needed a line.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from test_step_metrics import TraceBuilder, learner_trace

import hotloop.guards.criteria as criteria_module
import hotloop.guards.step_metrics as step_metrics_module
from hotloop.guards.commands.main import build_parser, main
from hotloop.guards.criteria import (
    CRITERIA,
    JUDGES,
    Criterion,
    criteria_frame,
    criterion,
    id_of,
    judged_by,
    label,
    markdown_table,
    verdict_table,
)
from hotloop.guards.fault_list import FAULTS, inject_help
from hotloop.guards.guard import evaluate
from hotloop.guards.mutate import EXPECTABLE, GATE_CRITERIA, HANG, HANG_IDS, failed_rows, load_manifest, verdict
from hotloop.guards.step_metrics import step_metrics
from hotloop.guards.sync_hooks import HOOKED_APIS, SyncHooks

ROOT = Path(__file__).parents[2]
CODE = [
    p
    for folder in ("guards", "ci")
    for p in sorted((ROOT / folder).rglob("*.py"))
    if p != ROOT / "guards" / "criteria.py"
]
"""The code scanned for display names: every module of guards/ and ci/ but the registry itself."""


def title_literals(source: str, titles: set[str]) -> list[str]:
    """'line N: "title"' for each string literal of `source` equal to one of `titles`, docstrings left out (they
    may name a criterion for the reader)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"line {n.lineno}: {n.value!r}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in titles and id(n) not in docstrings
    ]


def test_no_code_names_a_criterion_by_its_title():
    titles = {c.title for c in CRITERIA}
    found = {str(p.relative_to(ROOT)): hits for p in CODE if (hits := title_literals(p.read_text(), titles))}
    assert found == {}


def test_the_title_scan_can_fail():
    assert title_literals(
        '"""no stream sync"""\nif c.title == "TF32 forward only":\n    x = "no stream sync"\n',
        {"TF32 forward only", "no stream sync"},
    ) == ["line 2: 'TF32 forward only'", "line 3: 'no stream sync'"]


def test_ids_are_unique_stable_and_looked_up():
    ids = [c.id for c in CRITERIA]
    assert len(set(ids)) == len(ids) and len({c.title for c in CRITERIA}) == len(ids)
    assert ids[:3] == ["no_stream_sync", "no_event_sync", "no_d2d_weight_sync"]
    assert criterion("no_hang").title == "epoch 1 without hang"
    with pytest.raises(ValueError, match="unknown criterion id 'no stream sync'; known: no_stream_sync"):
        criterion("no stream sync")
    assert [id_of("DDQN overlapped"), id_of("ddqn_overlapped"), id_of("epoch throughput")] == [
        "ddqn_overlapped",
        "ddqn_overlapped",
        "epoch throughput",
    ]  # old titles read as ids; other rows unchanged
    assert (label("no_event_sync"), label("hang")) == ("no event sync [no_event_sync]", "hang")
    assert {c.judge for c in CRITERIA} == set(JUDGES)
    with pytest.raises(ValueError, match="must be lower-case"):
        Criterion("No Sync", "no sync", "stream_sync_calls", "==", 0, "why")
    with pytest.raises(ValueError, match="judge 'eyeball' is not one of"):
        Criterion("no_sync", "no sync", "stream_sync_calls", "==", 0, "why", judge="eyeball")


def test_hooks_faults_and_mutants_name_registry_ids():
    hooked = {c.id for c in CRITERIA if c.hook_column}
    assert set(HOOKED_APIS.values()) == hooked
    assert {f.criterion for f in FAULTS.values()} <= set(GATE_CRITERIA)
    for name, fault in FAULTS.items():
        assert f"{name} ({fault.criterion})" in inject_help()
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["gate"].format_help().split())
    assert " ".join(inject_help().split()) in help_text
    manifest = load_manifest(ROOT / "ci" / "mutants" / "mutants.toml")
    assert {m.criterion for m in manifest} <= set(EXPECTABLE)
    raw = tomllib.loads((ROOT / "ci" / "mutants" / "mutants.toml").read_text())["mutant"]
    assert not {e["criterion"] for e in raw} & {c.title for c in CRITERIA}  # ids, never titles


def test_the_mutants_readme_shows_each_mutants_title_from_the_registry():
    """ci/mutants/README.md's table writes a mutant's expected criterion as "title (`id`)", the title looked up in
    the registry from the manifest's id."""
    want = {
        m.id: f"{criterion(m.criterion).title} (`{m.criterion}`)"
        for m in load_manifest(ROOT / "ci" / "mutants" / "mutants.toml")
        if m.criterion in GATE_CRITERIA
    }
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in (ROOT / "ci" / "mutants" / "README.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| id ")
    ]
    shown = {cells[0]: cells[3] for cells in rows if cells[0] in want}
    assert shown and shown == {k: want[k] for k in shown}


def test_old_criteria_csv_with_titles_still_reads_as_ids(tmp_path):
    pd.DataFrame({"criterion": ["no stream sync", "DDQN overlapped"], "verdict": ["FAIL", "PASS"]}).to_csv(
        tmp_path / "criteria.csv", index=False
    )
    assert failed_rows(tmp_path) == ["no_stream_sync"]
    assert verdict("no_stream_sync", 1, failed_rows(tmp_path)) == "killed"
    assert verdict(HANG_IDS[0], 3, []) == "killed" and HANG not in GATE_CRITERIA


def test_hotloop_criteria_prints_the_registry(capsys):
    assert main(["criteria"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["id", "criterion", "metric"] and len(lines) == 1 + len(CRITERIA)
    for c, line in zip(CRITERIA, lines[1:]):
        assert line.split()[0] == c.id and c.title in line and c.limit_text in line
    assert main(["criteria", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table() + "\n"


H2D = Criterion(
    "no_h2d_copies",
    "no host-to-device copies",
    "h2d_copies",
    "==",
    0,
    "the step's inputs live on the device; a copy from the host every step waits for it",
    sees="`gpu_memcpy` events of kind HtoD",
    evidence="copy names in their phase",
)
"""A hypothetical trace-count criterion (not in the registry): no host-to-device copy in any phase."""


@pytest.fixture
def h2d_criterion(monkeypatch) -> tuple[Criterion, ...]:
    """Add H2D to the registry and its counter to `_event_metrics`, as a developer would (module docstring); returns
    the extended registry."""
    extended = (*CRITERIA, H2D)
    for module in (criteria_module, step_metrics_module):  # the registry, as the modules that read it see it
        monkeypatch.setattr(module, "CRITERIA", extended)
    counted = step_metrics_module._event_metrics

    def with_counter(df, *args, **kwargs):
        out = counted(df, *args, **kwargs)
        out["h2d_copies"] = (df["kind"].eq("memcpy") & df["copy_kind"].eq("HtoD")).astype("int64")  # the counter
        return out

    monkeypatch.setattr(step_metrics_module, "_event_metrics", with_counter)
    return extended


def _with_h2d_copy() -> pd.DataFrame:
    """Two steps of learner_trace, then a third holding one HtoD copy (in the forward phase)."""
    b = TraceBuilder()
    b.rows = list(learner_trace(steps=2).to_dict("records"))
    b.t = max(r["start_us"] + r["dur_us"] for r in b.rows) + 1
    b.corr = 10_000
    with b.step():
        b.gpu(
            "Memcpy HtoD (Pinned -> Device)",
            9000.0,
            2,
            "memcpy",
            launch="cudaMemcpyAsync",
            copy_kind="HtoD",
            phase="forward",
        )
    return b.frame()


def test_a_new_trace_count_criterion_is_judged_and_shown_everywhere(h2d_criterion):
    hits = SyncHooks().frame()
    clean = evaluate(step_metrics(learner_trace()), hits, cuda=True, criteria=h2d_criterion).set_index("id")
    assert clean.loc["no_h2d_copies", ["criterion", "verdict", "measured"]].tolist() == [
        "no host-to-device copies",
        "PASS",
        0,
    ]
    faulty = evaluate(step_metrics(_with_h2d_copy()), hits, cuda=True, criteria=h2d_criterion).set_index("id")
    row = faulty.loc["no_h2d_copies"]
    assert (row.verdict, row.measured, row.source, row.worst_step) == ("FAIL", 1, "trace", "2")  # the third step
    assert row.evidence == "Memcpy HtoD (Pinned -> Device) in forward x1"
    assert list(faulty.index[faulty.verdict.eq("FAIL")]) == ["no_h2d_copies"]  # the other rows untouched
    cpu = evaluate(step_metrics(learner_trace()), hits, cuda=False, criteria=h2d_criterion).set_index("id")
    assert cpu.loc["no_h2d_copies", "status"] == "not measured (no CUDA)"
    # the tables: the gate's verdicts, `hotloop criteria`, docs/criteria.md's (generated)
    assert verdict_table({"no_h2d_copies": 2}, h2d_criterion).set_index("id").loc["no_h2d_copies", "verdict"] == "FAIL"
    assert criteria_frame(h2d_criterion).iloc[-1].tolist() == [
        "no_h2d_copies",
        "no host-to-device copies",
        "h2d_copies",
        "== 0",
        "every",
        "window count",
    ]
    assert (
        markdown_table(h2d_criterion)
        .splitlines()[-1]
        .startswith(
            "| `no_h2d_copies` | no host-to-device copies | `h2d_copies` | `every` phase + outside steps | worst step |"
        )
    )
    assert judged_by("window count", h2d_criterion)[-1] is H2D
