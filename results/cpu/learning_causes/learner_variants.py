"""The reference learner on the cartpole-fast preset in three variants, one run per call (the record of the runs in
this folder's README):
  plain  the preset as it is (spectral norm off: plain nn.Linear layers, no gain);
  gain   spectral norm off but a learned scalar gain per weight matrix (ScaledLinear), the parameterization the
         hotloop learner's flat network always has (trainer/flat_net.py);
  sn     spectral norm on (torch's parametrization with a learned gain, trainer/network.py);
  snlog  spectral norm on with the gain learned in log space (gain = exp(s)).
Usage: python learner_variants.py SEED VARIANT OUT_DIR; prints one JSON row (hotloop.profiles.learning_table plus
the final gains) and writes OUT_DIR/<variant>_s<seed>.csv (the per-epoch table)."""
import sys, time, json
import torch
from torch import nn
import hotloop.trainer.network as network
from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer
from hotloop.profiles.learning_table import learning_row
from hotloop.profiles.epoch_table import epoch_frame

seed, variant, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
if variant == "gain":
    orig = network._linear
    def _linear(n_in, n_out, spectral_norm, power_iterations):
        if spectral_norm:
            return orig(n_in, n_out, spectral_norm, power_iterations)
        return network.ScaledLinear(n_in, n_out, gain_init=1.0)
    network._linear = _linear
extra = {"spectral_norm": True} if variant in ("sn", "snlog") else {}
if variant == "snlog":
    # spectral norm on, the gain learned in log space (gain = exp(s), s init 0): Adam then moves the layer's scale
    # by a factor ~exp(lr) per step instead of by ~lr
    def _init(self, in_features, out_features, gain_init):
        nn.Linear.__init__(self, in_features, out_features)
        self.log_gain = nn.Parameter(torch.tensor(float(gain_init)).log())

    network.ScaledLinear.__init__ = _init
    network.ScaledLinear.forward = lambda self, x: nn.functional.linear(x, self.weight * self.log_gain.exp(), self.bias)
    network.ScaledLinear.gain = property(lambda self: self.log_gain.exp())
cfg = preset("cartpole-fast", device="cpu", learner="reference", seed=seed, **extra)
t = Trainer(cfg)
rows = []
t0 = time.time()
for s in t.epochs():
    rows.append(s.as_row())
gains = [float(m.gain) for m in t.learner.online.modules() if isinstance(m, network.ScaledLinear)]
df = epoch_frame(rows)
df.to_csv(f"{out}/{variant}_s{seed}.csv", index=False)
r = learning_row(df, seed=seed, learner=f"reference-{variant}", device="cpu", process_wall_s=time.time() - t0)
r["gains"] = [round(g, 3) for g in gains]
print(json.dumps(r, default=str))
