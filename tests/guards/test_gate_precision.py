"""The gate's "tf32_forward_only" row is decided by the precision probe (hotloop.guards.probes.precision_probe), never by
kernel names: a probe FAIL fails the row although the names say TF32 forward / FP32 backward, a probe PASS passes
it, and a probe that cannot measure (CPU interpreter) leaves it not measured; the names stay in the evidence."""

from __future__ import annotations

import pandas as pd
import pytest

from hotloop.guards.gate import judge_precision

PRECISION_CRITERION = "tf32_forward_only"


def _verdicts(named: str = "yes") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "id": "no_stream_sync",
                "measured": 0,
                "verdict": "PASS",
                "status": "measured",
                "source": "hook",
                "evidence": "",
            },
            {
                "id": PRECISION_CRITERION,
                "measured": named,
                "verdict": "PASS" if named == "yes" else "FAIL",
                "status": "measured",
                "source": "trace",
                "evidence": "fwd: _fwd_online_tf32_gemm_kernel x3",
            },
        ]
    )


@pytest.mark.parametrize("probe,measured,verdict", [("FAIL", "no", "FAIL"), ("PASS", "yes", "PASS")])
def test_the_probe_decides_the_row_whatever_the_names_say(probe, measured, verdict):
    v = _verdicts("yes")
    judge_precision(v, probe, ["forward: FAIL", "  fwd_l1 (8192x512, K=64): normwise error 2.1e-07, FP32-like"])
    row = v.set_index("id").loc[PRECISION_CRITERION]
    assert (row.measured, row.verdict, row.source) == (measured, verdict, "probe")
    assert "names (not judged): yes: fwd: _fwd_online_tf32_gemm_kernel x3" in row.evidence
    assert v.set_index("id").loc["no_stream_sync", "verdict"] == "PASS"  # other rows untouched


def test_a_probe_that_cannot_measure_leaves_the_row_not_measured_even_when_names_fail():
    v = _verdicts("no")
    judge_precision(v, "not measured (CPU interpreter: no TF32 rounding)", [])
    row = v.set_index("id").loc[PRECISION_CRITERION]
    assert (row.verdict, row.status) == ("-", "not measured (CPU interpreter: no TF32 rounding)")
    assert "names (not judged): no" in row.evidence
