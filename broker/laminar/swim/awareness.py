"""Lifeguard's local health multiplier: a node that misses acks or must refute suspicions of
itself is probably the slow one, so it probes less eagerly instead of accusing others."""

from __future__ import annotations


class Awareness:
    """A health score in [0, max_multiplier - 1]; 0 is healthy. Timeouts are scaled by
    score + 1."""

    __slots__ = ("max_multiplier", "score")

    def __init__(self, max_multiplier: int) -> None:
        if max_multiplier < 1:
            raise ValueError("max_multiplier must be at least 1")
        self.max_multiplier = max_multiplier
        self.score = 0

    def apply_delta(self, delta: int) -> None:
        self.score = min(self.max_multiplier - 1, max(0, self.score + delta))

    @property
    def multiplier(self) -> int:
        return self.score + 1

    def scale_ms(self, timeout_ms: int) -> int:
        return timeout_ms * self.multiplier
