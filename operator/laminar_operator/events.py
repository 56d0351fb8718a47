"""Which Kubernetes Events the operator posts: a spam filter in front of kopf's event poster.

Pure (the clock is passed in). It is client-go's EventCorrelator in small:
* an event identical to one posted for the same object (same reason and message) within
  REPEAT_S is dropped, so a failure retried every few seconds is told once, and again only
  when it changes or persists past REPEAT_S;
* each object has a token bucket of BURST events, refilled at one per REFILL_S, so a flapping
  object cannot flood the namespace's events.

Memory is bounded: at most MAX_OBJECTS objects are remembered, the least recently seen
forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

BURST = 10
REFILL_S = 60.0
REPEAT_S = 600.0
MAX_OBJECTS = 10_000
#: Per object, at most this many distinct (reason, message) pairs are remembered.
MAX_REMEMBERED = 32


@dataclass
class _Bucket:
    tokens: float
    at_s: float
    posted: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict)


class EventLimiter:
    def __init__(
        self,
        burst: int = BURST,
        refill_s: float = REFILL_S,
        repeat_s: float = REPEAT_S,
        max_objects: int = MAX_OBJECTS,
    ) -> None:
        self.burst, self.refill_s, self.repeat_s = burst, refill_s, repeat_s
        self.max_objects = max_objects
        self._objects: OrderedDict[str, _Bucket] = OrderedDict()

    def allow(self, uid: str, reason: str, message: str, now_s: float) -> bool:
        """Whether to post this event for the object `uid` now (and remember it if so)."""
        bucket = self._objects.pop(uid, None) or _Bucket(float(self.burst), now_s)
        self._objects[uid] = bucket  # the most recently seen last
        while len(self._objects) > self.max_objects:
            self._objects.popitem(last=False)
        elapsed_s = max(0.0, now_s - bucket.at_s)
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed_s / self.refill_s)
        bucket.at_s = now_s
        key = (reason, message)
        last_s = bucket.posted.get(key)
        if last_s is not None and now_s - last_s < self.repeat_s:
            return False
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        bucket.posted.pop(key, None)
        bucket.posted[key] = now_s
        while len(bucket.posted) > MAX_REMEMBERED:
            bucket.posted.popitem(last=False)
        return True

    def forget(self, uid: str) -> None:
        """The object is gone."""
        self._objects.pop(uid, None)
