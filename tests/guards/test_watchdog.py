"""The hang watchdog never lets a run go on unguarded (issue 41 item 1): a limit above threading.TIMEOUT_MAX is bad
input (exit 2 naming --epoch-timeout), a watchdog thread that dies stops the run (exit 70 saying why), and the
gate's "no_hang" says PASS only when the watchdog was alive for the whole of epoch 1."""

import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from hotloop.guards.cli import main
from hotloop.guards.criteria import CRITERIA, verdict_table
from hotloop.guards.watchdog import HangWatchdog

INTERNAL_ERROR = 70

TINY = [
    "--epochs",
    "1",
    "--device",
    "cpu",
    "--set",
    "learner_steps_per_epoch=20",
    "--set",
    "learning_starts=64",
    "--set",
    "batch_size=32",
    "--set",
    "trunk_hidden=[16]",
    "--set",
    "head_hidden=8",
    "--set",
    "eval_episodes=0",
    "--no-progress",
]


@pytest.mark.parametrize("command", ["train", "gate"])
@pytest.mark.parametrize("timeout", ["1e10", "1e308", "inf"])
def test_an_epoch_timeout_above_the_platform_maximum_is_bad_input(command, timeout, tmp_path, capsys):
    """Before: the watchdog thread died of OverflowError ("Exception in thread hotloop-watchdog"), the run went on
    and exited 0, the gate printing "epoch 1 without hang ... PASS". Now: exit 2 naming the flag, nothing written."""
    out = tmp_path / "run"
    assert main([command, "--epoch-timeout", timeout, "--out", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert f"hotloop {command}: error: --epoch-timeout must be at most {threading.TIMEOUT_MAX:g} seconds" in err
    assert "threading.TIMEOUT_MAX" in err and not out.exists()


def test_the_limit_is_checked_against_threading_timeout_max():
    from hotloop.guards.watchdog import MAX_LIMIT_S, check_limit_s

    assert MAX_LIMIT_S == threading.TIMEOUT_MAX
    assert check_limit_s(MAX_LIMIT_S, "x") == MAX_LIMIT_S and check_limit_s(900, "x") == 900.0
    for bad in (0, -1, float("nan"), float("inf"), MAX_LIMIT_S * 2, 1e308):
        with pytest.raises(ValueError, match="^--epoch-timeout must be"):
            check_limit_s(bad, "--epoch-timeout")
    with pytest.raises(ValueError, match="limit_s must be at most"):
        HangWatchdog(1e10)
    with HangWatchdog(60) as wd:
        with pytest.raises(ValueError, match="limit_s must be at most"):
            wd.arm("epoch 1", 1e308)
        wd.arm("epoch 1", 1e9)  # within the maximum: the thread waits in pieces, and stays alive
        time.sleep(0.05)
        wd.disarm()
        assert wd.watched == {"epoch 1": True} and wd.failure is None


def test_a_watchdog_whose_thread_dies_ends_the_process_and_refuses_to_go_on(capsys):
    """The thread's failure is reported with its reason and ends the process (`_exit`, replaced here so the test
    survives it); a period the dead watchdog did not watch to its end is recorded as not watched, and neither
    `disarm` nor the next `arm` lets the run go on."""
    from hotloop.guards.watchdog import WATCHDOG_DIED_EXIT_CODE

    exits = []
    wd = HangWatchdog(60, stream=sys.stderr)
    wd._exit = exits.append
    with wd:
        wd.arm("epoch 1")
        with wd._wake:
            wd._deadline = "broken"  # the thread's next look at the deadline raises TypeError
            wd._wake.notify()
        wd._thread.join(5)
        assert exits == [WATCHDOG_DIED_EXIT_CODE] and isinstance(wd.failure, TypeError)
        with pytest.raises(RuntimeError, match="cannot watch 'epoch 1' to its end: it died: TypeError"):
            wd.disarm()
        assert wd.watched == {"epoch 1": False}
        with pytest.raises(RuntimeError, match="cannot arm 'epoch 2': it died"):
            wd.arm("epoch 2")
    err = capsys.readouterr().err
    assert "hotloop: internal error: the hang watchdog died during 'epoch 1': TypeError" in err
    assert "rather than let it go on unguarded" in err and "Traceback" in err
    with pytest.raises(RuntimeError, match="not running"):
        HangWatchdog(60).arm("epoch 1")  # never started: no silent unguarded period either


_DYING_WATCHDOG = """
import sys, time
import hotloop.guards.run as run

class Dying(run.HangWatchdog):
    def arm(self, label, limit_s=None):
        super().arm(label, limit_s)
        if label == "epoch 1":
            with self._wake:
                self._deadline = "broken"  # the watching thread fails on it (TypeError)
                self._wake.notify()
            time.sleep(2)

run.HangWatchdog = Dying
from hotloop.guards.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["train", "gate"])
def test_a_run_whose_watchdog_dies_stops_with_exit_70_saying_why(command, tmp_path):
    """Before: "Exception in thread hotloop-watchdog", then the epoch went on unguarded and the run exited 0."""
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-c", _DYING_WATCHDOG, command, "--out", str(out), *TINY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == INTERNAL_ERROR, res.stderr
    assert "hotloop: internal error: the hang watchdog died during 'epoch 1': TypeError" in res.stderr
    assert f"full traceback in {out / 'error.log'}" in res.stderr and "Traceback" in (out / "error.log").read_text()
    assert not (out / "criteria.json").exists() and "PASS" not in res.stdout


def _hang_row(watched):
    from hotloop.guards.gate import judge_hang

    verdicts = verdict_table({}, CRITERIA).assign(source="", evidence="")
    judge_hang(verdicts, watched)
    return verdicts.set_index("id").loc["no_hang"]


def test_epoch_1_without_hang_passes_only_when_the_watchdog_watched_all_of_epoch_1():
    row = _hang_row({"setup": True, "epoch 1": True})
    assert (row.measured, row.verdict, row.status, row.source) == ("yes", "PASS", "measured", "watchdog")
    row = _hang_row({"setup": True, "epoch 1": False})
    assert (row.measured, row.verdict, row.status) == ("no", "FAIL", "measured")
    assert "not alive for the whole of epoch 1" in row.evidence
    row = _hang_row({"epoch 3": True})  # epoch 1 did not run under this watchdog
    assert (row.verdict, row.status) == ("-", "not measured (epoch 1 did not run under the watchdog)")
    assert isinstance(_hang_row({}), pd.Series)


def test_the_gate_reads_the_watchdogs_record(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["gate", "--out", str(out), "--guard-steps", "2", "--guard-warmup", "0", *TINY]) == 0
    row = pd.read_csv(out / "criteria.csv").set_index("id").loc["no_hang"]
    assert (row.verdict, row.status, row.source) == ("PASS", "measured", "watchdog")
    assert row.evidence == "epoch 1 finished under the hang watchdog, alive from its start to its end"
