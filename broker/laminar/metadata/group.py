"""Where the `__cluster` metadata group lives: up to 3 voters chosen by rendezvous placement;
every other live node follows it as a learner, so any node can answer metadata queries."""

from __future__ import annotations

from collections.abc import Iterable

from ..placement import Candidate, place

METADATA_GROUP = "__cluster"
METADATA_VOTERS = 3


def metadata_voters(candidates: Iterable[Candidate]) -> list[str]:
    """The metadata group's target voters among eligible (alive, not draining) nodes."""
    return place(METADATA_GROUP, candidates, METADATA_VOTERS)
