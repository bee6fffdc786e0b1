"""Replay buffers: proportional prioritized experience replay (Schaul et al. 2016) on a device sum tree."""

from hotloop.trainer.replay.prioritized import PrioritizedBatch, PrioritizedReplay
from hotloop.kernels.sum_tree import SumTree

__all__ = ["PrioritizedBatch", "PrioritizedReplay", "SumTree"]
