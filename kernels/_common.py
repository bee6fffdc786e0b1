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


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    kind: str | None = None,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    device: torch.device | str | None = None,
    contiguous: bool = True,
    triton: bool = True,
) -> torch.Tensor:
    """Return `t` if it is a tensor matching every given constraint, else raise ValueError naming `name` and what
    was wrong (its type, dtype, shape, device or strides).

    `dtype`: one dtype or a tuple of allowed ones; `kind`: "float" (any floating dtype) or "int" (any integer
    dtype, bool excluded); `ndim`: the number of dimensions; `shape`: the sizes, None entries matching any size;
    `device`: the device type, and the index too where both name one (cuda:0 is not cuda:1; "cuda" is either);
    `contiguous`: require contiguous strides; `triton` (an input of a Triton launch): require a CUDA tensor unless
    TRITON_INTERPRET=1 runs the kernels on the CPU interpreter (the torch-only code, such as the reference sum tree
    and the replay, passes False, as it runs on any device). Reads only metadata, never values: no host sync."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            raise ValueError(f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}")
    if kind == "float" and not t.dtype.is_floating_point:
        raise ValueError(f"{name} must have a floating-point dtype, got {t.dtype}")
    if kind == "int" and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise ValueError(f"{name} must have an integer dtype, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if shape is not None and (t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape))):
        raise ValueError(f"{name} must have shape {shape} (None = any), got {tuple(t.shape)}")
    if device is not None:
        want = torch.device(device)
        if t.device.type != want.type or (None not in (want.index, t.device.index) and t.device.index != want.index):
            raise ValueError(f"{name} must be on {want}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {t.stride()})")
    if triton and not interpreting() and t.device.type != "cuda":
        raise ValueError(
            f"{name} is on {t.device}: Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 "
            f"to run on the CPU interpreter"
        )
    return t


def check_net_stride(p_zstride: object, *views: tuple[str, torch.Tensor]) -> int:
    """Return `p_zstride` if it is an int >= 0 that keeps the second net's copy of every view inside that view's
    storage, else raise ValueError naming p_zstride (and the view that would run past its storage's end). A launch
    with two nets reads each parameter view (name, tensor) `p_zstride` elements further for net 1: the target net's
    half of the (2, P) flat parameter buffer (hotloop.trainer.flat_net). Reads only metadata: no host sync."""
    if isinstance(p_zstride, bool) or not isinstance(p_zstride, int) or p_zstride < 0:
        raise ValueError(f"p_zstride must be an int >= 0, got {p_zstride!r}")
    for name, v in views:
        if not v.numel():
            continue
        last = v.storage_offset() + p_zstride + sum((n - 1) * s for n, s in zip(v.shape, v.stride()))
        held = v.untyped_storage().nbytes() // v.element_size()
        if last >= held:
            raise ValueError(
                f"p_zstride {p_zstride} puts net 1's {name} past the end of its storage (element {last} of {held}): "
                f"it must be the distance from net 0's parameters to net 1's in one buffer"
            )
    return p_zstride


def check_torch_input(name: str, t: object, **constraints) -> torch.Tensor:
    """`check_tensor` for an input of torch-only code (the reference sum tree, the replay): any strides and any
    device type (no Triton launch reads it): contiguous=False, triton=False, `constraints` as check_tensor's."""
    return check_tensor(name, t, contiguous=False, triton=False, **constraints)
