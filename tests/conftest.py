"""Test-suite wiring: without CUDA the Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1, set before any
kernel module is imported); hotloop's pytest plugin (guards/pytest_plugin.py, loaded by
its pytest11 entry point once hotloop is installed) registers the gpu/perf/smoke markers,
skips gpu and perf tests with the reason on a machine without CUDA, and gives the `guard` / `assert_criteria`
fixtures. The `hardware_tf32` fixture (Hopper's TF32 dots emulated on the interpreter) serves the kernel and the
precision-probe tests."""

import os

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
    docstring): "tf32" truncates both fp32 operands to TF32, "tf32x3" does Triton's hi/lo split, "ieee" stays fp32.
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
    return stats
