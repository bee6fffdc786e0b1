"""The reference trainer's phases show up as named ranges in a torch.profiler (Kineto) trace."""

import torch

from hotloop.profiles.kineto_reader import read_kineto
from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer


def test_trainer_phases_are_ranges_in_the_trace(tmp_path):
    cfg = preset(
        "cartpole",
        device="cpu",
        epochs=1,
        learner_steps_per_epoch=3,
        learning_starts=32,
        batch_size=16,
        trunk_hidden=(8,),
        head_hidden=4,
        eval_episodes=0,
    )
    trainer = Trainer(cfg)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.run_epoch(1)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = read_kineto(tmp_path / "trace.json")
    names = events[events.kind == "user_annotation"].name.value_counts()
    assert names["step"] == 3
    for phase in (
        "env_step",
        "sample",
        "update",
        "priority_update",
        "ddqn_forward",
        "forward",
        "loss",
        "backward",
        "optimizer",
    ):
        assert names[phase] >= 3, phase
    assert names["readback"] == 1
