"""The shared tail of this folder's variant scripts: train one run of the reference learner on the CPU, write its
per-epoch table as OUT_DIR/<variant>_<preset>_s<seed>.csv and print its hotloop.profiles.learning_table row as
one JSON line."""
import json
import time

from hotloop.profiles.epoch_table import epoch_frame
from hotloop.profiles.learning_table import learning_row
from hotloop.trainer.loop import Trainer


def train_and_report(cfg, variant: str, base: str, out: str) -> dict:
    """Train `cfg` (a reference-learner Config on the CPU) to its last epoch; returns the printed row."""
    t = Trainer(cfg)
    t0 = time.time()
    df = epoch_frame([s.as_row() for s in t.epochs()])
    df.to_csv(f"{out}/{variant}_{base}_s{cfg.seed}.csv", index=False)
    row = learning_row(df, seed=cfg.seed, learner=f"reference-{variant}", device="cpu",
                       process_wall_s=time.time() - t0)
    print(json.dumps(row, default=str), flush=True)
    return row
