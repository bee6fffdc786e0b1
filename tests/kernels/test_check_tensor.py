"""kernels._common.check_tensor, the one tensor validator of the kernel launchers, the reference sum tree and the
replay: each constraint's message names the argument and what is wrong."""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels._common import check_net_stride, check_tensor, check_torch_input


@pytest.mark.parametrize(
    "t,kwargs,match",
    [
        ([1.0], {}, "x must be a torch.Tensor, got list"),
        (
            torch.ones(2),
            {"dtype": (torch.int32, torch.int64)},
            "x must have dtype torch.int32 or torch.int64, got torch.float32",
        ),
        (torch.ones(2, dtype=torch.int64), {"kind": "float"}, "x must have a floating-point dtype, got torch.int64"),
        (torch.ones(2, dtype=torch.bool), {"kind": "int"}, "x must have an integer dtype, got torch.bool"),
        (torch.ones(2, 3), {"ndim": 1}, r"x must be 1-D, got shape \(2, 3\)"),
        (torch.ones(2, 3), {"shape": (None, 4)}, r"x must have shape \(None, 4\) \(None = any\), got \(2, 3\)"),
        (torch.ones(2, device="meta"), {"device": "cpu"}, "x must be on cpu, got meta"),
        (torch.ones(3, 2).t(), {}, r"x must be contiguous \(strides \(1, 2\)\)"),
    ],
)
def test_each_constraint_names_the_argument_and_the_fault(t, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_tensor("x", t, triton=False, **kwargs)


def test_a_matching_tensor_is_returned():
    t = torch.ones(2, 3)
    assert (
        check_tensor("x", t, dtype=torch.float32, kind="float", ndim=2, shape=(None, 3), device="cpu", triton=False)
        is t
    )
    assert check_tensor("x", t.t(), contiguous=False, triton=False).shape == (3, 2)


def test_a_launch_input_must_be_on_cuda_unless_interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="x is on cpu: Triton kernels need CUDA tensors"):
        check_tensor("x", torch.ones(2))
    assert check_tensor("x", torch.ones(2), triton=False) is not None  # torch-only code runs anywhere
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert check_tensor("x", torch.ones(2)) is not None


def test_a_torch_only_input_takes_any_strides_and_device_type_and_keeps_the_other_checks(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    t = torch.ones(3, 2).t()  # not contiguous, on the CPU, outside the interpreter
    assert check_torch_input("x", t, kind="float", shape=(2, 3)) is t
    with pytest.raises(ValueError, match="x must have an integer dtype, got torch.float32"):
        check_torch_input("x", t, kind="int")


def test_net_stride_must_keep_the_second_net_inside_each_views_storage():
    buf = torch.zeros(2, 10)
    w, b = buf[0, :6].view(2, 3), buf[0, 6:10]
    assert check_net_stride(10, ("w", w), ("b", b)) == 10
    with pytest.raises(
        ValueError, match=r"p_zstride 11 puts net 1's b past the end of its storage \(element 20 of 20\)"
    ):
        check_net_stride(11, ("w", w), ("b", b))
    with pytest.raises(ValueError, match="p_zstride 15 puts net 1's w past"):
        check_net_stride(15, ("w", w))  # w's last float: 5 + 15 = 20
    assert check_net_stride(14, ("w", w)) == 14
    col = buf[0, :6].view(3, 2).t()  # strided: its last element is float 5
    with pytest.raises(ValueError, match="net 1's col past"):
        check_net_stride(15, ("col", col))
    for bad in (-1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="p_zstride must be an int >= 0"):
            check_net_stride(bad, ("w", w))
    assert check_net_stride(99, ("empty", buf[0, :0])) == 99  # an empty view reads nothing
