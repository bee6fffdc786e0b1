"""The seed's success criteria in one declarative table, and the verdicts a run gets against it.

Rows are those of docs/criteria.md (the criteria table, with the metric and source of each). A row whose
metric hotloop cannot measure yet has `measured_by = None`; the gate shows it as "not yet measured" and it
neither passes nor fails a run.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import pandas as pd

_OPS = {"==": operator.eq, "<=": operator.le, ">": operator.gt, "<": operator.lt, ">=": operator.ge}


@dataclass(frozen=True)
class Criterion:
    """One success criterion: `measured <comparison> limit` must hold (per training step, on the hot path)."""

    name: str
    metric: str
    comparison: str
    limit: float | str
    why: str
    measured_by: str | None = None

    def check(self, measured: float | str) -> bool:
        """True when `measured` meets the limit; ValueError for an unknown comparison."""
        if self.comparison not in _OPS:
            raise ValueError(f"criterion {self.name!r}: unknown comparison {self.comparison!r}")
        return bool(_OPS[self.comparison](measured, self.limit))


CRITERIA: tuple[Criterion, ...] = (
    Criterion("no stream sync", "cudaStreamSynchronize/cuStreamSynchronize calls + Stream.synchronize hook hits",
              "==", 0, "a stream sync stalls the host on the GPU every step"),
    Criterion("no event sync", "cudaEventSynchronize, cudaDeviceSynchronize, blocking cudaMemcpy, pageable "
              "non_blocking copies", "==", 0, "any of these blocks the host until the GPU drains"),
    Criterion("no D2D weight sync", "Memcpy DtoD events + memcpy nodes inside graphs", "==", 0,
              "weights are views of one flat buffer; copying them wastes bandwidth and launches"),
    Criterion("spectral norm fused", "kernels launched by the spectral-norm phase", "<=", 1,
              "one fused launch normalizes all weight matrices"),
    Criterion("no single-block kernels", "kernels with grid == (1,1,1)", "==", 0,
              "a one-block kernel leaves 131 of 132 SMs idle"),
    Criterion("memsets only where needed", "gpu_memset events + fill kernels", "<=", 1,
              "accumulators are initialized inside the kernels that use them"),
    Criterion("TF32 forward only", "forward GEMMs TF32, backward GEMMs not TF32", "==", "yes",
              "TF32 tensor cores where accuracy allows, FP32-accurate gradients"),
    Criterion("DDQN overlapped", "fraction of DDQN-forward kernel time concurrent with the online forward", ">", 0,
              "the second stream hides the Double-DQN forward"),
    Criterion("epoch 1 without hang", "epoch 1 finished under the hang watchdog", "==", "yes",
              "a hang (e.g. the seed's tree race) must fail fast with stacks, not time out CI",
              measured_by="hotloop.guards.watchdog.HangWatchdog"),
    Criterion("smoke suite", "pytest -m smoke", "==", "pass", "every part works end to end",
              measured_by="pytest -m smoke (not run by the gate)"),
)


def verdict_table(measurements: dict[str, float | str]) -> pd.DataFrame:
    """Verdicts of all criteria for the `measurements` given (criterion name -> measured value).

    Returns a DataFrame with columns criterion, metric, limit, measured, status ("measured" / "not yet
    measured"), verdict ("PASS" / "FAIL" / "-"), why. ValueError if a measurement names no criterion.
    """
    unknown = sorted(set(measurements) - {c.name for c in CRITERIA})
    if unknown:
        raise ValueError(f"measurements for unknown criteria {unknown}")
    rows = []
    for c in CRITERIA:
        has = c.name in measurements
        value = measurements.get(c.name, "")
        rows.append(dict(criterion=c.name, metric=c.metric, limit=f"{c.comparison} {c.limit}", measured=value,
                         status="measured" if has else "not yet measured",
                         verdict=("PASS" if c.check(value) else "FAIL") if has else "-", why=c.why))
    return pd.DataFrame(rows)
