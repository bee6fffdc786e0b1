"""Replay buffers: proportional prioritized experience replay (Schaul et al. 2016) on a device sum tree."""

from trainer.replay.prioritized import PrioritizedBatch, PrioritizedReplay
from trainer.replay.sum_tree import SumTree

__all__ = ["PrioritizedBatch", "PrioritizedReplay", "SumTree"]
