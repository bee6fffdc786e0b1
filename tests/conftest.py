"""Test-suite wiring: without CUDA the Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1, set before any
kernel module is imported); hotloop's pytest plugin (guards/pytest_plugin.py, loaded by
its pytest11 entry point once hotloop is installed) registers the gpu/perf/smoke markers,
skips gpu and perf tests with the reason on a machine without CUDA, and gives the `guard` / `assert_criteria`
fixtures. The `hardware_tf32` fixture (Hopper's TF32 dots emulated on the interpreter) serves the kernel and the
precision-probe tests; `lock_holder` (another process holding a run folder's lock) the run-lock and resume tests."""

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _trunc(x: np.ndarray) -> np.ndarray:
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.fixture
def hardware_tf32(monkeypatch):
    """Patch the Triton interpreter's dot as Hopper's tensor cores compute (tests/kernels/test_tf32_emulated.py's
    docstring): "tf32" truncates both fp32 operands to TF32, "tf32x3" does Triton's hi/lo split, "ieee" stays fp32;
    and the forward kernels round their operands to TF32 first, as they do on the GPU (HOTLOOP_INTERPRET_TF32=1,
    hotloop.kernels._common.rounds_tf32_operands).
    Yields counters: TF32 dots, those with an operand that had low bits to drop, and tf32x3 dots."""
    if torch.cuda.is_available():
        pytest.skip("emulates the tensor cores on the CPU interpreter; on a GPU the hardware truncates")
    interp = pytest.importorskip("triton.runtime.interpreter")
    builder = getattr(interp, "InterpreterBuilder", None)
    if builder is None or not hasattr(builder, "create_dot"):
        pytest.skip("this Triton's interpreter has no InterpreterBuilder.create_dot to patch")
    from triton._C.libtriton import ir

    from hotloop.kernels.tf32_split import split_tf32

    original = builder.create_dot
    stats = {"tf32": 0, "tf32_inexact": 0, "tf32x3": 0}

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        x, y = a.data, b.data
        if x.dtype == np.float32 and y.dtype == np.float32:
            if input_precision == ir.INPUT_PRECISION.TF32:
                tx, ty = _trunc(x), _trunc(y)
                stats["tf32"] += 1
                stats["tf32_inexact"] += int(not (np.array_equal(tx, x) and np.array_equal(ty, y)))
                return interp.TensorHandle(np.matmul(tx, ty, dtype=np.float32) + d.data, d.dtype.scalar)
            if input_precision == ir.INPUT_PRECISION.TF32x3:
                stats["tf32x3"] += 1
                (xh, xl), (yh, yl) = (split_tf32(torch.from_numpy(t)).numpy() for t in (x, y))
                r = np.matmul(xl, yh, dtype=np.float32) + np.matmul(xh, yl, dtype=np.float32)
                return interp.TensorHandle(r + np.matmul(xh, yh, dtype=np.float32) + d.data, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(builder, "create_dot", create_dot)
    monkeypatch.setenv("HOTLOOP_INTERPRET_TF32", "1")  # the forward kernels round their operands, as on the GPU
    return stats


class LockHolder:
    """Another process holding a run folder's lock, as any holder would: a plain `python -c` with flock on the lock
    file and its pid written in it, until its stdin ends (hotloop.profiles.run_lock)."""

    script = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
sys.stdin.read()
"""
    """The holder's program: argv[1] is the lock file; it exits non-zero (BlockingIOError) if the lock is held."""

    @staticmethod
    @contextmanager
    def hold(run_dir: Path):
        """A child process holding run_dir's lock until the block ends; yields its Popen."""
        from hotloop.profiles.run_lock import LOCK_FILE

        proc = subprocess.Popen(
            [sys.executable, "-c", LockHolder.script, str(run_dir / LOCK_FILE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "locked"
            yield proc
        finally:
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(timeout=30)

    @staticmethod
    def killed(run_dir: Path) -> int:
        """Lock run_dir from a child process, SIGKILL it, and return its (now dead) pid: a stale lock file."""
        with LockHolder.hold(run_dir) as proc:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return proc.pid


@pytest.fixture
def lock_holder() -> type[LockHolder]:
    """`LockHolder`: .hold(run_dir) (a context manager), .killed(run_dir) (a stale lock's pid), .script."""
    return LockHolder
