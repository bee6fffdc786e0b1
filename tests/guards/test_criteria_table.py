"""guards/criteria.py's CRITERIA is the one criteria table: docs/criteria.md's table is its rendering
(`markdown_table`: id, title, metric columns, phases, aggregate, limit, sources with the completion-query allowance,
evidence, why), every metric column is a column the guard computes, every phase scope resolves, a REPORT row has no limit to check, and the readback's allowance is what
AsyncReadback.publish really queries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_step_metrics import learner_trace

from hotloop.guards.criteria import (
    AGGREGATES,
    CRITERIA,
    READBACK_QUERIES_PER_PUBLISH,
    REPORT,
    Criterion,
    markdown_table,
    query_allowance,
    verdict_table,
)
from hotloop.guards.guard import HOOK_COLUMNS, QUERY_HOOK_COLUMNS
from hotloop.guards.step_metrics import PhaseRoles, step_metrics
from hotloop.trainer.readback import AsyncReadback

DOC = Path(__file__).parents[2] / "docs" / "criteria.md"


def doc_table(text: str) -> str:
    """The table of the '## Criteria' section of docs/criteria.md: its lines from the header through the last row."""
    section = text.split("\n## Criteria\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def check_docs(text: str) -> list[str]:
    """The lines of `text`'s (docs/criteria.md) criteria table that differ from the registry's rendering
    (`markdown_table`, the source), as "docs: <line>" / "registry: <line>"; [] when the table is the rendering."""
    have, want = doc_table(text).splitlines(), markdown_table().splitlines()
    return [f"docs: {line}" for line in have if line not in want] + [
        f"registry: {line}" for line in want if line not in have
    ]


def test_docs_criteria_table_is_the_registrys_rendering():
    """docs/criteria.md's table is generated: on a difference, paste `hotloop criteria --markdown` over it."""
    assert check_docs(DOC.read_text()) == []


def test_the_docs_check_can_fail():
    text = DOC.read_text()
    grid1 = next(line for line in markdown_table().splitlines() if line.startswith("| `no_single_block_kernels`"))
    assert check_docs(text.replace("| `kernels_grid1` |", "| `learner_kernels_grid1` |")) == [
        f"docs: {grid1.replace('| `kernels_grid1` |', '| `learner_kernels_grid1` |')}",
        f"registry: {grid1}",
    ]
    assert len(check_docs(text.replace("| smoke suite |", "| smoke suites |"))) == 2
    assert check_docs(text.replace(grid1 + "\n", "")) == [f"registry: {grid1}"]


def test_every_metric_column_is_computed_and_every_scope_resolves():
    per_step = step_metrics(learner_trace()).per_step
    computed = set(per_step.columns) | set(HOOK_COLUMNS.values()) | set(QUERY_HOOK_COLUMNS)
    roles = PhaseRoles(learner=("update",))
    for c in CRITERIA:
        columns = [x.strip() for x in (c.column or "").split("+") if x.strip()] + [
            x for x in (c.hook_column, c.query_column, c.query_hook_column) if x
        ]
        assert set(columns) <= computed, c.id
        assert c.aggregate in AGGREGATES, c.id
        roles.scope(c.phases)  # raises for an unknown scope
    with pytest.raises(ValueError, match="unknown phase scope"):
        roles.scope("learners")


def test_every_phase_is_judged_and_the_env_row_is_a_limit():
    """Issue 35: "no_single_block_kernels" applies to every phase (the env's included) and the outside-steps
    bucket; the env row limits its kernels per env step; no row of the table is reported without a limit."""
    rows = {c.id: c for c in CRITERIA}
    grid1, env = rows["no_single_block_kernels"], rows["env_kernels_per_env_step"]
    assert (grid1.column, grid1.phases, grid1.limit_text) == ("kernels_grid1", "every", "== 0")
    assert (env.column, env.phases, env.aggregate, env.limit_text) == (
        "env_kernels_per_env_step",
        "env",
        "worst step",
        "<= 3",
    )
    assert (env.check(3), env.check(3.5)) == (True, False)
    assert [c.id for c in CRITERIA if c.comparison == REPORT] == []


def test_a_reported_row_has_no_verdict_and_no_limit_to_check():
    reported = Criterion(
        "env_grid1",
        "grid (1,1,1) kernels of the env",
        "env_kernels_grid1",
        REPORT,
        None,
        "shown, not judged",
        phases="env",
    )
    table = verdict_table({reported.id: 7}, (reported,)).set_index("id")
    row = table.loc[reported.id]
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
    rows = {c.id: c for c in CRITERIA}
    for name in ("no_event_sync", "no_loop_sync"):
        assert rows[name].query_allowance == (("readback_publish", READBACK_QUERIES_PER_PUBLISH),), name
        assert rows[name].allowance_text in rows[name].sees, name  # the docs' table says it
    assert rows["no_event_sync"].allowance_text == "allowed completion queries: 1 per readback_publish"
    assert not rows["no_stream_sync"].query_allowance and rows["no_stream_sync"].allowance_text == ""
