"""A run's schedule of faults, drawn from the seed alone (pure: the same seed and kinds give
the same schedule on any machine; which broker a role such as "the leader" names is decided
when the fault is injected)."""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = (
    "kill9",
    "kill9_leader",
    "kill9_meta_leader",
    "kill9_all",
    "pause",
    "isolate",
    "isolate_leader",
    "one_way",
    "bridge",
    "bitflip_clean",
    "bitflip_kill9",
    "disk_full",
    "clock_jump",
)
HOLD_S_RANGE = (3.0, 7.0)
GAP_S_RANGE = (2.0, 4.0)
CLOCK_JUMP_S = 60


@dataclass(frozen=True)
class FaultPlan:
    number: int
    kind: str
    pick: int  # chooses the target among the candidates at injection time
    hold_s: float  # between inject and heal
    gap_s: float  # after heal, before the next inject
    clock_offset_s: int  # clock_jump only: + or - CLOCK_JUMP_S


def parse_kinds(text: str) -> list[str]:
    """`mixed` (every kind) or a comma-separated list of kinds."""
    if text == "mixed":
        return list(KINDS)
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {unknown}; choose from mixed or {', '.join(KINDS)}")
    return kinds


def make_schedule(seed: int, kinds: list[str], count: int) -> list[FaultPlan]:
    """`count` faults: every kind once in a seeded order first (while count allows), then
    seeded picks among the kinds."""
    rng = random.Random(f"schedule-{seed}")
    first = list(kinds)
    rng.shuffle(first)
    chosen = first[:count] + [rng.choice(kinds) for _ in range(count - len(first))]
    return [
        FaultPlan(
            number=n,
            kind=kind,
            pick=rng.randrange(1 << 30),
            hold_s=round(rng.uniform(*HOLD_S_RANGE), 2),
            gap_s=round(rng.uniform(*GAP_S_RANGE), 2),
            clock_offset_s=rng.choice((CLOCK_JUMP_S, -CLOCK_JUMP_S)),
        )
        for n, kind in enumerate(chosen)
    ]
