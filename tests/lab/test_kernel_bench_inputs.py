"""results/lab/kernel_bench_inputs.py: the kernel bench's seed-scale inputs and (kernel, reference) pairs, built and run
once (CPU: the kernels under the Triton interpreter; the sum tree's 2^20 leaves make its pairs GPU-only)."""

import pytest
import torch

from hotloop.kernels.spectral_norm import SEED_SHAPES
from lab.kernel_bench_inputs import PAIRS, adam_inputs, adam_pairs, spectral_norm_inputs, spectral_norm_pairs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_adam_pairs_seed_scale_smoke():
    inp = adam_inputs(DEVICE)
    assert 240_000 <= inp["params_buf"].numel() <= 256_000 and len([s for s in inp["shapes"] if len(s) == 2]) == 10
    pairs = adam_pairs(DEVICE)
    assert [name for name, _, _ in pairs] == ["gradnorm_clip_adam_248k", "gradnorm_clip_adam_248k_vs_torch_fused"]
    params_before = inp["params_buf"].clone()
    pairs[0][1]()  # the kernel closure is shared
    for _, _, reference in pairs:
        reference()
    assert torch.equal(adam_inputs(DEVICE)["params_buf"], params_before)  # fixed seed: the same inputs each time


def test_spectral_norm_inputs_are_the_seed_table():
    x = spectral_norm_inputs(DEVICE)
    assert x["params_buf"].shape == (sum(r * c for r, c in SEED_SHAPES),) == (246800,)
    assert x["u"].shape == (x["table"].total_rows,)
    ((name, kernel, ref),) = spectral_norm_pairs(DEVICE)
    assert name == "spectral_norm_10_matrices" and callable(kernel) and callable(ref)


def test_the_bench_times_the_four_kernel_modules():
    assert list(PAIRS) == [
        "hotloop.kernels.segment_tree",
        "hotloop.kernels.spectral_norm",
        "hotloop.kernels.fused_adam",
        "hotloop.kernels.td_loss",
    ]


@pytest.mark.gpu
def test_gpu_every_pair_runs():
    for pairs in PAIRS.values():
        for _, kernel, ref in pairs("cuda"):
            kernel()
            ref()
    torch.cuda.synchronize()
