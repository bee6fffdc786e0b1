"""Input checks shared by the kernel launchers, and the Triton-interpreter switch."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def rounds_tf32_operands() -> bool:
    """Whether the TF32 forward kernels round their dot operands to TF32 before the dot (kernels/linear.py says
    why): on the GPU always. On the interpreter, whose dots ignore their precision (a float32 matmul: the algebra
    the CPU tests check at FP32 tolerances), only with HOTLOOP_INTERPRET_TF32=1, which tests that emulate Hopper's
    TF32 dot set (tests/conftest.py `hardware_tf32`): the rounding then runs on the CPU as on the GPU."""
    return not interpreting() or os.environ.get("HOTLOOP_INTERPRET_TF32", "0") == "1"


def check_tensor(name: str, t: object, *, dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
                 ndim: int | None = None, shape: tuple[int | None, ...] | None = None,
                 device: torch.device | None = None, contiguous: bool = True) -> torch.Tensor:
    """Return `t` if it is a tensor matching every given constraint, else raise ValueError naming `name` and what
    was wrong (its dtype, shape or device). `shape` entries of None match any size."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            raise ValueError(f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if shape is not None and (t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape))):
        raise ValueError(f"{name} must have shape {shape} (None = any), got {tuple(t.shape)}")
    if device is not None and t.device.type != torch.device(device).type:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {t.stride()})")
    if not interpreting() and t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}: Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 "
                         f"to run on the CPU interpreter")
    return t
