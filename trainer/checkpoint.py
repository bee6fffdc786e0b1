"""Atomic checkpoints of named tensors + plain JSON metadata, loaded without unpickling arbitrary objects.

File layout: `torch.save` of {"format": "hotloop-checkpoint", "version": 2, "tensors": {name: CPU tensor},
"meta": JSON-compatible dict, "sha256": {name: hex digest}}; each digest (`tensor_digest`) is SHA-256 over the
tensor's dtype and shape and its bytes in row-major order, and loading recomputes and compares them, so flipped
bytes inside the tensor data (which torch.load itself reads without complaint) are refused. Version 1 (no digests,
written before they were added) still loads, with a warning that its tensor bytes cannot be verified. Saving writes
a temp file in the destination's directory, fsyncs it and renames it over the destination (`os.replace`, atomic on
POSIX), so a crash leaves either the old or the new checkpoint, never a torn one. Loading uses
`torch.load(weights_only=True)`, whose restricted unpickler refuses any global that is not a tensor/storage/plain
container, so a hostile file cannot run code. Sources: the write-temp/fsync/rename pattern
(POSIX rename(2); Python `os.replace`), torch.serialization's weights_only unpickler, hashlib's SHA-256 (FIPS 180-4).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from hotloop.profiles.disk_full import DiskFullError, disk_full_cause
from hotloop.profiles.durable_files import fsync_dir
from hotloop.profiles.input_files import file_kind

FORMAT, VERSION = "hotloop-checkpoint", 2
READABLE_VERSIONS = (1, 2)
"""Versions load_checkpoint reads: 2 (with tensor digests), 1 (without: loaded with a warning)."""
MetaValue = int | float | str | bool | list | dict | None


def save_checkpoint(
    path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, MetaValue]
) -> Path:
    """Write `tensors` (str name -> tensor, any dtype/shape/device; stored detached, as compact CPU copies) and
    `meta` (str key -> JSON-serializable value; stored as its JSON round trip, so tuples come back as lists) to
    `path` atomically; returns `path` as a Path. The temp file (`.<name>.*.tmp`, mode 0600 from mkstemp) lives in
    the same directory; on any error it is removed and an existing file at `path` is left untouched. Each tensor's
    `tensor_digest` is stored with it (verified by load_checkpoint). This is `check_checkpoint_args` then
    `write_host_checkpoint` of CPU copies; hotloop.trainer.async_checkpoint splits the two across threads.
    Raises ValueError for a non-str name, a non-tensor value, a non-str or non-JSON-serializable meta key/value
    (naming the key), a missing parent directory or a `path` that is a directory; hotloop.profiles.disk_full.
    DiskFullError (an OSError whose message starts "disk full") naming `path` when the disk is full or over quota
    (ENOSPC / EDQUOT, also when torch.save reports it as its own RuntimeError), the file at `path` left as it was;
    OSError from the file system otherwise."""
    path, plain_meta = check_checkpoint_args(path, tensors, meta)
    write_host_checkpoint(path, {name: _host_copy(t) for name, t in tensors.items()}, plain_meta)
    return path


def check_checkpoint_args(
    path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, MetaValue]
) -> tuple[Path, dict]:
    """The checks of `save_checkpoint`, made before anything is copied or written: returns (`path` as a Path,
    `meta` as its JSON round trip). Raises ValueError as save_checkpoint does (names, values, meta, directory)."""
    path = Path(path)
    if not isinstance(tensors, Mapping):
        raise ValueError(f"tensors must be a mapping of name -> tensor, got {type(tensors).__name__}")
    if not isinstance(meta, Mapping):
        raise ValueError(f"meta must be a mapping of key -> JSON value, got {type(meta).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"tensors: names must be str, got {name!r} ({type(name).__name__})")
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"tensors[{name!r}] must be a torch.Tensor, got {type(t).__name__}")
    plain_meta = {}
    for key, value in meta.items():
        if not isinstance(key, str):
            raise ValueError(f"meta: keys must be str, got {key!r} ({type(key).__name__})")
        try:
            plain_meta[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"meta[{key!r}] is not JSON-serializable: {exc}") from exc
    if not path.parent.is_dir():
        raise ValueError(f"checkpoint {path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a directory")
    return path, plain_meta


def write_host_checkpoint(path: Path, host: Mapping[str, torch.Tensor], plain_meta: dict) -> int:
    """The write half of `save_checkpoint`: digest the CPU tensors `host` (saved as they are: pass compact,
    contiguous tensors that nothing changes until this returns; a view would save its whole base storage), write
    them with `plain_meta` (already JSON-plain, from `check_checkpoint_args`) to a temp file beside `path`, fsync
    it, rename it over `path` (os.replace) and fsync the directory. Returns the file's size in bytes.
    Touches no CUDA API (the tensors are on the host), so it may run on a background thread while the training
    loop runs (hotloop.trainer.async_checkpoint). Raises DiskFullError / OSError as save_checkpoint does, the temp
    file removed and the file at `path` left as it was."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "meta": plain_meta,
        "tensors": dict(host),
        "sha256": {name: tensor_digest(t) for name, t in host.items()},
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            size = f.tell()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        full = disk_full_cause(exc)
        if full is not None and not isinstance(exc, DiskFullError):
            kept = "the file there before is kept whole" if path.exists() else "no file was there before"
            raise DiskFullError(
                f"disk full: {path} could not be written ({full.strerror or full}); {kept}", full.errno
            ) from exc
        raise
    fsync_dir(path.parent)
    return size


def load_checkpoint(
    path: str | os.PathLike, device: torch.device | str | None = None
) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint written by save_checkpoint: (tensors on `device`, default cpu; meta dict of JSON values).
    Uses torch.load(weights_only=True): a file that would need any other global (a custom class, a __reduce__
    payload) is refused before it is built. Raises ValueError naming the path for a missing file, a path that is not
    a regular file (a FIFO, a device, a folder: never opened), content torch
    cannot read (truncated, corrupt, or not a torch file; the torch error is chained), a file that is not a
    hotloop checkpoint of a READABLE_VERSIONS version, a device that is not cpu or an available cuda, or a tensor
    whose bytes do not match the digest stored with it (naming the first such tensor, in the file's order; the
    digests are computed on the CPU copies torch.load made, before any move to `device`); PermissionError passes
    through. A version-1 file (no digests) loads with a UserWarning saying its bytes are unverified."""
    path = Path(path)
    device = torch.device("cpu" if device is None else device)
    if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
        raise ValueError(f"device {device} must be cpu or an available cuda device")
    if not path.is_file():  # a FIFO or device is refused here, never opened (hotloop.profiles.input_files)
        kind = f" (it is {file_kind(path.stat().st_mode)}, not a regular file)" if path.exists() else ""
        raise ValueError(f"checkpoint {path}: no such file{kind}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError:
        raise
    except Exception as exc:  # corrupt bytes surface as many types: RuntimeError, UnpicklingError, EOFError, OSError..
        raise ValueError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path} is not a {FORMAT} file (format key missing or wrong)")
    version = obj.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ValueError(
            f"checkpoint {path} has version {version!r}, this code reads {' and '.join(map(str, READABLE_VERSIONS))}"
        )
    tensors, meta = obj.get("tensors"), obj.get("meta")
    if (
        not isinstance(tensors, dict)
        or not isinstance(meta, dict)
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items())
    ):
        raise ValueError(f"checkpoint {path} is malformed: 'tensors' must map str -> tensor and 'meta' be a dict")
    if version == 1:
        warnings.warn(
            f"checkpoint {path} is version 1, written without tensor checksums: its tensor bytes cannot be "
            f"verified (the next save writes version {VERSION}, with them)",
            UserWarning,
            stacklevel=2,
        )
    else:
        _verify_digests(path, tensors, obj.get("sha256"))
    if device.type != "cpu":
        tensors = {name: t.to(device) for name, t in tensors.items()}
    return tensors, meta


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 (hex) of a tensor's dtype, shape and data bytes in row-major order (any layout; a CUDA tensor is
    copied to the host). Two tensors have the same digest exactly when they are equal bytewise with the same dtype
    and shape (NaN payloads and -0.0 included)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"tensor_digest needs a torch.Tensor, got {type(t).__name__}")
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def _verify_digests(path: Path, tensors: dict[str, torch.Tensor], digests: object) -> None:
    """ValueError naming `path` unless `digests` maps exactly the tensors' names to their tensor_digest."""
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise ValueError(
            f"checkpoint {path} is malformed: version {VERSION} needs 'sha256', a dict of tensor name -> hex digest"
        )
    if set(digests) != set(tensors):
        raise ValueError(
            f"checkpoint {path} is corrupt: tensors without a checksum "
            f"{sorted(set(tensors) - set(digests))[:5]}, checksums without a tensor "
            f"{sorted(set(digests) - set(tensors))[:5]}"
        )
    for name, t in tensors.items():
        if tensor_digest(t) != digests[name]:
            raise ValueError(
                f"checkpoint {path} is corrupt: tensor {name!r} ({t.dtype}, {tuple(t.shape)}) does not "
                f"match its sha256 checksum; the file's bytes changed after it was written"
            )


def rng_state(device: torch.device | str) -> dict[str, torch.Tensor]:
    """The global RNG states as CPU uint8 tensors: {"cpu": torch.get_rng_state()} plus, when `device` is CUDA,
    "cuda": torch.cuda.get_rng_state(device). Not for the hot loop (the CUDA state is read on the host)."""
    device = torch.device(device)
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Mapping[str, torch.Tensor], device: torch.device | str) -> None:
    """Restore global RNG states taken by rng_state (tensors on any device; copied to CPU). Raises ValueError when
    a needed key ("cpu", and "cuda" for a CUDA device) is missing or not a uint8 tensor."""
    device = torch.device(device)
    keys = ("cpu", "cuda") if device.type == "cuda" else ("cpu",)
    for key in keys:
        t = state.get(key) if isinstance(state, Mapping) else None
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
            raise ValueError(f"state[{key!r}] must be a uint8 tensor from rng_state, got {t!r:.60}")
    torch.set_rng_state(state["cpu"].to("cpu"))
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].to("cpu"), device)


def generator_state(g: torch.Generator) -> torch.Tensor:
    """State of a torch.Generator (CPU or CUDA) as a CPU uint8 tensor (g.get_state())."""
    if not isinstance(g, torch.Generator):
        raise ValueError(f"g must be a torch.Generator, got {type(g).__name__}")
    return g.get_state()


def set_generator_state(g: torch.Generator, state: torch.Tensor) -> None:
    """Restore a generator_state (uint8 tensor, any device; copied to CPU) into `g` (g.set_state). Raises
    ValueError for a non-generator or a non-uint8 state; RuntimeError from torch for a state of the wrong kind."""
    if not isinstance(g, torch.Generator):
        raise ValueError(f"g must be a torch.Generator, got {type(g).__name__}")
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise ValueError(f"state must be a uint8 tensor from generator_state, got {state!r:.60}")
    g.set_state(state.to("cpu"))


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy owning a storage of its own size (so saving a view does not save its whole base)."""
    t = t.detach()
    return t.clone() if t.device.type == "cpu" else t.cpu()
