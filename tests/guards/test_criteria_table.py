"""guards/criteria.py's CRITERIA is the one criteria table: docs/criteria.md's table mirrors it row for row (name,
metric columns, phases, aggregate, limit, the completion-query allowance), every metric column is a column the guard
computes, every phase scope resolves, a REPORT row has no limit to check, and the readback's allowance is what
AsyncReadback.publish really queries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hotloop.guards.criteria import (AGGREGATES, CRITERIA, READBACK_QUERIES_PER_PUBLISH, REPORT, Criterion,
                                     query_allowance, verdict_table)
from hotloop.guards.guard import HOOK_COLUMNS, QUERY_HOOK_COLUMNS
from hotloop.trainer.readback import AsyncReadback
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
        if c.query_column:  # syncs + polling queries, per side
            want = " / ".join(" + ".join(f"`{x}`" for x in side.split(" + ")) for side in c.metric.split(" / "))
        if metric != want:
            bad.append(f"{c.name}: metric {metric!r}, code {want!r}")
        if isinstance(c.phases, str) and not phases.startswith(f"`{c.phases}`"):
            bad.append(f"{c.name}: phases {phases!r}, code {c.phases!r}")
        if not c.measured_by and aggregate != c.aggregate:
            bad.append(f"{c.name}: aggregate {aggregate!r}, code {c.aggregate!r}")
        if limit != c.limit_text:
            bad.append(f"{c.name}: limit {limit!r}, code {c.limit_text!r}")
        if c.allowance_text and c.allowance_text not in " | ".join(cells):
            bad.append(f"{c.name}: no {c.allowance_text!r}")
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
    computed = set(per_step.columns) | set(HOOK_COLUMNS.values()) | set(QUERY_HOOK_COLUMNS)
    roles = PhaseRoles(learner=("update",))
    for c in CRITERIA:
        columns = [x.strip() for x in (c.column or "").split("+") if x.strip()] + [
            x for x in (c.hook_column, c.query_column, c.query_hook_column) if x]
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


class CountingEvent:
    """A fake CUDA event for AsyncReadback (its event_factory) that counts the queries made of it and answers
    `done`."""

    queries = 0
    done = True

    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        CountingEvent.queries += 1
        return CountingEvent.done

    def synchronize(self) -> None:
        pass


@pytest.mark.parametrize("done", [True, False])
def test_the_readback_allowance_is_what_a_publication_queries(done, monkeypatch):
    """READBACK_QUERIES_PER_PUBLISH, the rows' allowance per readback_publish, is the most queries one
    AsyncReadback.publish makes, whether its buffers' copies have landed or are still in flight."""
    monkeypatch.setattr(CountingEvent, "queries", 0)
    monkeypatch.setattr(CountingEvent, "done", done)
    rb = AsyncReadback(["a", "b"], "cpu", event_factory=CountingEvent)
    per_publish = []
    for step in range(12):
        before = CountingEvent.queries
        rb.publish([torch.ones(2)], step)
        per_publish.append(CountingEvent.queries - before)
    assert max(per_publish) == READBACK_QUERIES_PER_PUBLISH and per_publish[2:] == [1] * 10
    assert query_allowance() == {"readback_publish": READBACK_QUERIES_PER_PUBLISH}
    rows = {c.name: c for c in CRITERIA}
    for name in ("no event sync", "no sync in the epochs' loop"):
        assert rows[name].query_allowance == (("readback_publish", READBACK_QUERIES_PER_PUBLISH),), name
    assert rows["no event sync"].allowance_text == "allowed completion queries: 1 per readback_publish"
    assert not rows["no stream sync"].query_allowance and rows["no stream sync"].allowance_text == ""
