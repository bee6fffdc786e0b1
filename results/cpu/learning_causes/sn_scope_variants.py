"""The reference learner on the cartpole-fast preset with spectral norm on only some weight matrices (H5 of this
folder's README), one run per call:
  sn_trunk   the two trunk matrices normalized (each with its learned gain); the heads plain nn.Linear;
  sn_hidden  the trunk and the heads' hidden layers normalized; the two output layers plain.
Usage: python sn_scope_variants.py SEED VARIANT OUT_DIR [PRESET]; prints one JSON row (hotloop.profiles.learning_table)
and writes OUT_DIR/<variant>_<preset>_s<seed>.csv (the per-epoch table; renamed <variant>_s<seed>.csv in epochs/)."""
import sys
import torch
import hotloop.trainer.network as network
from hotloop.trainer.config import preset
from variant_run import train_and_report
seed, variant, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
base = sys.argv[4] if len(sys.argv) > 4 else "cartpole-fast"
torch.set_num_threads(1)
orig = network._linear
calls = []
# call order in BranchingDuelingQNet: trunk (2), value hidden, value out, branch hidden, branch out (cartpole)
normalized = {"sn_trunk": {0, 1}, "sn_hidden": {0, 1, 2, 4}}[variant]
def _linear(n_in, n_out, spectral_norm, power_iterations):
    i = len(calls); calls.append(i)
    return orig(n_in, n_out, i in normalized, power_iterations)
network._linear = _linear
cfg = preset(base, device="cpu", learner="reference", seed=seed, spectral_norm=True)
train_and_report(cfg, variant, base, out)
