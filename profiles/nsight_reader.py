"""Read an Nsight Systems SQLite export (`nsys export --type sqlite`) into the event schema of
`hotloop.profiles.trace_schema`.

Source: the Nsight Systems SQLite schema (export schema 3.x, checked on the H200's nsys 2025.3.2 export,
tests/data/traces/h200/nsys_matmul_nvtx.sqlite). Tables read:

- CUPTI_ACTIVITY_KIND_KERNEL (required) -> kernel: name = demangledName (else shortName) via StringIds;
  gridX..Z, blockX..Z, streamId, deviceId, correlationId.
- CUPTI_ACTIVITY_KIND_RUNTIME -> runtime, or driver where eventClass is 1 (CUDA driver): name via nameId, with
  the `_vNNNN` suffix of cuda* names dropped (cudaLaunchKernel_v7000 -> cudaLaunchKernel, as Kineto names it).
- CUPTI_ACTIVITY_KIND_MEMCPY -> memcpy: copyKind enum -> copy_kind (COPY_KINDS); name "Memcpy <copy_kind>".
- CUPTI_ACTIVITY_KIND_MEMSET -> memset: name "Memset".
- NVTX_EVENTS -> user_annotation: ranges only (rows with an end: push/pop and start/end ranges); name = text,
  else textId's string; domain = the text of that domainId's NvtxDomainCreate row.
- StringIds (required): the strings the ids above point to.

Optional tables that are absent (nsys omits a table with no rows) contribute no rows. Times are integer
nanoseconds in the file and microseconds (float) in the frame. globalTid/globalPid are decoded as
pid = (id >> 24) & 0xFFFFFF, tid = id & 0xFFFFFF (Nsight's serialized GlobalId).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd

from hotloop.profiles.input_files import InputFileError, open_input
from hotloop.profiles.trace_schema import TraceReadError, event_frame

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file
# CUPTI_ActivityMemcpyKind as nsys exports it (ENUM_CUDA_MEMCPY_OPER), spelled as Kineto spells it.
COPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "UVM HtoD",
    12: "UVM DtoH",
    13: "UVM DtoD",
}
_DRIVER_EVENT_CLASS = 1
_NVTX_DOMAIN_CREATE = 75  # ENUM_NSYS_EVENT_TYPE NvtxDomainCreate

_GPU_COMMON = "start, end, streamId AS stream, deviceId AS device, correlationId AS correlation, globalPid AS gpid"
_QUERIES = {
    KERNEL_TABLE: f"""SELECT {_GPU_COMMON}, COALESCE(d.value, s.value) AS name,
        gridX AS grid_x, gridY AS grid_y, gridZ AS grid_z, blockX AS block_x, blockY AS block_y, blockZ AS block_z
        FROM {KERNEL_TABLE} k LEFT JOIN StringIds d ON d.id = k.demangledName
        LEFT JOIN StringIds s ON s.id = k.shortName""",
    "CUPTI_ACTIVITY_KIND_RUNTIME": """SELECT start, end, correlationId AS correlation, globalTid AS gtid,
        eventClass, s.value AS name FROM CUPTI_ACTIVITY_KIND_RUNTIME r LEFT JOIN StringIds s ON s.id = r.nameId""",
    "CUPTI_ACTIVITY_KIND_MEMCPY": f"SELECT {_GPU_COMMON}, bytes, copyKind, '' AS name FROM CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET": f"SELECT {_GPU_COMMON}, bytes, 'Memset' AS name FROM CUPTI_ACTIVITY_KIND_MEMSET",
    "NVTX_EVENTS": f"""SELECT n.start, n.end, n.globalTid AS gtid, COALESCE(n.text, s.value) AS name,
        COALESCE(dom.text, '') AS domain FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
        LEFT JOIN (SELECT domainId, MAX(text) AS text FROM NVTX_EVENTS WHERE eventType = {_NVTX_DOMAIN_CREATE}
                   GROUP BY domainId) dom ON dom.domainId = n.domainId
        WHERE n.end IS NOT NULL""",
}


def read_nsight_sqlite(path: str | Path) -> pd.DataFrame:
    """The kernels, memcpys, memsets, CUDA runtime/driver calls and NVTX ranges of an Nsight Systems SQLite export
    as a DataFrame in the `hotloop.profiles.trace_schema` schema (see the module docstring for the table -> kind map).

    Raises TraceReadError (a ValueError) naming the file for: a missing or unreadable file, a path that is not a
    regular file (a FIFO, a device: refused without waiting for a writer), a file that is not
    an SQLite database (checked by its 16-byte header) or is a corrupt one, a database without
    CUPTI_ACTIVITY_KIND_KERNEL or StringIds (the table is named in the message; e.g. a capture without
    `--trace=cuda`, or one that launched no kernel), or a table lacking a column this reader uses.
    """
    path = Path(path)
    try:
        with open_input(path, "trace") as f:  # a FIFO or device refused, never waited on
            header = f.read(len(SQLITE_MAGIC))
    except InputFileError as exc:
        raise TraceReadError(path, exc.problem) from None
    except OSError as exc:
        raise TraceReadError(path, f"cannot read: {exc.strerror or exc}") from None
    if header != SQLITE_MAGIC:
        raise TraceReadError(
            path,
            "not an SQLite database (no 'SQLite format 3' header); expected the output of `nsys export --type sqlite`",
        )
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise TraceReadError(path, f"corrupt SQLite database ({exc})") from None
        for needed in (KERNEL_TABLE, "StringIds"):
            if needed not in tables:
                raise TraceReadError(
                    path,
                    f"no table {needed}: not an Nsight Systems SQLite export with CUDA "
                    "kernels (record with `nsys profile --trace=cuda`, then "
                    "`nsys export --type sqlite`)",
                )
        parts = {}
        for table, sql in _QUERIES.items():
            if table in tables:
                try:
                    parts[table] = pd.read_sql_query(sql, con)
                except (sqlite3.Error, pd.errors.DatabaseError) as exc:
                    raise TraceReadError(path, f"table {table} has an unexpected schema ({exc})") from None
    finally:
        con.close()
    return _frame(parts)


def _frame(parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    frames = []
    for table, df in parts.items():
        n = len(df)
        cols = {
            "name": df["name"].fillna("").astype(str),
            "start_us": df["start"] / 1e3,
            "dur_us": (df["end"] - df["start"]) / 1e3,
        }
        if "gtid" in df:  # CPU rows: runtime/driver calls and NVTX ranges
            cols["pid"], cols["tid"] = _split_global_id(df["gtid"])
        else:  # GPU rows
            cols.update(stream=df["stream"], device=df["device"], pid=_split_global_id(df["gpid"])[0])
        if table == KERNEL_TABLE:
            cols.update(
                {c: df[c] for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")},
                kind=["kernel"] * n,
                correlation=df["correlation"],
            )
        elif table == "CUPTI_ACTIVITY_KIND_RUNTIME":
            cols.update(
                kind=df["eventClass"].eq(_DRIVER_EVENT_CLASS).map({True: "driver", False: "runtime"}),
                name=cols["name"].str.replace(r"^(cuda\w*?)_v\d+$", r"\1", regex=True),
                correlation=df["correlation"],
            )
        elif table == "CUPTI_ACTIVITY_KIND_MEMCPY":
            copy = df["copyKind"].map(COPY_KINDS).fillna("Unknown").astype(str)
            cols.update(
                kind=["memcpy"] * n,
                bytes=df["bytes"],
                copy_kind=copy,
                name="Memcpy " + copy,
                correlation=df["correlation"],
            )
        elif table == "CUPTI_ACTIVITY_KIND_MEMSET":
            cols.update(kind=["memset"] * n, bytes=df["bytes"], correlation=df["correlation"])
        else:
            cols.update(kind=["user_annotation"] * n, domain=df["domain"])
        frames.append(event_frame(cols))
    return pd.concat(frames, ignore_index=True).sort_values("start_us", kind="stable", ignore_index=True)


def _split_global_id(global_id: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(pid, tid) as strings from Nsight's serialized GlobalId (missing -> "0")."""
    gid = global_id.fillna(0).astype("int64")
    return (gid // 2**24 % 2**24).astype(str), (gid % 2**24).astype(str)
