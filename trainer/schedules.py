"""Host-side schedules of scalar hyperparameters (epsilon, PER beta)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearSchedule:
    """start -> end linearly over `duration` steps, then constant at `end` (Mnih et al. 2015's epsilon decay).

    `value(t)` takes a step count t >= 0 (any unit, as long as duration uses the same) and returns a float.
    Raises ValueError if duration < 0.
    """

    start: float
    end: float
    duration: float

    def __post_init__(self) -> None:
        if self.duration < 0:
            raise ValueError(f"LinearSchedule: duration must be >= 0, got {self.duration}")

    def value(self, t: float) -> float:
        if self.duration == 0:
            return self.end
        frac = min(max(t / self.duration, 0.0), 1.0)
        return self.start + frac * (self.end - self.start)
