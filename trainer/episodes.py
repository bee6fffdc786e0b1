"""Device-side bookkeeping of finished episodes' returns, with no host sync per env step."""

from __future__ import annotations

import torch


class EpisodeReturns:
    """Running returns of N envs and a ring of finished episodes' returns (the mean is over the last `window`), all on `device`.

    `update` scatters finished returns into the ring at positions derived from a device-side counter (a cumsum
    over the finished envs), so it never reads a device value on the host; unfinished envs write to a spare slot.
    Reading (`mean`, `count`) is the only host sync, done once per epoch.
    """

    def __init__(self, num_envs: int, device: torch.device, window: int = 100) -> None:
        if num_envs < 1 or window < 1:
            raise ValueError(f"EpisodeReturns: num_envs and window must be >= 1, got {num_envs}, {window}")
        self.window = window
        self.capacity = window + num_envs  # one step can finish every env without overwriting the window
        self.running = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.ring = torch.zeros(self.capacity + 1, dtype=torch.float64, device=device)  # last slot: spare
        self.finished = torch.zeros((), dtype=torch.int64, device=device)

    def update(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """reward (N,) float, done (N,) bool: add rewards; record and clear the returns of finished episodes."""
        self.running += reward.to(self.running.dtype)
        done_i = done.to(torch.int64)
        slot = (self.finished + done_i.cumsum(0) - 1) % self.capacity
        slot = torch.where(done, slot, torch.full_like(slot, self.capacity))
        self.ring.scatter_(0, slot, self.running)
        self.finished += done_i.sum()
        self.running.masked_fill_(done, 0.0)

    def mean(self) -> float:
        """Mean return of the last min(window, finished) episodes (nan if none finished). Host sync."""
        finished = int(self.finished)
        n = min(finished, self.window)
        if n == 0:
            return float("nan")
        slots = (finished - 1 - torch.arange(n, device=self.ring.device)) % self.capacity
        return float(self.ring[slots].mean())

    def count(self) -> int:
        """Episodes finished so far. Host sync."""
        return int(self.finished)
