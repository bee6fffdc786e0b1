"""Compile, for Hopper (sm_90), the Triton launches a piece of code makes, on any machine: no GPU needed.

Issue 38 asks that each GEMM kernel of the learner step be shown to compile to warpgroup MMA (`HGMMA` in its SASS,
`wgmma.mma_async` in its PTX) and not to the warp-level `HMMA` / `mma.sync` path that Triton falls back to for
thin tiles, fewer than 4 warps or batched dots (triton-lang/triton#6569, #4336). On a GPU the process's own
compiled kernels give that evidence (hotloop.profiles.kernel_evidence); this module gives it without one:

1. `capture_launches()`: under TRITON_INTERPRET=1 every `kernel[grid](...)` goes through
   `InterpretedFunction.run`; inside this context manager that call is recorded (`Launch`: the kernel's Python
   function, its arguments by name, its launch options) and nothing runs. So the code that launches (a learner
   step at its real shapes) chooses its tiles, warps and constexprs as it would on the GPU, in milliseconds, and
   its outputs are left as they were (garbage for anything downstream: capture one piece of work, then discard it).
2. `compile_launches(launches)`: `triton.compile` of each launch's specialization for GPUTarget("cuda", 90, 32)
   with Triton's own ptxas (the wheel bundles it), in a child process: per launch its PTX and its SASS (from the
   wheel's nvdisasm), for `kernel_evidence.count_text`; `mma_paths` tabulates each launch's matrix path from its
   SASS (HGMMA: warpgroup, HMMA: warp, neither: FP32 FMAs).
3. `dependent_launch_order(launches, compiled)`: per launch, whether one launched with programmatic dependent
   launch waits (`griddepcontrol.wait`) before its first global-memory access, from its PTX: the contract of
   hotloop.kernels.dependent_launch, whose breach is a race no CPU test of the arithmetic can see.

The signature comes from the recorded values: a tensor is a pointer to its dtype (`*fp32`, `*i64`, ...), a bool
`i1`, an int `i32` (`i64` outside int32), a float `fp32`, a constexpr parameter its value. Triton's JIT also marks
integer arguments divisible by 16 and pointers aligned to 16 bytes, which can change the loads it emits but not
which MMA a dot compiles to; those attributes are not set here. The compile uses the installed Triton, which may not
be the one on the GPU (the H200 image has 3.6): the evidence is about this Triton's code generation.

Raises RuntimeError from `capture_launches` when TRITON_INTERPRET is not set (the kernel modules were imported as
compiled kernels: there is nothing to intercept); `compile_launches` raises ValueError for an argument whose type
has no signature and RuntimeError when a compile fails.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch

HOPPER = ("cuda", 90, 32)
"""(backend, compute capability, warp size) of the target: H100 / H200."""

_POINTER = {
    torch.float32: "*fp32",
    torch.float64: "*fp64",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.int16: "*i16",
    torch.int8: "*i8",
    torch.uint8: "*u8",
    torch.bool: "*i1",
}
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl")


@dataclass
class Launch:
    """One recorded launch: `fn` (the kernel's Python function), `name` (its __name__), `args` ({parameter name:
    value}, every parameter, defaults filled), `constexprs` (the names of its tl.constexpr parameters) and
    `options` ({num_warps, num_stages, num_ctas, launch_pdl} as given to the launch; Triton's defaults where
    absent)."""

    fn: Any
    name: str
    args: dict[str, Any]
    constexprs: tuple[str, ...]
    options: dict[str, int | bool] = field(default_factory=dict)


@contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every Triton launch made inside the block instead of running it (module docstring); yields the list
    the launches are appended to, in launch order. Inside the block HOTLOOP_INTERPRET_TF32=1, so that the wrappers
    pass the TF32 rounding constexprs they pass on a GPU (hotloop.kernels._common.rounds_tf32_operands), and the
    launchers under `dependent_launch` pass GDC=True as on a GPU (hotloop.kernels.dependent_launch).
    RuntimeError when the kernels are not interpreted (TRITON_INTERPRET unset), and when a kernel inside the block
    would run instead of being recorded (a `run` attribute set on the kernel instance bypasses the patch)."""
    from hotloop.kernels._common import interpreting

    if not interpreting():
        raise RuntimeError("capture_launches needs TRITON_INTERPRET=1 (set before the kernel modules are imported)")
    from triton.runtime.interpreter import GridExecutor, InterpretedFunction

    launches: list[Launch] = []

    def refuse(self, *args, **kwargs):
        raise RuntimeError(
            f"capture_launches: {self.fn.__name__} ran instead of being recorded: its `run` is set on the kernel "
            "itself (a test's monkeypatch.setattr(kernel, 'run', ...) leaves the bound method there on undo), which "
            "hides the class-level patch; patch it with mock.patch.object, which removes it"
        )

    def record(self, *args, grid, warmup, **kwargs):
        if warmup:
            return None
        options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
        signature = inspect.signature(self.fn)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        constexprs = tuple(n for n, p in signature.parameters.items() if _is_constexpr(p.annotation))
        launches.append(Launch(self.fn, self.fn.__name__, dict(bound.arguments), constexprs, options))
        return None

    # the forward kernels' rounding and PDL constexprs as on the GPU; the launches recorded, not run
    with (
        mock.patch.dict(os.environ, {"HOTLOOP_INTERPRET_TF32": "1"}),
        mock.patch("hotloop.kernels.dependent_launch._compiles_gdc", return_value=True),
        mock.patch.object(InterpretedFunction, "run", record),
        mock.patch.object(GridExecutor, "__call__", refuse),
    ):
        yield launches


def _is_constexpr(annotation: object) -> bool:
    """Whether a parameter annotation is tl.constexpr (the object, or the string under `from __future__ import
    annotations`)."""
    import triton.language as tl

    return annotation is tl.constexpr or (isinstance(annotation, str) and annotation.split(".")[-1] == "constexpr")


def _arg_type(name: str, value: object) -> str:
    """The signature type of one non-constexpr argument (module docstring); ValueError naming it otherwise."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in _POINTER:
            raise ValueError(f"argument {name}: a tensor of dtype {value.dtype} has no pointer type here")
        return _POINTER[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise ValueError(f"argument {name}: {type(value).__name__} has no Triton signature type")


def launch_spec(launch: Launch) -> dict:
    """The JSON-able compile spec of `launch`: module, name, signature ({parameter: type or "constexpr"}), constants
    ({constexpr parameter: value}) and options. ValueError naming an argument without a signature type."""
    signature, constants = {}, {}
    for name, value in launch.args.items():
        if name in launch.constexprs:
            signature[name], constants[name] = "constexpr", value
        else:
            signature[name] = _arg_type(name, value)
    return dict(
        module=launch.fn.__module__,
        name=launch.name,
        signature=signature,
        constants=constants,
        options=dict(launch.options),
    )


def compile_launches(launches: list[Launch], timeout_s: float = 600.0) -> list[dict[str, str]]:
    """Compile each launch for Hopper (HOPPER) and return, per launch in order, {"name", "ptx", "sass"} (the SASS
    disassembled from the cubin with the Triton wheel's nvdisasm).

    The compile runs in a child process (`python -m hotloop.profiles.sm90_compile`, TRITON_INTERPRET=0): in this
    process the kernel modules are interpreted, and the interpreter leaves triton.language patched after a kernel
    has called a jit helper (Triton 3.9's InterpretedFunction.__call__ never restores it), which breaks any later
    compile here. ValueError for an argument without a signature type (before the child starts); RuntimeError with
    the child's error output when a compile fails."""
    import json
    import subprocess
    import sys

    specs = [launch_spec(launch) for launch in launches]
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "hotloop.profiles.sm90_compile"],
        input=json.dumps(specs),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {len(specs)} launches for sm_90 failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


MMA_PATH_COLUMNS = ["kernel", "num_warps", "tiles", "warpgroup_mma", "warp_mma", "fma_f32", "path"]


def mma_paths(launches: list[Launch], compiled: list[dict[str, str]]):
    """The matrix path of each compiled launch, from its SASS (hotloop.profiles.kernel_evidence.count_text): a
    pandas DataFrame of MMA_PATH_COLUMNS, one row per launch in order: kernel, num_warps, tiles (its BLOCK_*
    constexprs, "BLOCK_M=128 BLOCK_N=64 ..."), warpgroup_mma (HGMMA instructions), warp_mma (HMMA), fma_f32 (FFMA)
    and path: "warpgroup" (HGMMA only: Hopper's path), "warp" (HMMA only: the fallback), "mixed", or "none" (no
    matrix instruction: an FP32 FMA dot). ValueError when the two lists differ in length."""
    import pandas as pd

    from hotloop.profiles.kernel_evidence import count_text

    if len(launches) != len(compiled):
        raise ValueError(f"mma_paths: {len(launches)} launches but {len(compiled)} compiled kernels")
    rows = []
    for launch, result in zip(launches, compiled):
        counts = count_text(result["sass"], "sass")
        wg = sum(v for k, v in counts.items() if k.startswith("wgmma."))
        warp = sum(v for k, v in counts.items() if k.startswith("mma."))
        path = {(True, False): "warpgroup", (False, True): "warp", (True, True): "mixed"}.get(
            (wg > 0, warp > 0), "none"
        )
        tiles = " ".join(f"{k}={v}" for k, v in launch.args.items() if k in launch.constexprs and k.startswith("BLOCK"))
        rows.append([launch.name, launch.options.get("num_warps", 4), tiles, wg, warp, counts.get("fma.f32", 0), path])
    return pd.DataFrame(rows, columns=MMA_PATH_COLUMNS)


PDL_ORDER_COLUMNS = ["kernel", "launch_pdl", "waits", "triggers", "wait_line", "first_memory_line", "safe"]
"""The columns of `dependent_launch_order`'s table."""
_GLOBAL_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|ldu|st|atom|red|cp|prefetch)\.(?!param|shared|local|const)")
"""A PTX instruction that may touch global memory: ld / ldu / st / atom / red / prefetch in the global or the generic
state space (a generic address may be global), and every cp.* (cp.async, cp.async.bulk(.tensor): TMA) - all but
those of .param, .shared, .local and .const."""


def dependent_launch_order(launches: list[Launch], compiled: list[dict[str, str]]):
    """Whether each compiled launch keeps the contract of hotloop.kernels.dependent_launch, from its PTX: a pandas
    DataFrame of PDL_ORDER_COLUMNS, one row per launch in order: kernel, launch_pdl (launched with programmatic
    dependent launch), waits / triggers (griddepcontrol.wait / .launch_dependents instructions), wait_line and
    first_memory_line (PTX line numbers of the first wait and of the first global-memory access, -1 where none)
    and safe: True unless the launch is a PDL one whose first global access is not preceded by a wait (it could
    read what the previous kernel has not written yet, or write what it still reads). A launch without PDL is
    safe whatever its code. ValueError when the two lists differ in length."""
    import pandas as pd

    if len(launches) != len(compiled):
        raise ValueError(f"dependent_launch_order: {len(launches)} launches but {len(compiled)} compiled kernels")
    rows = []
    for launch, result in zip(launches, compiled):
        lines = result["ptx"].splitlines()
        waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
        triggers = sum("griddepcontrol.launch_dependents" in line for line in lines)
        memory = next((i for i, line in enumerate(lines) if _GLOBAL_ACCESS.match(line)), -1)
        pdl = bool(launch.options.get("launch_pdl", False))
        wait = waits[0] if waits else -1
        safe = not pdl or (wait >= 0 and (memory < 0 or wait < memory))
        rows.append([launch.name, pdl, len(waits), triggers, wait, memory, safe])
    return pd.DataFrame(rows, columns=PDL_ORDER_COLUMNS)


def _compile_spec(spec: dict) -> dict[str, str]:
    """One spec (launch_spec) compiled in this (non-interpreted) process: {"name", "ptx", "sass"}."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.tools.disasm import get_sass

    fn = getattr(importlib.import_module(spec["module"]), spec["name"])
    source = ASTSource(fn=fn, signature=spec["signature"], constexprs=spec["constants"])
    kernel = triton.compile(source, target=GPUTarget(*HOPPER), options=spec["options"])
    return dict(name=spec["name"], ptx=kernel.asm["ptx"], sass=get_sass(kernel.asm["cubin"]))


def main() -> int:
    """The child of `compile_launches`: a JSON list of specs on stdin, the JSON list of results on stdout."""
    import json
    import sys

    specs = json.loads(sys.stdin.read())
    json.dump([_compile_spec(spec) for spec in specs], sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
