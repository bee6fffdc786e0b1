"""Synthetic torch.profiler (Kineto) Chrome-trace JSON of any size, for benchmarking and testing trace readers.

`PYTHONPATH=results python -m lab.trace_synth --events N --out F.json[.gz] [--seed S]` writes a trace of exactly N
`traceEvents` entries (gzip-compressed when F ends in .gz) and prints, as JSON, what it wrote (`SynthSummary`).

What a file holds, modelled on the real traces of tests/data/traces/ (the HTA test traces and the H200 probe)
and laid out as Kineto's own writer lays them out (`libkineto/src/output_json.cpp`: one event per block,
two-space indent, args on their own lines), so that bytes per event are those of a real trace (~300-330):
a metadata header (process/thread names: "ph" "M"), a "Trace" span, then training steps, each a
`ProfilerStep#N` user_annotation holding forward/backward record_function ranges, python_function frames,
cpu_op ATen ops (with record_shapes' Input Dims / Input type / Input Strides), cudaLaunchKernel runtime calls and
the kernels they launch (correlation ids, grid/block/stream/device args, ac2g flow events "s"/"f"),
cuLaunchKernel driver launches (Triton kernels), cudaMemcpyAsync + gpu_memcpy (HtoD/DtoH/DtoD with bytes),
cudaMemsetAsync + gpu_memset, a cudaGraphLaunch whose kernels all carry its correlation id, cudaStreamSynchronize
and cudaDeviceSynchronize calls, and gpu_user_annotation ranges on the GPU timeline. Like real traces it is
dominated by cpu_op and python_function events, and a few events have dur 0 (Kineto writes those).

Deterministic for a given (events, seed). Memory is bounded (events are written in batches as they are made).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

_HEADER = """{
  "schemaVersion": 1,
  "deviceProperties": [
    {
      "id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
      "computeMajor": 9, "computeMinor": 0,
      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
      "regsPerBlock": 65536, "warpSize": 32,
      "sharedMemPerBlock": 49152, "numSms": 132
    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472
    }
  ],
  "cupti_version": 130001,
  "cuda_runtime_version": 13000,
  "cuda_driver_version": 13000,
  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
  "traceEvents": ["""

_FOOTER = """
  ],
  "traceName": "synthetic.pt.trace.json",
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1790857026000000000
}
"""

_PID, _TID, _BWD_TID, _STREAM = 4131, 4131, 4177, 7
_KERNELS = (
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"
        "(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        (1024, 1, 1),
        (128, 1, 1),
    ),
    (
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        (8, 16, 1),
        (384, 1, 1),
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
        "unsigned int, float, 4, 4>)",
        (1, 1, 1),
        (32, 16, 1),
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
        "(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
        (64, 1, 1),
        (128, 1, 1),
    ),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        (256, 1, 1),
        (512, 1, 1),
    ),
)
_TRITON = ("triton_per_fused_gather_max_mul_sub_0", (16, 1, 1), (256, 1, 1))
_OPS = (  # (forward op, inner op, kernel index, input dims)
    ("aten::linear", "aten::addmm", 1, "[[256, 64], [128, 64], [128]]"),
    ("aten::add", "aten::add_", 0, "[[256, 128], [256, 128], []]"),
    ("aten::relu", "aten::clamp_min", 0, "[[256, 128]]"),
    ("aten::sum", "aten::sum", 2, "[[256, 128], [], []]"),
    ("aten::softmax", "aten::_softmax", 4, "[[256, 10], [], []]"),
    ("aten::zero_", "aten::fill_", 3, "[[128, 64]]"),
)
_PY_FRAMES = (
    "train.py(88): step",
    "torch/nn/modules/module.py(1773): _wrapped_call_impl",
    "torch/nn/modules/module.py(1784): _call_impl",
    "torch/nn/modules/linear.py(125): forward",
    "torch/nn/functional.py(1704): relu",
    "<built-in method linear of type object at 0x7f3a9c2b1e40>",
    "torch/_tensor.py(626): backward",
    "torch/autograd/__init__.py(354): backward",
    "torch/optim/optimizer.py(487): wrapper",
    "torch/optim/adam.py(213): step",
)
_COPIES = (
    ("HtoD", "Host -> Device", "Pageable"),
    ("DtoH", "Device -> Host", "Pageable"),
    ("DtoD", "Device -> Device", "Device"),
)


@dataclass
class SynthSummary:
    """What `write_trace` wrote: the path, the byte size on disk (compressed size for .gz) and of the JSON text,
    the number of traceEvents entries, and counts by (ph, cat) as "ph/cat" strings (cat "" for events without one)
    plus the guard counts a reader must find (kernels, grid (1,1,1) kernels, DtoD memcpys, memsets, sync calls by
    API, graph launches and the kernels they carry)."""

    path: str
    file_bytes: int
    json_bytes: int
    events: int
    by_ph_cat: dict[str, int] = field(default_factory=dict)
    kernels: int = 0
    kernels_grid1: int = 0
    memcpy_dtod_events: int = 0
    memset_events: int = 0
    sync_calls: dict[str, int] = field(default_factory=dict)
    graph_launches: int = 0
    kernels_in_graphs: int = 0


class _Writer:
    """Formats events the way Kineto's writer does and counts them; `done` once `limit` events are out."""

    def __init__(self, out, limit: int, rng: random.Random) -> None:
        self.out, self.limit, self.rng = out, limit, rng
        self.n = 0
        self.parts: list[str] = []
        self.counts: Counter[str] = Counter()
        self.ts = 5112610491155000  # ns
        self.corr = 1
        self.ext = 1
        self.py_id = 1
        self.ev_idx = 0

    @property
    def done(self) -> bool:
        return self.n >= self.limit

    def _emit(self, key: str, text: str) -> None:
        if self.n >= self.limit:
            return
        self.parts.append(text if self.n == 0 else "," + text)
        self.n += 1
        self.counts[key] += 1
        if len(self.parts) >= 4096:
            self.flush()

    def flush(self) -> None:
        self.out.write("".join(self.parts))
        self.parts.clear()

    def tick(self, ns: int) -> int:
        self.ts += ns
        return self.ts

    @staticmethod
    def _us(ns: int) -> str:
        return f"{ns // 1000}.{ns % 1000:03d}"

    def x(self, cat: str, name: str, ts: int, dur: int, args: str, pid=_PID, tid=_TID) -> None:
        pid_s = pid if isinstance(pid, int) else json.dumps(pid)
        tid_s = tid if isinstance(tid, int) else json.dumps(tid)
        self._emit(
            f"X/{cat}",
            f"""
  {{
    "ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid_s}, "tid": {tid_s},
    "ts": {self._us(ts)}, "dur": {self._us(dur)},
    "args": {{
      {args}
    }}
  }}""",
        )

    def flow(self, ph: str, corr: int, ts: int, pid=_PID, tid=_TID) -> None:
        bp = ', "bp": "e"' if ph == "f" else ""
        self._emit(
            f"{ph}/ac2g",
            f"""
  {{
    "ph": "{ph}", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {self._us(ts)},
    "cat": "ac2g", "name": "ac2g"{bp}
  }}""",
        )

    def meta(self, name: str, pid, tid, value: str) -> None:
        self._emit(
            "M/",
            f"""
  {{
    "name": "{name}", "ph": "M", "ts": {self._us(self.ts)}, "pid": {pid}, "tid": {tid},
    "args": {{
      "name": "{value}"
    }}
  }}""",
        )

    def instant(self, name: str) -> None:
        self._emit(
            "i/",
            f"""
  {{
    "name": "{name}", "ph": "i", "s": "g",
    "pid": "Traces", "tid": "PyTorch Profiler", "ts": {self._us(self.ts)}
  }}""",
        )

    # -- composite pieces -------------------------------------------------------------------------------------
    def python(self, name: str, ts: int, dur: int, tid=_TID) -> None:
        self.py_id += 1
        self.x(
            "python_function",
            name,
            ts,
            dur,
            f'"Python parent id": {self.py_id - 1}, "Python id": {self.py_id}, "Python thread": 0',
            tid=tid,
        )

    def cpu_op(self, name: str, ts: int, dur: int, dims: str, tid=_TID) -> int:
        self.ext += 1
        self.ev_idx += 1
        n = dims.count("[") - 1 if dims != "[]" else 0
        types = ", ".join(['"float"'] * n)
        strides = dims.replace("256, 64", "64, 1").replace("128, 64", "64, 1").replace("256, 128", "128, 1")
        self.x(
            "cpu_op",
            name,
            ts,
            dur,
            f'"External id": {self.ext},"Record function id": 0, "Concrete Inputs": [{", ".join([chr(34) * 2] * n)}], '
            f'"Input type": [{types}], "Input Strides": {strides}, "Input Dims": {dims}, '
            f'"Ev Idx": {self.ev_idx}',
            tid=tid,
        )
        return self.ext

    def kernel(self, k: tuple, ts: int, dur: int, corr: int, ext: int) -> None:
        name, grid, block = k
        g, b = grid, block
        self.x(
            "kernel",
            name,
            ts,
            dur,
            f'"External id": {ext},      "queued": 0, "device": 0, "context": 1,      "stream": {_STREAM}, '
            f'"correlation": {corr},      "registers per thread": 40,      "shared memory": 0,      '
            f'"blocks per SM": {g[0] * g[1] * g[2] / 132:.6f},      "warps per SM": {g[0] * b[0] / 32 / 132:.6f},      '
            f'"grid": [{g[0]}, {g[1]}, {g[2]}],      "block": [{b[0]}, {b[1]}, {b[2]}],      '
            f'"est. achieved occupancy %": 75',
            pid=0,
            tid=_STREAM,
        )

    def launch(self, api: str, cat: str, ts: int, ext: int) -> int:
        self.corr += 1
        cbid = 211 if cat == "cuda_runtime" else 307
        self.x(
            cat,
            api,
            ts,
            4200 + self.rng.randrange(3000),
            f'"External id": {ext}, "cbid": {cbid}, "correlation": {self.corr}',
        )
        self.flow("s", self.corr, ts)
        return self.corr


def _kernel(w: _Writer, k: tuple, ts: int, dur: int, corr: int, ext: int, stats: Counter, graph: bool) -> None:
    before = w.counts["X/kernel"]
    w.kernel(k, ts, dur, corr, ext)
    if w.counts["X/kernel"] > before:
        stats["kernels"] += 1
        stats["kernels_grid1"] += k[1] == (1, 1, 1)
        stats["kernels_in_graphs"] += graph


def _api(w: _Writer, api: str, ts: int, ext: int, stats: Counter, cat: str = "cuda_runtime") -> int:
    before = w.counts[f"X/{cat}"]
    corr = w.launch(api, cat, ts, ext)
    if w.counts[f"X/{cat}"] > before:
        if "Synchronize" in api:
            stats[f"sync:{api}"] += 1
        if api == "cudaGraphLaunch":
            stats["graph_launches"] += 1
    return corr


def _step(w: _Writer, step: int, stats: Counter) -> None:
    rng = w.rng
    start = w.tick(20_000)
    w.ext += 1
    step_ext = w.ext
    ops = rng.randrange(8, 14)
    w.x(
        "user_annotation",
        f"ProfilerStep#{step}",
        start,
        ops * 90_000 + 400_000,
        f'"External id": {step_ext}, "Record function id": 0, "Ev Idx": {w.ev_idx}',
    )
    w.x(
        "gpu_user_annotation",
        f"ProfilerStep#{step}",
        start + 30_000,
        ops * 90_000 + 300_000,
        f'"External id": {step_ext}',
        pid=0,
        tid=_STREAM,
    )
    w.python("train.py(88): step", w.tick(1_000), ops * 90_000 + 350_000)
    phase_ts = w.tick(2_000)
    w.ext += 1
    w.x(
        "user_annotation",
        "forward",
        phase_ts,
        ops * 45_000,
        f'"External id": {w.ext}, "Record function id": 0, "Ev Idx": {w.ev_idx}',
    )
    for i in range(ops):
        op, inner, ki, dims = _OPS[rng.randrange(len(_OPS))]
        t0 = w.tick(3_000)
        for f in range(rng.randrange(2, 6)):
            w.python(_PY_FRAMES[(i + f) % len(_PY_FRAMES)], w.tick(500), 60_000 - f * 5_000)
        ext = w.cpu_op(op, w.tick(800), 40_000, dims)
        if rng.random() < 0.5:
            ext = w.cpu_op(inner, w.tick(700), 30_000, dims)
        if rng.random() < 0.3:
            w.cpu_op("aten::empty", w.tick(300), 0 if rng.random() < 0.2 else 2_000, "[[], [], [], [], [], []]")
        kind = rng.random()
        if kind < 0.06:  # a copy
            code, arrow, mem = _COPIES[rng.randrange(3)]
            corr = _api(w, "cudaMemcpyAsync", w.tick(1_000), ext, stats)
            nbytes = 4 << rng.randrange(6, 22)
            t = w.tick(2_000)
            before = w.counts["X/gpu_memcpy"]
            w.x(
                "gpu_memcpy",
                f"Memcpy {code} ({arrow})",
                t + 8_000,
                5_088,
                f'"External id": {ext},      "device": 0, "context": 1,      "stream": {_STREAM}, "correlation": {corr},      '
                f'"bytes": {nbytes}, "memory bandwidth (GB/s)": {nbytes / 5088:.6f}',
                pid=0,
                tid=_STREAM,
            )
            if w.counts["X/gpu_memcpy"] > before and code == "DtoD":
                stats["memcpy_dtod_events"] += 1
            w.flow("f", corr, t + 8_000, pid=0, tid=_STREAM)
        elif kind < 0.10:  # a memset
            corr = _api(w, "cudaMemsetAsync", w.tick(1_000), ext, stats)
            t = w.tick(2_000)
            before = w.counts["X/gpu_memset"]
            w.x(
                "gpu_memset",
                "Memset (Device)",
                t + 8_000,
                4_960,
                f'"External id": {ext},      "device": 0, "context": 1,      "stream": {_STREAM}, "correlation": {corr},      '
                f'"bytes": 6291456, "memory bandwidth (GB/s)": 1268.438710',
                pid=0,
                tid=_STREAM,
            )
            stats["memset_events"] += w.counts["X/gpu_memset"] > before
            w.flow("f", corr, t + 8_000, pid=0, tid=_STREAM)
        elif kind < 0.16:  # a Triton kernel through the driver API
            corr = _api(w, "cuLaunchKernel", w.tick(1_000), ext, stats, cat="cuda_driver")
            t = w.tick(6_000)
            _kernel(w, _TRITON, t + 10_000, 3_104, corr, ext, stats, False)
            w.flow("f", corr, t + 10_000, pid=0, tid=_STREAM)
        else:
            corr = _api(w, "cudaLaunchKernel", w.tick(1_000), ext, stats)
            t = w.tick(6_000)
            _kernel(w, _KERNELS[ki], t + 10_000, 1_504 + rng.randrange(60_000), corr, ext, stats, False)
            w.flow("f", corr, t + 10_000, pid=0, tid=_STREAM)
        w.tick(max(0, 40_000 - (w.ts - t0)))
    # backward on the autograd thread, optimizer through a CUDA graph, then a sync
    w.ext += 1
    w.x(
        "user_annotation",
        "backward",
        w.tick(2_000),
        ops * 30_000,
        f'"External id": {w.ext}, "Record function id": 0, "Ev Idx": {w.ev_idx}',
    )
    for i in range(ops // 2):
        ext = w.cpu_op(
            "autograd::engine::evaluate_function: AddmmBackward0",
            w.tick(2_000),
            50_000,
            "[[256, 128], [128, 64]]",
            tid=_BWD_TID,
        )
        w.python("torch/autograd/graph.py(829): _engine_run_backward", w.tick(500), 45_000, tid=_BWD_TID)
        corr = _api(w, "cudaLaunchKernel", w.tick(1_000), ext, stats)
        t = w.tick(5_000)
        _kernel(w, _KERNELS[1], t + 10_000, 20_000, corr, ext, stats, False)
        w.flow("f", corr, t + 10_000, pid=0, tid=_STREAM)
    ext = w.cpu_op("aten::_foreach_add_", w.tick(2_000), 30_000, "[[], []]")
    corr = _api(w, "cudaGraphLaunch", w.tick(1_000), ext, stats)
    t = w.tick(4_000)
    for j in range(4):
        _kernel(w, _KERNELS[(j * 3) % len(_KERNELS)], t + 10_000 + j * 3_000, 2_500, corr, ext, stats, True)
    w.flow("f", corr, t + 10_000, pid=0, tid=_STREAM)
    sync = "cudaStreamSynchronize" if step % 4 else "cudaDeviceSynchronize"
    _api(w, sync, w.tick(2_000), ext, stats)


def write_trace(path: str | Path, events: int, *, seed: int = 0) -> SynthSummary:
    """Write a synthetic Kineto trace of exactly `events` traceEvents entries to `path` (gzip when it ends in .gz).

    `events` (int >= 1): the number of traceEvents entries, all ph kinds included. `seed`: the random seed (the
    file is a function of events and seed). Returns a SynthSummary of what was written. Raises ValueError for
    events < 1 or a path whose folder does not exist, OSError when the file cannot be written.
    Source: the event layout of Kineto's `libkineto/src/output_json.cpp`, the mix of the traces in
    tests/data/traces/ (module docstring).
    """
    if type(events) is not int or events < 1:
        raise ValueError(f"events must be an int >= 1, got {events!r}")
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"out: folder {path.parent} does not exist")
    gz = path.name.endswith(".gz")
    raw = open(path, "wb")
    try:
        stream = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) if gz else raw
        counter = _CountingText(stream)
        counter.write(_HEADER)
        w = _Writer(counter, events, random.Random(seed))
        stats: Counter[str] = Counter()
        w.meta("process_name", _PID, 0, "python3.11")
        w.meta("thread_name", _PID, _TID, "thread 4131 (python3)")
        w.meta("thread_name", _PID, _BWD_TID, "thread 4177 (pt_autograd_0)")
        w.meta("process_name", 0, 0, "GPU 0")
        w.x("Trace", "PyTorch Profiler (0)", w.ts, 10**15, '"Op count": 0', pid="Spans", tid="PyTorch Profiler")
        w.instant("Iteration Start: PyTorch Profiler")
        step = 1
        while not w.done:
            _step(w, step, stats)
            step += 1
        w.flush()
        counter.write(_FOOTER)
        if gz:
            stream.close()
    finally:
        raw.close()
    return SynthSummary(
        path=str(path),
        file_bytes=path.stat().st_size,
        json_bytes=counter.n,
        events=w.n,
        by_ph_cat=dict(sorted(w.counts.items())),
        kernels=stats["kernels"],
        kernels_grid1=stats["kernels_grid1"],
        memcpy_dtod_events=stats["memcpy_dtod_events"],
        memset_events=stats["memset_events"],
        sync_calls={k.removeprefix("sync:"): v for k, v in sorted(stats.items()) if k.startswith("sync:")},
        graph_launches=stats["graph_launches"],
        kernels_in_graphs=stats["kernels_in_graphs"],
    )


class _CountingText:
    """Encode text to UTF-8 onto a binary stream, counting the bytes."""

    def __init__(self, stream) -> None:
        self.stream, self.n = stream, 0

    def write(self, text: str) -> None:
        data = text.encode()
        self.n += len(data)
        self.stream.write(data)


def main(argv: list[str] | None = None) -> int:
    """CLI: `--events N --out F.json[.gz] [--seed S]`; prints the SynthSummary as JSON; exit 0, 2 on bad args."""
    p = argparse.ArgumentParser(prog="PYTHONPATH=results python -m lab.trace_synth", description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, required=True, help="number of traceEvents entries (>= 1)")
    p.add_argument("--out", required=True, help="output file; gzip-compressed when it ends in .gz")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = p.parse_args(argv)
    try:
        summary = write_trace(args.out, args.events, seed=args.seed)
    except ValueError as exc:
        p.error(str(exc))
    print(json.dumps(asdict(summary), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
