"""results/lab/precision_bounds.py: the precision probe's errors for the step and its lab variants, side by side (the CPU
smoke of the CLI; the GPU run is the measurement the bounds are set from)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lab.precision_bounds import CONFIGS, main, variant_launchers


def test_an_unknown_configuration_is_refused_naming_the_known_ones():
    hot = SimpleNamespace(linear_forward=print, linear_backward_input=len, round_weights=abs)  # what Launchers.of reads
    with pytest.raises(ValueError, match="configuration 'bf16_forward'.*tf32x3_backward"):
        variant_launchers(hot, "bf16_forward")
    own = variant_launchers(hot, "step")
    assert (own.forward, own.backward_input) == (print, len) and len(CONFIGS) == 4
    assert variant_launchers(hot, "ieee_forward").forward is not print


def test_cli_prints_each_configuration(capsys):
    if torch.cuda.is_available():
        pytest.skip("CPU smoke of the CLI; the GPU run is the lead's measurement")
    rc = main(
        [
            "--preset",
            "seed-scale",
            "--set",
            "batch_size=32",
            "--set",
            "trunk_hidden=(24, 16)",
            "--set",
            "head_hidden=16",
            "--set",
            "obs_dim=12",
            "--set",
            "action_nvec=(3, 3)",
            "--set",
            "replay_capacity=128",
            "--steps",
            "1",
            "--device",
            "cpu",
            "--configs",
            "step,tf32_backward",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "== step: not measured" in out and "== tf32_backward: not measured" in out
    assert "backward.dW.L0" in out and "FP32_BOUND 1e-05" in out
