"""hotloop's pytest plugin: the `gpu`, `perf` and `smoke` markers, their skips without CUDA, and fixtures that run
a training step under the guard (hotloop.guards.guard.guard_steps) and judge its verdicts.

Installing hotloop registers it with pytest (a `pytest11` entry point named `hotloop`, as pytest-benchmark does), so
every project that has hotloop installed can use it with nothing in its conftest.py; `-p no:hotloop` turns it off.
It is inert until used: loading it imports neither torch nor the guard (the markers are registered; torch is
imported only when a collected test carries `gpu` or `perf`, the guard only when a test asks for `guard`). Then:

- `@pytest.mark.gpu` / `@pytest.mark.perf` tests skip on a machine where torch.cuda.is_available() is False, with
  that reason; `@pytest.mark.smoke` marks the fast end-to-end checks (`pytest -m smoke`, CPU and GPU).
- fixture `guard`: `guard(step_fn, steps=20, warmup=3, **guard_steps_kwargs) -> GuardReport`, `step_fn` being any
  zero-argument callable that does one training step (yours or hotloop's).
- fixture `guard_window`: the loop form, hotloop.guards.guard.guard_window: `with guard_window(steps=K) as w:`
  around a loop you run (`with w.step():` around each step, or code opening its own K step ranges), then
  `w.report`.
- fixture `assert_criteria`: `assert_criteria(report, only=None)` fails the test listing every measured criterion
  whose verdict is FAIL (criterion, measured, limit, evidence); with `only`, just the criteria named by id
  (`hotloop criteria` lists them), each of which must also have been measured.

A perf test of your own step::

    import pytest

    @pytest.mark.perf
    def test_my_step_keeps_the_criteria(guard, assert_criteria):
        step = build_my_training_step()          # your code: returns a zero-argument callable
        report = guard(step, steps=20, warmup=3)
        assert_criteria(report, only=["no_stream_sync", "no_single_block_kernels"])

hotloop's own perf tests (tests/perf/) run the gate's criteria this way on the hotloop learner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hotloop.guards.guard import GuardReport

MARKERS = {
    "gpu": "needs a CUDA GPU; skipped with the reason on a machine without one",
    "perf": "measures the hot path's success criteria on a GPU (hotloop's guards); skipped without CUDA",
    "smoke": "fast end-to-end checks of each part; run on CPU and on the GPU",
}
NO_CUDA_REASON = "needs a CUDA GPU: torch.cuda.is_available() is False on this machine"


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # markers, not keywords (a folder or a parametrize id named "gpu" is a keyword too)
    needs_cuda = [item for item in items if item.get_closest_marker("gpu") or item.get_closest_marker("perf")]
    if not needs_cuda:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_CUDA_REASON)
    for item in needs_cuda:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def guard() -> Callable[..., GuardReport]:
    """`guard(step_fn, steps=20, warmup=3, **kwargs)`: hotloop.guards.guard.guard_steps, whose docstring says what it
    measures and raises."""
    from hotloop.guards.guard import guard_steps

    return guard_steps


@pytest.fixture(scope="session")
def guard_window() -> Callable[..., object]:
    """`guard_window(steps, warmup=0, **kwargs)`: hotloop.guards.guard.guard_window (the loop form of the guard),
    whose docstring says what it measures and raises."""
    from hotloop.guards.guard import guard_window as window

    return window


def failing_rows(report: GuardReport, only: Iterable[str] | None = None) -> list[str]:
    """One line per measured criterion of `report` whose verdict is FAIL ("title [id]: measured M (limit L);
    evidence"). With `only` (criterion ids; one id may be given as a str), just those, and each of them must
    also have been measured (or reported, for a row without a limit): a named criterion the run could not measure
    (e.g. a GPU row on a CPU step, or a row whose phase was not in the window) is a line "criterion: not measured
    (<why>)" too, and so is a sync row on a CPU step ("criterion: not applicable (no CUDA)"), since a check that
    measured nothing proves nothing.
    Raises ValueError for an empty `only` or an id in it that is not a criterion of the report."""
    v = report.verdicts
    rows = []
    if only is not None:
        only = [only] if isinstance(only, str) else list(only)
        if not only:
            raise ValueError("only= names no criterion; leave it out to judge them all")
        unknown = sorted(set(only) - set(v["id"]))
        if unknown:
            raise ValueError(f"not criteria ids of this report: {unknown}; known: {list(v['id'])}")
        v = v[v["id"].isin(only)]
        rows = [
            f"{r.criterion} [{r.id}]: {r.status}" for r in v.itertuples() if r.status not in ("measured", "reported")
        ]
    failed = v[v["verdict"].eq("FAIL")]
    return rows + [
        f"{r.criterion} [{r.id}]: measured {r.measured} (limit {r.limit}); {r.evidence}" for r in failed.itertuples()
    ]


@pytest.fixture(scope="session")
def assert_criteria() -> Callable[..., None]:
    """`assert_criteria(report, only=None)`: pytest.fail listing `failing_rows(report, only)` when any."""

    def check(report: GuardReport, only: Iterable[str] | None = None) -> None:
        rows = failing_rows(report, only)
        if rows:
            pytest.fail("criteria failed:\n" + "\n".join(rows) + f"\n\nverdicts:\n{report}", pytrace=False)

    return check
