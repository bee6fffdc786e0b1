"""Unit tests of `hotloop.trainer.checkpoint` (CPU): atomic save, safe load, tensor checksums, RNG state helpers."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import pickle
import struct
import warnings
import zipfile

import pytest
import torch

from hotloop.profiles.disk_full import DiskFullError, disk_full_cause
from hotloop.trainer.checkpoint import (
    generator_state,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_generator_state,
    set_rng_state,
    tensor_digest,
)


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    """Random non-zero tensors of several dtypes and shapes (0-dim, empty, non-contiguous, a view of a base)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(64, 8, generator=g) + 0.5
    return {
        "f32": torch.rand(3, 5, generator=g) + 0.1,
        "f64_scalar": torch.tensor(math.pi, dtype=torch.float64),
        "f16": (torch.rand(7, generator=g) + 0.1).half(),
        "bf16": (torch.rand(2, 3, 4, generator=g) + 0.1).bfloat16(),
        "i64": torch.randint(1, 1 << 40, (11,), generator=g),
        "u8": torch.randint(1, 256, (4, 4), generator=g, dtype=torch.uint8),
        "bool": torch.rand(9, generator=g) < 0.5,
        "empty": torch.empty(0, 3),
        "transposed": (torch.rand(4, 6, generator=g) + 0.1).t(),
        "row_of_base": base[5],
        "param": torch.nn.Parameter(torch.rand(2, 2, generator=g) + 0.1),
    }


META = {
    "epoch": 3,
    "lr": 2.5e-4,
    "env": "cartpole",
    "greedy": False,
    "nvec": [2, 3],
    "note": None,
    "nested": {"a": [1, {"b": "c"}]},
    "nan": float("nan"),
}


def _assert_same(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(loaded) == set(expected)
    for name, t in expected.items():
        got = loaded[name]
        assert got.dtype == t.dtype and got.shape == t.shape and got.device.type == "cpu", name
        assert torch.equal(got, t.detach()), name
        assert type(got) is torch.Tensor and not got.requires_grad, name


@pytest.mark.smoke
def test_round_trip_tensors_and_meta(tmp_path):
    tensors = _tensors(0)
    path = save_checkpoint(tmp_path / "ck.pt", tensors, META)
    assert path == tmp_path / "ck.pt" and path.is_file()
    loaded, meta = load_checkpoint(str(path))
    _assert_same(loaded, tensors)
    assert loaded["row_of_base"].untyped_storage().nbytes() == 8 * 4  # the row, not its 64x8 base
    assert math.isnan(meta.pop("nan"))
    assert meta == {k: v for k, v in META.items() if k != "nan"}
    assert os.listdir(tmp_path) == ["ck.pt"]  # no temp file left behind


def test_meta_is_stored_as_its_json_round_trip(tmp_path):
    save_checkpoint(tmp_path / "ck.pt", {}, {"shape": (2, 3), "d": {1: "x"}})
    tensors, meta = load_checkpoint(tmp_path / "ck.pt")
    assert tensors == {} and meta == {"shape": [2, 3], "d": {"1": "x"}}


def test_overwrite_replaces_old_checkpoint(tmp_path):
    path = tmp_path / "ck.pt"
    save_checkpoint(path, _tensors(1), {"epoch": 1})
    save_checkpoint(path, _tensors(2), {"epoch": 2})
    loaded, meta = load_checkpoint(path)
    _assert_same(loaded, _tensors(2))
    assert meta == {"epoch": 2} and os.listdir(tmp_path) == ["ck.pt"]


@pytest.mark.parametrize("fail_at", ["torch.save", "os.replace"])
def test_crash_during_save_keeps_old_checkpoint(tmp_path, monkeypatch, fail_at):
    path = tmp_path / "ck.pt"
    save_checkpoint(path, _tensors(1), {"epoch": 1})
    before = path.read_bytes()
    real_save = torch.save

    def partial_save(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[:200])  # half-written, then the "crash"
        raise RuntimeError("simulated crash in torch.save")

    def failing_replace(src, dst):
        raise OSError("simulated crash in os.replace")

    if fail_at == "torch.save":
        monkeypatch.setattr(torch, "save", partial_save)
    else:
        monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises((RuntimeError, OSError), match="simulated crash"):
        save_checkpoint(path, _tensors(2), {"epoch": 2})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ck.pt"]
    assert path.read_bytes() == before
    loaded, meta = load_checkpoint(path)
    _assert_same(loaded, _tensors(1))
    assert meta == {"epoch": 1}


def test_crash_on_first_save_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path / "ck.pt", _tensors(0), {})
    assert os.listdir(tmp_path) == []


class _FullDisk(io.RawIOBase):
    """A file whose disk fills after `room` bytes: writes past it raise OSError ENOSPC, as write(2) does."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(b)
        return self.f.write(b)


def test_a_full_disk_is_a_disk_full_error_naming_the_file_and_the_old_checkpoint_stays(tmp_path, monkeypatch):
    """Issue 41 item 3: torch.save reports the failed write as its own RuntimeError ("unexpected pos"), the
    OSError ENOSPC only its __context__: save_checkpoint says "disk full" and names the file."""
    path = tmp_path / "ck.pt"
    save_checkpoint(path, _tensors(1), {"epoch": 1})
    before = path.read_bytes()
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real_save(obj, _FullDisk(f, 300), *a, **k))
    with pytest.raises(
        DiskFullError,
        match=f"^disk full: {path} could not be written \\(No space left on device\\); "
        f"the file there before is kept whole$",
    ) as exc:
        save_checkpoint(path, _tensors(2), {"epoch": 2})
    assert exc.value.errno == errno.ENOSPC and isinstance(exc.value, OSError)
    assert disk_full_cause(exc.value.__cause__).errno == errno.ENOSPC  # torch's RuntimeError, with the OSError
    with pytest.raises(DiskFullError, match="no file was there before"):
        save_checkpoint(tmp_path / "new.pt", _tensors(2), {"epoch": 2})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ck.pt"] and path.read_bytes() == before  # no temp file, the old one whole
    assert load_checkpoint(path)[1] == {"epoch": 1}
    assert disk_full_cause(RuntimeError("x")) is None and disk_full_cause(OSError(errno.EACCES, "no")) is None


class _Payload:
    """Unpickling this creates the file `marker` (via open(marker, "w")): a stand-in for arbitrary code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _Custom:
    def __init__(self) -> None:
        self.x = 1


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_arbitrary_object_payload_is_refused_and_not_run(tmp_path, writer):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pt"
    obj = {"format": "hotloop-checkpoint", "version": 1, "tensors": {}, "meta": {"x": _Payload(str(marker))}}
    if writer == "torch.save":
        torch.save(obj, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(obj, f)
    assert not marker.exists()
    with pytest.raises(ValueError, match="evil.pt cannot be read"):
        load_checkpoint(path)
    assert not marker.exists()


def test_custom_class_instance_is_refused(tmp_path):
    path = tmp_path / "custom.pt"
    torch.save(
        {"format": "hotloop-checkpoint", "version": 1, "tensors": {"w": torch.ones(2)}, "meta": {"obj": _Custom()}},
        path,
    )
    with pytest.raises(ValueError, match="UnpicklingError"):
        load_checkpoint(path)


def test_truncated_file_raises(tmp_path):
    path = save_checkpoint(tmp_path / "ck.pt", _tensors(0), META)
    data = path.read_bytes()
    for n in (0, 1, 100, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:n])
        with pytest.raises(ValueError, match="ck.pt cannot be read"):
            load_checkpoint(path)


def flip_tensor_byte(path, entry_index: int = 0, offset: int | None = None) -> str:
    """Flip one bit of one byte inside the data of the `entry_index`-th tensor storage record of the torch zip file
    at `path` (the middle byte unless `offset`), in place, as a disk or copy error would; returns the record name.
    torch.load reads such a file without complaint."""
    with zipfile.ZipFile(path) as z:
        infos = sorted(
            (i for i in z.infolist() if "/data/" in i.filename and i.file_size > 0), key=lambda i: i.header_offset
        )
    info = infos[entry_index]
    data = bytearray(open(path, "rb").read())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    data[start + (info.file_size // 2 if offset is None else offset)] ^= 0x01
    open(path, "wb").write(bytes(data))
    return info.filename


def test_a_flipped_tensor_byte_is_refused_naming_the_tensor(tmp_path):
    tensors = _tensors(0)
    path = save_checkpoint(tmp_path / "ck.pt", tensors, META)
    good = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        n_records = sum(1 for i in z.infolist() if "/data/" in i.filename and i.file_size > 0)
    assert n_records == sum(1 for t in tensors.values() if t.numel())
    for k in range(n_records):
        path.write_bytes(good)
        flip_tensor_byte(path, k)
        raw = torch.load(path, weights_only=True)["tensors"]  # what torch reads: no error, one tensor changed
        changed = [n for n, t in tensors.items() if not torch.equal(raw[n], t.detach())]
        assert len(changed) == 1, changed
        with pytest.raises(ValueError, match=f"ck.pt is corrupt: tensor '{changed[0]}' .*does not match its sha256"):
            load_checkpoint(path)
    path.write_bytes(good)
    _assert_same(load_checkpoint(path)[0], tensors)


def test_digests_cover_dtype_shape_and_every_byte():
    a = torch.arange(12, dtype=torch.float32)
    assert tensor_digest(a) == tensor_digest(a.clone()) == tensor_digest(torch.arange(12.0))
    assert tensor_digest(a) != tensor_digest(a.reshape(3, 4))  # same bytes, other shape
    assert tensor_digest(a) != tensor_digest(a.view(torch.int32))  # same bytes, other dtype
    assert tensor_digest(a.reshape(3, 4).t()) == tensor_digest(a.reshape(3, 4).t().contiguous())  # row-major order
    assert tensor_digest(torch.tensor(0.0)) != tensor_digest(torch.tensor(-0.0))
    assert len({tensor_digest(t) for t in _tensors(0).values()}) == len(_tensors(0))
    with pytest.raises(ValueError, match="torch.Tensor"):
        tensor_digest([1.0])


def test_a_version_1_checkpoint_loads_with_a_warning(tmp_path):
    """Written before the checksums (no "sha256"): accepted, with a UserWarning that its bytes are unverified."""
    path = tmp_path / "old.pt"
    torch.save(
        {"format": "hotloop-checkpoint", "version": 1, "tensors": {"w": torch.ones(3)}, "meta": {"epoch": 1}}, path
    )
    with pytest.warns(UserWarning, match="old.pt is version 1, written without tensor checksums"):
        tensors, meta = load_checkpoint(path)
    assert torch.equal(tensors["w"], torch.ones(3)) and meta == {"epoch": 1}
    save_checkpoint(path, tensors, meta)  # the next save is version 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint(path)
    assert torch.load(path, weights_only=True)["version"] == 2


def test_missing_file_raises_naming_path(tmp_path):
    path = tmp_path / "nope" / "ck.pt"
    with pytest.raises(ValueError, match=f"{path}: no such file"):
        load_checkpoint(path)
    with pytest.raises(ValueError, match="no such file"):
        load_checkpoint(tmp_path)  # a directory is not a checkpoint file


@pytest.mark.parametrize(
    "obj, match",
    [
        ({"tensors": {}, "meta": {}}, "not a hotloop-checkpoint file"),
        ({"format": "other", "version": 1, "tensors": {}, "meta": {}}, "not a hotloop-checkpoint file"),
        ([torch.ones(1)], "not a hotloop-checkpoint file"),
        (
            {"format": "hotloop-checkpoint", "version": 3, "tensors": {}, "meta": {}},
            "version 3, this code reads 1 and 2",
        ),
        ({"format": "hotloop-checkpoint", "version": True, "tensors": {}, "meta": {}}, "version True"),
        (
            {"format": "hotloop-checkpoint", "version": 2, "tensors": {}, "meta": {}},
            "malformed: version 2 needs 'sha256'",
        ),
        (
            {"format": "hotloop-checkpoint", "version": 2, "tensors": {"a": torch.ones(1)}, "meta": {}, "sha256": {}},
            r"corrupt: tensors without a checksum \['a'\]",
        ),
        ({"format": "hotloop-checkpoint", "tensors": {}, "meta": {}}, "version None"),
        ({"format": "hotloop-checkpoint", "version": 1, "tensors": {"a": 1}, "meta": {}}, "malformed"),
        ({"format": "hotloop-checkpoint", "version": 1, "tensors": {}, "meta": [1]}, "malformed"),
    ],
)
def test_not_a_hotloop_checkpoint_raises(tmp_path, obj, match):
    path = tmp_path / "other.pt"
    torch.save(obj, path)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "tensors, meta, match",
    [
        ({1: torch.ones(1)}, {}, "names must be str"),
        ({"w": [1.0]}, {}, r"tensors\['w'\] must be a torch.Tensor"),
        ({}, {"bad": object()}, r"meta\['bad'\] is not JSON-serializable"),
        ({}, {"ok": 1, "deep": [1, {"x": {2, 3}}]}, r"meta\['deep'\]"),
        ({}, {3: "x"}, "meta: keys must be str"),
        ([torch.ones(1)], {}, "tensors must be a mapping"),
        ({}, [("a", 1)], "meta must be a mapping"),
    ],
)
def test_bad_save_inputs_raise_and_write_nothing(tmp_path, tensors, meta, match):
    with pytest.raises(ValueError, match=match):
        save_checkpoint(tmp_path / "ck.pt", tensors, meta)
    assert os.listdir(tmp_path) == []


def test_bad_save_path_raises(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        save_checkpoint(tmp_path / "missing_dir" / "ck.pt", {}, {})
    with pytest.raises(ValueError, match="is a directory"):
        save_checkpoint(tmp_path, {}, {})


def test_bad_load_device_raises(tmp_path):
    path = save_checkpoint(tmp_path / "ck.pt", {"w": torch.ones(2)}, {})
    with pytest.raises(ValueError, match="cpu or an available cuda"):
        load_checkpoint(path, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cpu or an available cuda"):
            load_checkpoint(path, device="cuda")


def test_rng_state_round_trip_through_checkpoint(tmp_path):
    torch.manual_seed(123)
    torch.rand(5)
    save_checkpoint(tmp_path / "rng.pt", rng_state("cpu"), {"step": 1})
    expected = torch.rand(20)
    torch.manual_seed(999)  # move the global RNG elsewhere
    state, _ = load_checkpoint(tmp_path / "rng.pt")
    set_rng_state(state, "cpu")
    assert torch.equal(torch.rand(20), expected)


def test_generator_state_round_trip(tmp_path):
    g = torch.Generator().manual_seed(7)
    torch.rand(3, generator=g)
    save_checkpoint(tmp_path / "g.pt", {"gen": generator_state(g)}, {})
    expected = torch.rand(10, generator=g)
    other = torch.Generator().manual_seed(0)
    set_generator_state(other, load_checkpoint(tmp_path / "g.pt")[0]["gen"])
    assert torch.equal(torch.rand(10, generator=other), expected)


def test_bad_rng_inputs_raise():
    with pytest.raises(ValueError, match=r"state\['cpu'\]"):
        set_rng_state({}, "cpu")
    with pytest.raises(ValueError, match=r"state\['cpu'\]"):
        set_rng_state({"cpu": torch.zeros(3)}, "cpu")
    with pytest.raises(ValueError, match=r"state\['cuda'\]"):
        set_rng_state({"cpu": torch.get_rng_state()}, "cuda")
    with pytest.raises(ValueError, match="torch.Generator"):
        generator_state("g")
    with pytest.raises(ValueError, match="uint8"):
        set_generator_state(torch.Generator(), torch.zeros(3))


@pytest.mark.gpu
def test_cuda_round_trip_gpu(tmp_path):
    tensors = {k: v.cuda() for k, v in _tensors(3).items()}
    rng = rng_state("cuda")
    save_checkpoint(tmp_path / "ck.pt", {**tensors, **{f"rng_{k}": v for k, v in rng.items()}}, META)
    expected = torch.rand(8, device="cuda")
    loaded, meta = load_checkpoint(tmp_path / "ck.pt", device="cuda")
    assert all(t.is_cuda for t in loaded.values())
    assert all(torch.equal(loaded[k], t.detach()) for k, t in tensors.items())
    set_rng_state({"cpu": loaded["rng_cpu"], "cuda": loaded["rng_cuda"]}, "cuda")
    assert torch.equal(torch.rand(8, device="cuda"), expected)
    assert json.dumps(meta, allow_nan=True)
