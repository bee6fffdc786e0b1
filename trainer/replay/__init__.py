"""Replay buffers: proportional prioritized experience replay (Schaul et al. 2016) on a device sum tree."""

from hotloop.kernels.sum_tree import SumTree
from hotloop.trainer.replay.prioritized import PrioritizedBatch, PrioritizedReplay

__all__ = ["PrioritizedBatch", "PrioritizedReplay", "SumTree"]
