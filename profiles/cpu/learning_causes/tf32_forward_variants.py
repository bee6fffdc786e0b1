"""The reference learner on the cartpole-fast preset with its forward GEMMs in emulated TF32 (H7 of this folder's
README: does the hotloop learner's TF32 forward make it collapse or diverge more often?), one run per call:
  plain    the reference learner as it is (IEEE FP32 on the CPU);
  tf32fwd  every F.linear (the online and target nets' forwards: the learner's three passes, the actor, the greedy
           evaluation) takes its input and weight truncated to TF32 (10 mantissa bits, the low 13 bits zeroed, as
           Hopper's tensor cores read FP32 operands), FP32 accumulation; the gradient passes the truncation
           unchanged (straight-through), so the backward's GEMMs are FP32 on the truncated operands, as the hotloop
           learner's FP32-accurate backward is on its TF32 forward's activations;
  tf32rn   the same with the operands rounded to the nearest TF32 value (ties away from zero, as CUDA's
           cvt.rna.tf32.f32) instead of truncated: the same error size, no bias toward zero.
Usage: python tf32_forward_variants.py SEED VARIANT OUT_DIR [PRESET]; prints one JSON row
(hotloop.profiles.learning_table) and writes OUT_DIR/<variant>_<preset>_s<seed>.csv (the per-epoch table)."""
import sys, time, json
import torch
import torch.nn.functional as F
from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer
from hotloop.profiles.learning_table import learning_row
from hotloop.profiles.epoch_table import epoch_frame

seed, variant, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
base = sys.argv[4] if len(sys.argv) > 4 else "cartpole-fast"
if variant not in ("plain", "tf32fwd", "tf32rn"):
    sys.exit(f"VARIANT must be plain, tf32fwd or tf32rn, got {variant!r}")
torch.set_num_threads(1)


def tf32(t: torch.Tensor) -> torch.Tensor:
    """t (float32) with the low 13 mantissa bits zeroed (tf32fwd) or rounded off (tf32rn: + half an ulp of TF32 to
    the magnitude first); the gradient passes unchanged."""
    bits = t.detach().contiguous().view(torch.int32)
    if variant == "tf32rn":
        bits = bits + 0x1000  # the magnitude's bits: a carry into the exponent is the correct rounding
    cut = (bits & ~0x1FFF).view(torch.float32)
    return t + (cut - t).detach()


if variant != "plain":
    linear = F.linear
    F.linear = lambda x, w, b=None: linear(tf32(x), tf32(w), b)
    torch.nn.modules.linear.F.linear = F.linear  # nn.Linear.forward looks F.linear up in its own module
cfg = preset(base, device="cpu", learner="reference", seed=seed)
t = Trainer(cfg)
rows = []
t0 = time.time()
for s in t.epochs():
    rows.append(s.as_row())
df = epoch_frame(rows)
df.to_csv(f"{out}/{variant}_{base}_s{seed}.csv", index=False)
r = learning_row(df, seed=seed, learner=f"reference-{variant}", device="cpu", process_wall_s=time.time() - t0)
print(json.dumps(r, default=str), flush=True)
