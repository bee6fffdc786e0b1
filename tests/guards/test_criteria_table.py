"""guards/criteria.py's CRITERIA is the one criteria table: docs/criteria.md's table mirrors it row for row (name,
metric columns, phases, aggregate, limit), every metric column is a column the guard computes, every phase scope
resolves, and a REPORT row has no limit to check."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotloop.guards.criteria import AGGREGATES, CRITERIA, REPORT, Criterion, verdict_table
from hotloop.guards.guard import HOOK_COLUMNS
from hotloop.guards.step_metrics import PhaseRoles, step_metrics
from test_step_metrics import learner_trace

DOC = Path(__file__).parents[2] / "docs" / "criteria.md"


def doc_rows(text: str) -> dict[str, list[str]]:
    """criterion -> the cells of its row in the '## Criteria' table of docs/criteria.md."""
    section = text.split("\n## Criteria\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| criterion")]
    return {cells[0]: cells for cells in ([c.strip() for c in r.strip("|").split("|")] for r in rows)}


def check_docs(text: str) -> list[str]:
    """What in `text` (docs/criteria.md) disagrees with CRITERIA; [] when the table mirrors it."""
    rows, bad = doc_rows(text), []
    for c in CRITERIA:
        cells = rows.get(c.name)
        if cells is None:
            bad.append(f"{c.name}: no row")
            continue
        _, metric, phases, aggregate, limit = cells[:5]
        want = f"`{c.column}` / `{c.hook_column}`" if c.hook_column else f"`{c.column}`" if c.column else "-"
        if metric != want:
            bad.append(f"{c.name}: metric {metric!r}, code {want!r}")
        if isinstance(c.phases, str) and not phases.startswith(f"`{c.phases}`"):
            bad.append(f"{c.name}: phases {phases!r}, code {c.phases!r}")
        if not c.measured_by and aggregate != c.aggregate:
            bad.append(f"{c.name}: aggregate {aggregate!r}, code {c.aggregate!r}")
        if limit != c.limit_text:
            bad.append(f"{c.name}: limit {limit!r}, code {c.limit_text!r}")
    bad += [f"{name}: a row the code does not have" for name in set(rows) - {c.name for c in CRITERIA}]
    return bad


def test_docs_criteria_table_mirrors_the_code():
    assert check_docs(DOC.read_text()) == []


def test_the_docs_check_can_fail():
    text = DOC.read_text()
    assert check_docs(text.replace("| `kernels_grid1` |", "| `learner_kernels_grid1` |")) == [
        "no single-block kernels: metric '`learner_kernels_grid1`', code '`kernels_grid1`'"]
    assert check_docs(text.replace("| `env`: env_step | worst step | <= 3 |", "| `env`: env_step | worst step | "
                                   "none (reported) |")) == [
        "env kernels per env step: limit 'none (reported)', code '<= 3'"]
    assert check_docs(text.replace("| smoke suite |", "| smoke suites |")) == [
        "smoke suite: no row", "smoke suites: a row the code does not have"]
    assert check_docs(text.replace("| `learner` | worst step | <= 1 |", "| `every` | worst step | <= 1 |")) == [
        "memsets only where needed: phases '`every`', code 'learner'"]


def test_every_metric_column_is_computed_and_every_scope_resolves():
    per_step = step_metrics(learner_trace()).per_step
    computed = set(per_step.columns) | set(HOOK_COLUMNS.values())
    roles = PhaseRoles(learner=("update",))
    for c in CRITERIA:
        columns = [x.strip() for x in (c.column or "").split("+") if x.strip()] + [c.hook_column] * bool(c.hook_column)
        assert set(columns) <= computed, c.name
        assert c.aggregate in AGGREGATES, c.name
        roles.scope(c.phases)  # raises for an unknown scope
    with pytest.raises(ValueError, match="unknown phase scope"):
        roles.scope("learners")


def test_every_phase_is_judged_and_the_env_row_is_a_limit():
    """Issue 35: "no single-block kernels" applies to every phase (the env's included) and the outside-steps
    bucket; the env row limits its kernels per env step; no row of the table is reported without a limit."""
    rows = {c.name: c for c in CRITERIA}
    grid1, env = rows["no single-block kernels"], rows["env kernels per env step"]
    assert (grid1.column, grid1.phases, grid1.limit_text) == ("kernels_grid1", "every", "== 0")
    assert (env.column, env.phases, env.aggregate, env.limit_text) == ("env_kernels_per_env_step", "env",
                                                                       "worst step", "<= 3")
    assert (env.check(3), env.check(3.5)) == (True, False)
    assert [c.name for c in CRITERIA if c.comparison == REPORT] == []


def test_a_reported_row_has_no_verdict_and_no_limit_to_check():
    reported = Criterion("grid (1,1,1) kernels of the env", "env_kernels_grid1", REPORT, None, "shown, not judged",
                         phases="env")
    table = verdict_table({reported.name: 7}, (reported,)).set_index("criterion")
    row = table.loc[reported.name]
    assert (row["status"], row["verdict"], row["limit"], row["measured"]) == ("reported", "-", "none (reported)", 7)
    with pytest.raises(ValueError, match="no limit to check"):
        reported.check(0)
