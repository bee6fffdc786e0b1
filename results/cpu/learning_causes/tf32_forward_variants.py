"""The reference learner on the cartpole-fast preset with its forward GEMMs in emulated TF32 (H6 of this folder's
README: does the hotloop learner's TF32 forward make it collapse or diverge more often?), one run per call:
  ieee     the reference learner as it is (IEEE FP32 on the CPU);
  tf32fwd  every F.linear (the online and target nets' forwards: the learner's three passes, the actor, the greedy
           evaluation) takes its input and weight truncated to TF32 (10 mantissa bits, the low 13 bits zeroed, as
           Hopper's tensor cores read FP32 operands), FP32 accumulation; the gradient passes the truncation
           unchanged (straight-through), so the backward's GEMMs are FP32 on the truncated operands, as the hotloop
           learner's FP32-accurate backward is on its TF32 forward's activations;
  tf32rn   the same with the operands rounded to the nearest TF32 value (ties away from zero, as CUDA's
           cvt.rna.tf32.f32) instead of truncated: the same error size, no bias toward zero;
  tf32fit  truncated TF32 only where autograd records (the online net's forward on s, the one the loss fits);
  tf32target  truncated TF32 only where it does not (the Double-DQN forwards on s', the actor, the evaluation).
Usage: python tf32_forward_variants.py SEED VARIANT OUT_DIR [PRESET]; prints one JSON row
(hotloop.profiles.learning_table) and writes OUT_DIR/<variant>_<preset>_s<seed>.csv (the per-epoch table)."""
import sys
import torch
import torch.nn.functional as F
from hotloop.trainer.config import preset
from variant_run import train_and_report

seed, variant, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
base = sys.argv[4] if len(sys.argv) > 4 else "cartpole-fast"
VARIANTS = ("ieee", "tf32fwd", "tf32rn", "tf32fit", "tf32target")
if variant not in VARIANTS:
    sys.exit(f"VARIANT must be one of {VARIANTS}, got {variant!r}")
torch.set_num_threads(1)


def tf32(t: torch.Tensor) -> torch.Tensor:
    """t (float32) with the low 13 mantissa bits zeroed (tf32fwd) or rounded off (tf32rn: + half an ulp of TF32 to
    the magnitude first); the gradient passes unchanged."""
    bits = t.detach().contiguous().view(torch.int32)
    if variant == "tf32rn":
        bits = bits + 0x1000  # the magnitude's bits: a carry into the exponent is the correct rounding
    cut = (bits & ~0x1FFF).view(torch.float32)
    return t + (cut - t).detach()


def wanted() -> bool:
    """Whether this F.linear call takes TF32 operands under the variant."""
    if variant == "tf32fit":
        return torch.is_grad_enabled()
    if variant == "tf32target":
        return not torch.is_grad_enabled()
    return True


if variant != "ieee":
    linear = F.linear
    F.linear = lambda x, w, b=None: linear(tf32(x), tf32(w), b) if wanted() else linear(x, w, b)
    torch.nn.modules.linear.F.linear = F.linear  # nn.Linear.forward looks F.linear up in its own module
cfg = preset(base, device="cpu", learner="reference", seed=seed)
train_and_report(cfg, variant, base, out)
