"""Instruction evidence of a GEMM's precision: the tensor-core instructions of the Triton kernels a process compiled.

A kernel's name says what it was meant to do; its PTX says what it does. `mma_counts` counts, in a compiled
kernel's PTX (or SASS), the matrix instructions by kind and input type:
  mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32      -> "mma.tf32"   (Ampere-style warp MMA, TF32 inputs)
  wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32     -> "wgmma.tf32" (Hopper warpgroup MMA, TF32 inputs)
  ...f16 / bf16 / e4m3 ... inputs                          -> "mma.f16", "wgmma.bf16", ...
and beside them the scalar FP32 FMAs (`fma.rn.f32` -> "fma.f32": an IEEE FP32 dot, `tl.dot(input_precision=
"ieee")`, is made of these and has no MMA) and TF32 conversions (`cvt.rna.tf32.f32` -> "cvt.tf32": Triton's own
"tf32x3" split emits them; hotloop's split does the rounding in integer ops, kernels/tf32_split.py). Totals:
"mma" (every matrix instruction) and "tf32_mma" (those with TF32 inputs). SASS gives the same kinds from
HMMA.1688.F32.TF32 / HGMMA.64x64x8.F32.TF32 / FFMA.
Counts are static (instructions in the code, not executed): a loop body's MMAs count once, whatever the trip count,
and software pipelining may duplicate a body. Same tile, same pipelining: a 3xTF32 product (three TF32 dots per
reduction step: kernels/linear.py `_dot_3xtf32`) has ~3x the TF32 MMAs of a one-dot product; an FP32-FMA dot has
none. Compare kernels at the same tile (the summary gives each specialization's constexprs and warps).

Where the compiled kernels come from: a `triton.jit` function keeps what it compiled in this process in
`JITFunction.device_caches[device]`, a tuple whose first item is the {key: CompiledKernel} cache (Triton 3.x: 4 or
5 items, python/triton/runtime/jit.py); older Triton in `JITFunction.cache[device]`. A CompiledKernel's
`asm` holds the text of each stage ("ttir", "ttgir", "llir", "ptx", the binary "cubin"; "sass" is disassembled
from the cubin on first access with the toolkit's disassembler, python/triton/compiler/compiler.py AsmDict).
Under TRITON_INTERPRET=1 `triton.jit` makes an InterpretedFunction: nothing is compiled, there is no PTX, and every
answer is NOT_AVAILABLE_INTERPRETER.

API: `mma_counts(x)` (PTX/SASS text, a CompiledKernel, or a jit function: the sum over its compiled
specializations, with "specializations" = how many), `compiled_kernels(fn)`, `kernel_summary(fns)` (per kernel
name, per specialization: counts, warps, stages, constexprs), `summary_lines(summary)`; STEP_GEMM_KERNELS names
the learner step's GEMM kernels (kernels/linear.py, kernels/heads.py), `step_gemm_kernels()` returns them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

NOT_AVAILABLE_INTERPRETER = "not available (interpreter)"
"""What every function answers for a kernel run by the Triton CPU interpreter (no compilation, no PTX)."""
NOT_COMPILED = "not available (not compiled in this process)"
"""A jit function that has not been launched (or warmed up) in this process: its caches are empty."""
NO_TEXT = "not available (no {source} text)"
"""A CompiledKernel without the asked text (e.g. no "ptx" on a non-NVIDIA backend, or no disassembler for "sass")."""

STEP_GEMM_KERNELS = {
    "hotloop.kernels.linear": (
        "_fwd_online_tf32_gemm_kernel",
        "_fwd_ddqn_tf32_gemm_kernel",
        "_fwd_grouped_tf32_gemm_kernel",
        "_bwd_dx_fp32split_gemm_kernel",
        "_bwd_dw_fp32split_gemm_kernel",
    ),
    "hotloop.kernels.heads": (
        "_heads_online_tf32_kernel",
        "_heads_ddqn_tf32_kernel",
        "_heads_grouped_tf32_kernel",
        "_heads_bwd_fp32_kernel",
    ),
}
"""Module -> the jit functions of the learner step's GEMMs (forward: TF32 MMAs; backward: 3xTF32 MMAs, or FP32
FMAs for the heads' backward; kernels/linear.py, kernels/heads.py). The forward is either the online and the
Double-DQN kernels (the default) or the grouped ones (Config.grouped_forward): a step compiles one pair, and the
other's summary says "not compiled"."""

_TYPES = {
    "f16",
    "bf16",
    "tf32",
    "f32",
    "f64",
    "e4m3",
    "e5m2",
    "e2m1",
    "e3m2",
    "e2m3",
    "s8",
    "u8",
    "s4",
    "u4",
    "b1",
    "s32",
}
_PTX_MMA = re.compile(r"\b(wgmma\.mma_async|mma\.sync)((?:\.[A-Za-z0-9_]+)+)")
_PTX_FMA = re.compile(r"\bfma\.rn(?:\.ftz)?(?:\.sat)?\.f32\b")
_PTX_CVT_TF32 = re.compile(r"\bcvt\.rna?(?:\.satfinite)?\.tf32\.f32\b")
_SASS_MMA = re.compile(r"\b(HGMMA|HMMA)((?:\.[A-Za-z0-9_]+)+)")
_SASS_FMA = re.compile(r"\bFFMA\b")
_SASS_HINT = re.compile(r"\b(HGMMA|HMMA|FFMA|FADD|FMUL|LDG|STG|EXIT)\b")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def _ptx_kind(family: str, suffix: str) -> str:
    """'mma.tf32' / 'wgmma.bf16' ... from an MMA's suffix: the A operand's type is the second type field
    (mma.sync ... .dtype.atype.btype.ctype; wgmma ... .dtype.atype.btype)."""
    types = [f for f in suffix.split(".") if f in _TYPES]
    a_type = types[1] if len(types) >= 2 else (types[0] if types else "unknown")
    return f"{'wgmma' if family.startswith('wgmma') else 'mma'}.{a_type}"


def _sass_kind(family: str, suffix: str) -> str:
    """'mma.tf32' / 'wgmma.f16' ... from HMMA.1688.F32.TF32 / HGMMA.64x64x16.F32 (one type field: f16 inputs)."""
    types = [f.lower() for f in suffix.split(".") if f.lower() in _TYPES]
    a_type = types[1] if len(types) >= 2 else "f16"
    return f"{'wgmma' if family == 'HGMMA' else 'mma'}.{a_type}"


def count_text(text: str, source: str | None = None) -> dict[str, int]:
    """Instruction counts of one kernel's PTX or SASS `text` (source "ptx", "sass", or None: SASS when it has SASS
    opcodes, else PTX). Comments are ignored (Triton's PTX marks inline asm with "// begin inline asm" lines; the
    MMAs themselves are instruction lines). Returns {kind: count} for each kind present ("mma.tf32", "wgmma.tf32",
    "wgmma.bf16", ..., "fma.f32", "cvt.tf32"), plus "mma" and "tf32_mma" totals (always present, maybe 0).
    Raises ValueError for another source."""
    if source is None:
        source = "sass" if _SASS_HINT.search(text) else "ptx"
    if source not in ("ptx", "sass"):
        raise ValueError(f"source must be 'ptx', 'sass' or None, got {source!r}")
    counts: Counter[str] = Counter()
    if source == "ptx":
        text = _COMMENT.sub("", text)
        counts.update(_ptx_kind(m.group(1), m.group(2)) for m in _PTX_MMA.finditer(text))
        counts["fma.f32"] += len(_PTX_FMA.findall(text))
        counts["cvt.tf32"] += len(_PTX_CVT_TF32.findall(text))
    else:
        counts.update(_sass_kind(m.group(1), m.group(2)) for m in _SASS_MMA.finditer(text))
        counts["fma.f32"] += len(_SASS_FMA.findall(text))
    out = {k: v for k, v in sorted(counts.items()) if v}
    out["mma"] = sum(v for k, v in out.items() if k.startswith(("mma.", "wgmma.")))
    out["tf32_mma"] = sum(v for k, v in out.items() if k in ("mma.tf32", "wgmma.tf32"))
    return out


def _unwrap(fn: object) -> object:
    """The jit function under triton.autotune / triton.heuristics wrappers (their `.fn`)."""
    while (
        not hasattr(fn, "device_caches")
        and not hasattr(fn, "cache")
        and hasattr(fn, "fn")
        and type(fn).__name__ != "InterpretedFunction"
    ):
        fn = fn.fn
    return fn


def _is_interpreted(fn: object) -> bool:
    return type(_unwrap(fn)).__name__ == "InterpretedFunction"


def compiled_kernels(fn: object) -> list | str:
    """The CompiledKernels a jit function compiled in this process (every device, every specialization), or
    NOT_AVAILABLE_INTERPRETER for an interpreted one. [] when it compiled nothing yet. Entries of the cache that
    are not (yet) CompiledKernels (e.g. an asynchronous compile in flight) are left out."""
    fn = _unwrap(fn)
    if _is_interpreted(fn):
        return NOT_AVAILABLE_INTERPRETER
    found = []
    caches = getattr(fn, "device_caches", None)
    if isinstance(caches, Mapping):
        for entry in list(caches.values()):
            cache = entry[0] if isinstance(entry, tuple) and entry else entry
            if isinstance(cache, Mapping):
                found += [k for k in list(cache.values()) if hasattr(k, "asm")]
    legacy = getattr(fn, "cache", None)  # Triton 2.x: {device: {key: CompiledKernel}}
    if not found and isinstance(legacy, Mapping):
        for cache in legacy.values():
            if isinstance(cache, Mapping):
                found += [k for k in cache.values() if hasattr(k, "asm")]
    return found


def _kernel_text(kernel: object, source: str) -> str | None:
    asm = getattr(kernel, "asm", None)
    if asm is None:
        return None
    try:
        text = asm[source]  # "sass": disassembled from the cubin on first access (needs the toolkit's nvdisasm)
    except Exception:  # noqa: BLE001 - a missing stage or disassembler: no evidence, not an error
        return None
    return text if isinstance(text, str) else None


def mma_counts(kernel: object, source: str = "ptx") -> dict[str, int] | str:
    """Instruction counts (`count_text`) of `kernel`: PTX/SASS text (str; source auto-detected), a CompiledKernel
    (its asm[source]), or a jit function (summed over `compiled_kernels`, with "specializations": how many).
    Returns the string NOT_AVAILABLE_INTERPRETER (interpreted function), NOT_COMPILED (a jit function that compiled
    nothing in this process), or NO_TEXT (a kernel without that text) where there is no evidence.
    Raises ValueError for a source other than "ptx" / "sass" or an object that is none of these."""
    if source not in ("ptx", "sass"):
        raise ValueError(f"source must be 'ptx' or 'sass', got {source!r}")
    if isinstance(kernel, str):
        return count_text(kernel)
    if hasattr(kernel, "asm"):
        text = _kernel_text(kernel, source)
        return NO_TEXT.format(source=source) if text is None else count_text(text, source)
    inner = _unwrap(kernel)
    if not (_is_interpreted(inner) or hasattr(inner, "device_caches") or hasattr(inner, "cache")):
        raise ValueError(
            f"mma_counts needs PTX/SASS text, a CompiledKernel or a jit function, got {type(kernel).__name__}"
        )
    kernels = compiled_kernels(kernel)
    if isinstance(kernels, str):
        return kernels
    if not kernels:
        return NOT_COMPILED
    total: Counter[str] = Counter()
    for k in kernels:
        counts = mma_counts(k, source)
        if isinstance(counts, str):
            return counts
        total.update(counts)
    out = {k: v for k, v in sorted(total.items()) if k not in ("mma", "tf32_mma")}
    out.update(mma=total["mma"], tf32_mma=total["tf32_mma"], specializations=len(kernels))
    return out


def _constexprs(kernel: object) -> dict[str, object]:
    """{name: value} of a CompiledKernel's constexpr arguments (its ASTSource's constants), best effort ({})."""
    src = getattr(kernel, "src", None)
    fn, constants = getattr(src, "fn", None), getattr(src, "constants", None)
    names = getattr(fn, "arg_names", None)
    if not isinstance(constants, Mapping) or not names:
        return {}
    out = {}
    for key, value in constants.items():
        idx = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        if isinstance(idx, int) and 0 <= idx < len(names) and isinstance(value, (int, float, str, bool)):
            out[names[idx]] = value
    return dict(sorted(out.items()))


def kernel_summary(fns: Mapping[str, object] | None = None, source: str = "ptx") -> dict[str, list[dict] | str]:
    """Per kernel name (default: `step_gemm_kernels()`), one dict per compiled specialization: the counts of
    `mma_counts` plus "num_warps", "num_stages" (from the kernel's metadata, when it has them) and "constexprs"
    ({name: value}: the tile sizes and flags); or the string saying why there is no evidence (interpreter, not
    compiled, no text)."""
    fns = step_gemm_kernels() if fns is None else fns
    out: dict[str, list[dict] | str] = {}
    for name, fn in fns.items():
        kernels = compiled_kernels(fn)
        if isinstance(kernels, str) or not kernels:
            out[name] = kernels or NOT_COMPILED
            continue
        rows = []
        for k in kernels:
            counts = mma_counts(k, source)
            if isinstance(counts, str):
                rows = counts
                break
            meta = getattr(k, "metadata", None)
            rows.append(
                {
                    **counts,
                    "num_warps": getattr(meta, "num_warps", None),
                    "num_stages": getattr(meta, "num_stages", None),
                    "constexprs": _constexprs(k),
                }
            )
        out[name] = rows
    return out


def summary_lines(summary: Mapping[str, list[dict] | str]) -> list[str]:
    """One line per kernel specialization (or per kernel without evidence) of a `kernel_summary`: its BLOCK_* and
    string constexprs, warps, and nonzero counts, e.g.
    "_bwd_dx_fp32split_gemm_kernel [BLOCK_K=128, ..., 8 warps]: fma.f32=12 wgmma.tf32=96 mma=96 tf32_mma=96"."""
    lines = []
    for name, rows in summary.items():
        if isinstance(rows, str):
            lines.append(f"{name}: {rows}")
            continue
        for row in rows:
            tile = ", ".join(
                f"{k}={v}" for k, v in row.get("constexprs", {}).items() if k.startswith("BLOCK") or isinstance(v, str)
            )  # tiles, and e.g. PRECISION=tf32
            warps = f"{row['num_warps']} warps" if row.get("num_warps") is not None else ""
            where = " [" + ", ".join(x for x in (tile, warps) if x) + "]" if tile or warps else ""
            counts = " ".join(
                f"{k}={v}"
                for k, v in row.items()
                if k not in ("num_warps", "num_stages", "constexprs") and (v or k in ("mma", "tf32_mma"))
            )
            lines.append(f"{name}{where}: {counts}")
    return lines


def step_gemm_kernels() -> dict[str, object]:
    """{name: jit function} of STEP_GEMM_KERNELS (importing their modules)."""
    import importlib

    return {
        name: getattr(importlib.import_module(module), name)
        for module, names in STEP_GEMM_KERNELS.items()
        for name in names
    }
