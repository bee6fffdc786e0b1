"""Input files are bad input (exit 2, the file named), never an internal error or a wait (issue 41 items 4 and 7):
a config or baseline that is a device (/dev/zero), a FIFO or larger than its cap
(hotloop.profiles.input_files), a resumed run's epochs.csv holding text where a run writes numbers
(hotloop.profiles.epoch_table.check_epoch_rows: the file, row and field named), and `hotloop inspect` on a FIFO
without a writer."""

import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hotloop.guards.cli import main

MAX_CONFIG_BYTES = 1 << 20
"""hotloop.profiles.input_files.MAX_CONFIG_BYTES (imported inside the tests of the reader itself, so that the
CLI tests also run, and fail, on code without it)."""

RUN = [
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
    "eval_episodes=4",
    "--no-progress",
]
MEMORY_LIMIT = 6 << 30
"""Address-space limit of the CLI subprocesses: reading /dev/zero whole (the old behaviour) ends in a MemoryError
there instead of taking this machine's memory."""


def _hotloop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`hotloop ARGS` in a subprocess with MEMORY_LIMIT; a wait on a FIFO shows as subprocess.TimeoutExpired."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "hotloop.guards.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )


@pytest.fixture
def fifo(tmp_path) -> Path:
    """A FIFO with no writer (an open for reading would wait forever)."""
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def test_the_reader_refuses_what_is_not_a_regular_file_and_what_is_too_large(tmp_path, fifo):
    from hotloop.profiles import input_files
    from hotloop.profiles.input_files import InputFileError, open_input, read_input_bytes

    assert input_files.MAX_CONFIG_BYTES == MAX_CONFIG_BYTES
    for path, kind in (
        (fifo, "a FIFO (named pipe)"),
        (Path("/dev/zero"), "a character device"),
        (tmp_path, "a folder"),
    ):
        with pytest.raises(
            InputFileError,
            match=re.escape(
                f"{path}: not a regular file: it is {kind}; hotloop reads a config file only from a regular file"
            ),
        ):
            read_input_bytes(path, "config file", MAX_CONFIG_BYTES)
        with pytest.raises(InputFileError, match="not a regular file"):
            open_input(path, "trace")
    with pytest.raises(InputFileError, match="cannot read: No such file") as missing:
        read_input_bytes(tmp_path / "nope.json", "config file", MAX_CONFIG_BYTES)
    assert missing.value.missing
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    with pytest.raises(
        InputFileError, match=f"{big}: is {MAX_CONFIG_BYTES + 1} bytes, more than the 1 MiB a config file may have"
    ):
        read_input_bytes(big, "config file", MAX_CONFIG_BYTES)
    small = tmp_path / "small.json"
    small.write_bytes(b"{}")
    assert read_input_bytes(small, "config file", 2) == b"{}"
    with pytest.raises(InputFileError, match="small.json: is 2 bytes, more than the 1 byte a config file may have"):
        read_input_bytes(small, "config file", 1)
    if os.path.isfile("/proc/self/status"):  # its size reads 0: the cap holds on what is read
        with pytest.raises(InputFileError, match="holds more than the 10 bytes a config file may have"):
            read_input_bytes("/proc/self/status", "config file", 10)


def test_a_config_or_baseline_that_is_a_device_fifo_or_too_large_exits_2_naming_it(tmp_path, fifo):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(2 * MAX_CONFIG_BYTES)
    out = tmp_path / "run"
    cases = [
        (["train", "--config", "/dev/zero"], "config file /dev/zero: not a regular file: it is a character device"),
        (
            ["gate", "--baseline", "/dev/zero", *RUN, "--epochs", "1"],
            "/dev/zero: not a regular file: it is a character device; hotloop reads a baseline only",
        ),
        (["train", "--config", str(fifo)], f"config file {fifo}: not a regular file: it is a FIFO"),
        (["gate", "--baseline", str(fifo), *RUN, "--epochs", "1"], f"{fifo}: not a regular file: it is a FIFO"),
        (
            ["train", "--config", str(big)],
            f"config file {big}: is {2 * MAX_CONFIG_BYTES} bytes, more than the 1 MiB a config file may have",
        ),
    ]
    for argv, message in cases:
        proc = _hotloop(*argv, "--out", str(out))
        assert proc.returncode == 2, (argv, proc.stderr[-2000:])
        assert message in proc.stderr and "internal error" not in proc.stderr, (argv, proc.stderr[-2000:])
        assert not out.exists()


def test_inspect_refuses_a_fifo_and_a_device_without_waiting(tmp_path, fifo):
    proc = _hotloop("inspect", str(fifo), "/dev/zero", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert (
        f"hotloop inspect: error: {fifo}: not a regular file: it is a FIFO (named pipe); hotloop reads a trace "
        f"only from a regular file"
    ) in proc.stderr
    assert "hotloop inspect: error: /dev/zero: not a regular file: it is a character device" in proc.stderr


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run folder of two finished epochs (tiny CPU run); copy it before changing it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", *RUN, "--epochs", "2", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(
    "field,value,problem",
    [
        ("epoch", "two", "'two' is not a number"),
        ("env_steps", "1.5", "1.5 is not a whole number >= 0"),
        ("loss", "0.5x", "'0.5x' is not a number"),
        ("learner_steps", "", "empty, and every row of a run's table has it"),
    ],
)
def test_a_resumed_runs_table_with_text_for_a_number_exits_2_naming_file_row_and_field(
    finished_run, tmp_path, capsys, field, value, problem
):
    run = Path(shutil.copytree(finished_run, tmp_path / "run"))
    table = run / "epochs.csv"
    lines = table.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[2].rstrip("\n").split(",")
    cells[header.index(field)] = value
    lines[2] = ",".join(cells) + "\n"
    table.write_text("".join(lines))
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{table}: row 2, field {field!r}: {problem}; the file was changed or damaged" in err, err
    assert "internal error" not in err
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing written


def test_a_resumed_runs_checkpoint_that_is_a_fifo_is_refused_unopened(finished_run, tmp_path, capsys):
    run = Path(shutil.copytree(finished_run, tmp_path / "run"))
    (run / "checkpoint.pt").unlink()
    os.mkfifo(run / "checkpoint.pt")
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {run / 'checkpoint.pt'}: no such file (it is a FIFO (named pipe), not a regular file)" in err
