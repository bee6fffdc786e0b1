"""The ceiling of issue 38's split-K lever: the weight-gradient GEMM's epilogue, fp32 atomic adds into the zeroed
gradient buffer (the step's `linear_backward_weight`) against each split storing its partial product into a slab of
its own (the producer half of a "partial sums reduced where they are consumed" design), at several split counts,
at the seed-scale step's two weight-gradient launches.

`PYTHONPATH=results python -m lab.dw_epilogue_probe [--scales 1,2,4] [--repeats R] [--csv OUT.csv]`

Cases (SHAPES): the trunk's second layer (dW 256 x 512) and the heads' hidden layer (dW 320 x 256), both over the
8192-row batch, dY^T and X^T as the step lays them out (K-major, X^T split into TF32 parts). Variants, each a copy of
kernels/linear.py loaded as its own module (`variant_module`, the source patched, the step's file untouched):
`atomic` (the kernel as the step runs it) and `partials` (its dW epilogue a plain store into slab `split` of an
(S, N, K) buffer; the gain gradient's atomics kept), each with the launcher's program floor (_MIN_PROGRAMS, 132)
times each of --scales: more splits of the batch, more and shorter programs. Each configuration is timed with
triton.testing.do_bench_cudagraph (launches replayed from a CUDA graph, as in the step: a plain do_bench times the
Python launcher's ~70 us instead of the kernel; median ms of R ms of repeats). `partials` leaves the sum of the slabs to
its consumer (grad-norm and Adam would read S slabs instead of one buffer): its time is a lower bound of that
design's producer cost, and the difference to `atomic` at the same splits the most that design can win before its
consumer pays for reading S x N x K floats (~N K S x 4 bytes at HBM speed). `check_variant` verifies on any device
that the slabs sum to the atomic result (the CPU test runs it on the interpreter).

Prints a table; with --csv appends rows (COLUMNS). Raises SystemExit without a GPU. The prediction and outcome go to
results/h200/notes/bench_notes.md.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import datetime as dt
import functools
import importlib.util
import inspect
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch

import hotloop.kernels.linear as linear
from hotloop.profiles.provenance import commit_id, device_name

SHAPES = {"trunk2": (256, 512), "heads_hidden": (320, 256)}
"""{case: (N, K)} of the seed-scale step's weight-gradient launches (dW is N x K; the batch M = 8192)."""
BATCH = 8192
COLUMNS = ["commit", "date", "gpu", "case", "variant", "scale", "programs", "splits", "median_us", "note"]

_ATOMIC = 'tl.atomic_add(dw_ptr + offs_n[:, None] * K + offs_k[None, :], acc * g[:, None], mask=mask, sem="relaxed")'
_STORE = "tl.store(dw_ptr + split * N * K + offs_n[:, None] * K + offs_k[None, :], acc * g[:, None], mask=mask)"


@functools.cache
def _copies_dir() -> Path:
    """One temporary folder per process for the source copies (removed at exit)."""
    folder = tempfile.TemporaryDirectory(prefix="lab_dw_")
    atexit.register(folder.cleanup)
    return Path(folder.name)


def positive_ints(text: str) -> list[int]:
    """--scales / --repeats: comma-separated ints >= 1 (an argparse type; ArgumentTypeError otherwise)."""
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


def variant_module(variant: str, scale: int) -> ModuleType:
    """A copy of kernels/linear.py as module `lab_dw_<variant>_<scale>`: _MIN_PROGRAMS times `scale`, and for
    `variant` "partials" the dW epilogue `_STORE` instead of `_ATOMIC`. ValueError for another variant or a scale
    < 1; RuntimeError when the step's source no longer holds the patched lines (update this probe)."""
    if variant not in ("atomic", "partials") or scale < 1:
        raise ValueError(f"variant must be atomic or partials and scale >= 1, got {variant!r}, {scale}")
    text = Path(inspect.getsourcefile(linear)).read_text()
    floor = "_MIN_PROGRAMS = 132"
    if text.count(floor) != 1 or text.count(_ATOMIC) != 1:
        raise RuntimeError("kernels/linear.py changed: its program floor or dW epilogue is not where this probe looks")
    text = text.replace(floor, f"_MIN_PROGRAMS = {132 * scale}")
    if variant == "partials":
        text = text.replace(_ATOMIC, _STORE)
    name = f"lab_dw_{variant}_{scale}"
    path = _copies_dir() / f"{name}.py"
    path.write_text(text)  # Triton's JIT reads a kernel's source from its file: the copy needs one
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def inputs(n: int, k: int, m: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random operands of one dW launch: dyt (N, M), xt (2, K, M) (hi, lo: kernels/tf32_split.split_tf32 of
    X^T), w (N, K), g (N,) (gain_group 1)."""
    from hotloop.kernels.tf32_split import split_tf32

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    return dict(
        dyt=torch.randn(n, m, generator=gen).to(device),
        xt=split_tf32(x.T.contiguous()).to(device),
        w=torch.randn(n, k, generator=gen).to(device),
        g=(1 + torch.rand(n, generator=gen)).to(device),
    )


def launch(module: ModuleType, ops: dict[str, torch.Tensor], out: torch.Tensor) -> None:
    """One `linear_backward_weight` of `module` into `out`: (N, K), or (S, N, K) slabs for partials (slab 0 is
    passed; the kernel writes slab `split` past it)."""
    dw = out[0] if out.dim() == 3 else out
    module.linear_backward_weight(ops["dyt"], ops["xt"], ops["w"], ops["g"], dw, None, 1)


def launch_grid(module: ModuleType, ops: dict[str, torch.Tensor]) -> tuple[int, int, int]:
    """The grid `module`'s launcher picks for `ops` (its own rule, read from the launch it makes: the kernel is
    swapped for a recorder for the call, nothing runs); its third axis is the split count."""
    seen = []
    kernel = module._bwd_dw_fp32split_gemm_kernel

    class Recorder:
        def __getitem__(self, grid):
            seen.append(grid)
            return lambda *args, **kwargs: None

    module._bwd_dw_fp32split_gemm_kernel = Recorder()
    try:
        launch(module, ops, torch.empty_like(ops["w"]))
    finally:
        module._bwd_dw_fp32split_gemm_kernel = kernel
    return tuple(seen[0])


def check_variant(scale: int, n: int, k: int, m: int, device: torch.device) -> float:
    """max |sum of the partials' slabs - the atomic result| / max |atomic result| at one shape: the partials
    variant computes the same dW (only the epilogue differs)."""
    atomic, partials = variant_module("atomic", scale), variant_module("partials", scale)
    ops = inputs(n, k, m, device)
    ref = torch.zeros(n, k, device=device)
    launch(atomic, ops, ref)
    s = launch_grid(partials, ops)[2]
    slabs = torch.full((s, n, k), float("nan"), device=device)
    launch(partials, ops, slabs)
    return float((slabs.sum(0) - ref).abs().max() / ref.abs().max())


def run(scales: list[int], repeats: int, device: torch.device) -> list[dict]:
    """The table's rows: every case x variant x scale timed (module docstring)."""
    import triton.testing

    stamp = dict(commit=commit_id(), date=dt.date.today().isoformat(), gpu=device_name(device))
    rows = []
    for case, (n, k) in SHAPES.items():
        ops = inputs(n, k, BATCH, device)
        for scale in scales:
            for variant in ("atomic", "partials"):
                module = variant_module(variant, scale)
                grid = launch_grid(module, ops)
                s = grid[2]
                out = torch.zeros((s, n, k) if variant == "partials" else (n, k), device=device)
                fn = lambda: launch(module, ops, out)  # noqa: E731
                fn()  # compiled before the capture
                ms = triton.testing.do_bench_cudagraph(fn, rep=repeats, return_mode="median")
                rows.append(
                    dict(
                        stamp,
                        case=case,
                        variant=variant,
                        scale=scale,
                        programs=grid[0] * grid[1] * s,
                        splits=s,
                        median_us=ms * 1e3,
                        note="" if variant == "atomic" else f"slabs to sum: {s * n * k * 4 / 1e6:.1f} MB",
                    )
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring): check the variants, time them, print the table, append --csv; 0.
    argparse's exit 2 for a bad --scales / --repeats; SystemExit without a GPU or when a variant's slabs differ."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--scales", type=positive_ints, default=[1, 2, 4], help="comma-separated multiples of the 132-program floor"
    )
    p.add_argument(
        "--repeats",
        type=positive_ints,
        default=[200],
        help="do_bench_cudagraph's rep (ms of repeats per configuration)",
    )
    p.add_argument("--csv", type=Path, help="append the rows to this CSV")
    args = p.parse_args(argv)
    scales, repeats = args.scales, args.repeats[0]
    if not torch.cuda.is_available():
        raise SystemExit("dw_epilogue_probe: needs a CUDA GPU")
    device = torch.device("cuda")
    for scale in scales:
        err = check_variant(scale, 256, 512, 2048, device)
        if not err < 1e-5:
            raise SystemExit(f"partials at scale {scale}: slabs differ from the atomic result by {err:.2e}")
    rows = run(scales, repeats, device)
    import pandas as pd

    table = pd.DataFrame(rows, columns=COLUMNS)
    print(table[["case", "variant", "scale", "programs", "splits", "median_us", "note"]].to_string(index=False))
    if args.csv:
        new = not args.csv.exists()
        with args.csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            if new:
                writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
