"""How `hotloop nsys ... -- CMD...` (the command: hotloop.guards.commands.nsys) profiles a command under Nsight
Systems, and the table of NVTX ranges it prints beside the guard counts of the recording (`range_gpu_time`).

Steps (`profile`):
1. `nsys profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-graph-trace=node -o /tmp/hotloop-nsys-XXXX/report
   --force-overwrite true CMD...` (CUDA API + GPU activity and NVTX ranges only; no CPU sampling, no
   context-switch tracing; every kernel of a replayed CUDA graph recorded as its own kernel row carrying the
   cudaGraphLaunch's correlation id, where nsys's default `graph` level records a replay as one opaque span and the
   guards could not count its kernels). CMD's stdout and stderr go to this process's.
2. On the bundled route only (below): the raw `.qdstrm` is converted to `.nsys-rep` by Nsight's QdstrmImporter with
   `LD_LIBRARY_PATH=$HOTLOOP_NSYS_LIBS` (default ./.nsyslibs) prepended (the H200 lacks the libdw.so.1 / libelf.so.1 it needs).
3. `nsys export --type sqlite -o OUT/report.sqlite <report>.nsys-rep`; the temporary folder in /tmp (the .qdstrm
   can be GBs even for a tiny program) is then removed.

Which nsys (`find_nsys`): `nsys` on PATH (a machine with Nsight Systems installed, e.g. an H100 CI runner), else
the nsys bundled with Nsight Compute: /opt/nvidia/nsight-compute/<version>/host/target-linux-x64/nsys, with its
importer at .../host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter (newest version first).

Sources: docs/nsight.md (the bundled route, seen working on the H200 on 2026-11-29; shipped in the wheel, and the
messages cite the installed copy: profiles/docs.py); the Nsight Systems User Guide, "Profiling from the CLI"
(`nsys profile` switches -t/--trace, -s/--sample, --cpuctxsw, --cuda-graph-trace, -o/--output, --force-overwrite;
`nsys export` switches --type, -o/--output; https://docs.nvidia.com/nsight-systems/UserGuide/).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hotloop.profiles.docs import doc_ref

LIBS_ENV = "HOTLOOP_NSYS_LIBS"
"""Environment variable naming the folder of the importer's libdw.so.1/libelf.so.1 (default: ./.nsyslibs)."""
NSIGHT_COMPUTE_ROOTS = (Path("/opt/nvidia/nsight-compute"),)
"""Where the bundled route looks for <version>/host/... (docs/nsight.md)."""
BUNDLED_NSYS = Path("host/target-linux-x64/nsys")
BUNDLED_IMPORTER = Path("host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter")
LIBS_DIR = ".nsyslibs"
PROFILE_ARGS = ("profile", "-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none", "--cuda-graph-trace=node")
RANGE_COLUMNS = ["domain", "name", "count", "cpu_total_us", "cpu_median_us", "kernels", "gpu_kernel_us"]
_API_KINDS = ("runtime", "driver")


@dataclass(frozen=True)
class NsysRoute:
    """How to make a report: `nsys` (the executable); on the bundled route also `importer` (QdstrmImporter, run on
    the .qdstrm that bundled nsys leaves) and `libs` (the folder prepended to its LD_LIBRARY_PATH; it need not
    exist where the system has libdw/libelf)."""

    nsys: Path
    importer: Path | None = None
    libs: Path | None = None

    def describe(self) -> str:
        if self.importer is None:
            return f"nsys {self.nsys} (from PATH)"
        return f"nsys {self.nsys} bundled with Nsight Compute, importer {self.importer}, libs {self.libs}"


class ProfileFailed(RuntimeError):
    """The profiled command exited non-zero, or nsys, the QdstrmImporter or `nsys export` failed.

    Attributes: `returncode` (the failing process's exit status: the profiled command's as nsys returns it, else
    the tool's) and `sqlite` (the exported report when one was still written, else None).
    """

    def __init__(self, message: str, returncode: int, sqlite: Path | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.sqlite = sqlite


def _version_key(path: Path) -> tuple:
    """Sort key of an Nsight Compute version folder name such as 2025.3.1 (numerically, so 2025.10 > 2025.9)."""
    return tuple(int(p) for p in re.findall(r"\d+", path.name))


def libs_dir() -> Path:
    """The folder whose libraries the bundled QdstrmImporter loads: $HOTLOOP_NSYS_LIBS, else .nsyslibs in the
    working directory (docs/nsight.md says how to fill it)."""
    return Path(os.environ.get(LIBS_ENV) or LIBS_DIR).absolute()


def find_nsys(
    libs: str | Path | None = None, search_roots: tuple[Path, ...] | list[Path] = NSIGHT_COMPUTE_ROOTS
) -> NsysRoute:
    """The nsys to use: `nsys` on PATH (shutil.which) -> a route without importer; else, under each of
    `search_roots` (default /opt/nvidia/nsight-compute), the newest <version>/ holding both the bundled
    host/target-linux-x64/nsys and host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter -> that route, with
    libs = `libs` (default `libs_dir()`: where the importer's libdw.so.1/libelf.so.1 are put, docs/nsight.md).

    Raises ValueError saying that both were looked for (PATH and the globs searched) and how to get either.
    """
    on_path = shutil.which("nsys")
    if on_path:
        return NsysRoute(Path(on_path))
    for root in search_roots:
        versions = sorted((p for p in Path(root).glob("*") if p.is_dir()), key=_version_key, reverse=True)
        for version in versions:
            nsys, importer = version / BUNDLED_NSYS, version / BUNDLED_IMPORTER
            if all(p.is_file() and os.access(p, os.X_OK) for p in (nsys, importer)):
                return NsysRoute(nsys, importer, Path(libs) if libs is not None else libs_dir())
    looked = ", ".join(str(Path(r) / "*" / BUNDLED_NSYS) for r in search_roots) or "(no search roots)"
    raise ValueError(
        f"no Nsight Systems found: `nsys` is not on PATH, and no Nsight Compute with a bundled nsys and "
        f"QdstrmImporter was found ({looked}). Install Nsight Systems (CUDA toolkit or "
        f"https://developer.nvidia.com/nsight-systems) and put its bin/ on PATH, or use the bundled route of "
        f"{doc_ref('nsight.md')} (Nsight Compute under /opt/nvidia/nsight-compute plus the importer's libraries in "
        f"{libs_dir()} or ${LIBS_ENV})"
    )


def profile(cmd: list[str], out_dir: str | Path, route: NsysRoute, tmp_dir: str | Path | None = None) -> Path:
    """Record `cmd` under `route`'s nsys (module docstring, steps 1-3) and export out_dir/report.sqlite.

    The raw recording goes to a fresh folder hotloop-nsys-* in `tmp_dir` (default tempfile.gettempdir(), i.e.
    /tmp), never into `out_dir`, and that folder is removed at the end, also on failure. `out_dir` must exist.
    Returns the path of the SQLite export. Raises ProfileFailed when the profiled command (as nsys reports it)
    exits non-zero (after exporting whatever nsys recorded: `.sqlite` set when that worked), or when nsys wrote no
    report, the importer failed or `nsys export` failed or wrote nothing.
    """
    if not cmd:
        raise ValueError("no command to profile")
    sqlite = Path(out_dir) / "report.sqlite"
    work = Path(tempfile.mkdtemp(prefix="hotloop-nsys-", dir=tmp_dir))
    base = work / "report"
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        rc = subprocess.run(
            [str(route.nsys), *PROFILE_ARGS, "-o", str(base), "--force-overwrite", "true", *cmd]
        ).returncode
        failed = f"the profiled command exited with status {rc}" if rc else ""
        try:
            rep = _nsys_rep(base, route)
        except ProfileFailed as exc:
            raise ProfileFailed(f"{failed}; {exc}" if failed else str(exc), rc or exc.returncode) from None
        export = subprocess.run([str(route.nsys), "export", "--type", "sqlite", "-o", str(sqlite), str(rep)])
        if export.returncode or not sqlite.is_file():
            why = (
                f"`nsys export --type sqlite` failed (status {export.returncode}) on {rep}"
                if export.returncode
                else f"`nsys export --type sqlite` wrote no {sqlite}"
            )
            raise ProfileFailed(f"{failed}; {why}" if failed else why, rc or export.returncode or 1)
        if rc:
            raise ProfileFailed(failed, rc, sqlite)
        return sqlite
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _nsys_rep(base: Path, route: NsysRoute) -> Path:
    """base.nsys-rep, made from base.qdstrm by the route's importer when nsys left only that."""
    rep, raw = base.with_suffix(".nsys-rep"), base.with_suffix(".qdstrm")
    if rep.is_file():
        return rep
    if not raw.is_file():
        raise ProfileFailed(f"nsys wrote no report ({rep.name} or {raw.name}) in {base.parent}", 1)
    if route.importer is None:
        raise ProfileFailed(
            f"nsys left only the raw {raw.name} (its own QdstrmImporter failed; see {doc_ref('nsight.md')})", 1
        )
    env = dict(os.environ)
    if route.libs is not None:
        if not route.libs.is_dir():
            print(
                f"hotloop nsys: note: {route.libs} does not exist; the QdstrmImporter may fail for lack of "
                f"libdw.so.1/libelf.so.1 ({doc_ref('nsight.md')} says how to fetch them)",
                file=sys.stderr,
            )
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(route.libs), env.get("LD_LIBRARY_PATH")) if p)
    imported = subprocess.run([str(route.importer), "-i", str(raw)], env=env)
    if imported.returncode or not rep.is_file():
        raise ProfileFailed(
            f"QdstrmImporter {route.importer} failed (status {imported.returncode}) to convert "
            f"{raw} to {rep.name}; are libdw.so.1 and libelf.so.1 in {route.libs}? "
            f"({doc_ref('nsight.md')})",
            imported.returncode or 1,
        )
    raw.unlink(missing_ok=True)  # GBs: free them before the export
    return rep


def range_gpu_time(df: pd.DataFrame) -> pd.DataFrame:
    """Per NVTX range (domain, name), over the CPU-side ranges of trace `df` (`hotloop.profiles.trace_schema`; Nsight
    NVTX_EVENTS push/pop and start/end ranges are kind user_annotation with their domain; Kineto record_function
    ranges too, domain ""): RANGE_COLUMNS =

    - count: number of ranges; cpu_total_us, cpu_median_us: sum and median of their CPU durations (microseconds);
    - kernels, gpu_kernel_us: number and summed duration (microseconds of GPU time, on any stream) of the kernels
      launched inside the ranges: a kernel whose launching CUDA runtime/driver call (same correlation id, as in
      `hotloop.profiles.trace_counts.assign_steps`; a graph replay's kernels share their cudaGraphLaunch's) started inside
      the range, start <= call start <= end, on the same pid and tid. Nested ranges each count their kernels
      (inclusive). A correlation id carried by several calls counts once, at its earliest call.

    Sorted by gpu_kernel_us, then cpu_total_us, descending. Empty (with these columns) when there are no ranges.
    """
    ranges = df[df["kind"].eq("user_annotation")]
    if ranges.empty:
        dtypes = {"domain": "str", "name": "str", "count": "int64", "kernels": "int64"}
        return pd.DataFrame({c: pd.Series(dtype=dtypes.get(c, "float64")) for c in RANGE_COLUMNS})
    kernels = df[df["kind"].eq("kernel") & df["correlation"].notna()]
    per_corr = kernels.groupby("correlation")["dur_us"].agg(["sum", "count"])
    calls = df[df["kind"].isin(_API_KINDS) & df["correlation"].notna()]
    calls = calls.sort_values("start_us", kind="stable").drop_duplicates("correlation")
    calls = calls.assign(
        k_us=calls["correlation"].map(per_corr["sum"]).fillna(0.0).astype("float64"),
        k_n=calls["correlation"].map(per_corr["count"]).fillna(0).astype("int64"),
    )
    k_us = pd.Series(0.0, index=ranges.index)
    k_n = pd.Series(0, index=ranges.index, dtype="int64")
    thread_calls = dict(list(calls.groupby(["pid", "tid"], sort=False)))
    for key, group in ranges.groupby(["pid", "tid"], sort=False):
        c = thread_calls.get(key)
        if c is None:
            continue
        c = c.sort_values("start_us", kind="stable")
        t = c["start_us"].to_numpy()
        cum_us = np.concatenate([[0.0], np.cumsum(c["k_us"].to_numpy())])
        cum_n = np.concatenate([[0], np.cumsum(c["k_n"].to_numpy())])
        lo = np.searchsorted(t, group["start_us"].to_numpy(), side="left")
        hi = np.searchsorted(t, (group["start_us"] + group["dur_us"]).to_numpy(), side="right")
        k_us[group.index] = cum_us[hi] - cum_us[lo]
        k_n[group.index] = cum_n[hi] - cum_n[lo]
    table = (
        ranges.assign(kernels=k_n, gpu_kernel_us=k_us)
        .groupby(["domain", "name"], sort=False)
        .agg(
            count=("dur_us", "size"),
            cpu_total_us=("dur_us", "sum"),
            cpu_median_us=("dur_us", "median"),
            kernels=("kernels", "sum"),
            gpu_kernel_us=("gpu_kernel_us", "sum"),
        )
        .reset_index()
    )
    return table.sort_values(["gpu_kernel_us", "cpu_total_us"], ascending=False, kind="stable", ignore_index=True)[
        RANGE_COLUMNS
    ]
