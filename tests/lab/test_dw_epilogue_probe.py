"""results/lab/dw_epilogue_probe.py on the CPU interpreter: its `partials` variant (each split stores its slab)
computes the dW of the step's atomic epilogue, at the step's split rule and at twice as many splits, and the split
count grows with the program floor; bad variants are refused."""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels._common import interpreting
from lab.dw_epilogue_probe import check_variant, inputs, launch_grid, variant_module

pytestmark = pytest.mark.skipif(not interpreting(), reason="runs the dW kernel copies on the CPU interpreter")


@pytest.mark.parametrize("scale", [1, 2])
def test_the_partials_slabs_sum_to_the_atomic_result(scale):
    assert check_variant(scale, 32, 48, 512, torch.device("cpu")) < 1e-5


def test_more_splits_at_a_higher_program_floor():
    ops = inputs(256, 256, 8192, torch.device("cpu"))  # 4 tiles: 33 splits for 132 programs
    one, four = launch_grid(variant_module("atomic", 1), ops), launch_grid(variant_module("atomic", 4), ops)
    assert one[:2] == four[:2] and four[2] > one[2] >= 2


def test_bad_variants_are_refused():
    with pytest.raises(ValueError, match="variant must be atomic or partials"):
        variant_module("fused", 1)
    with pytest.raises(ValueError, match="scale >= 1"):
        variant_module("atomic", 0)


@pytest.mark.parametrize("args", [["--scales", "0"], ["--scales", "1,x"], ["--repeats", "-3"]])
def test_bad_arguments_exit_2_before_any_work(args, capsys):
    from lab.dw_epilogue_probe import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and "integers >= 1" in capsys.readouterr().err
