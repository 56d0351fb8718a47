"""Lifeguard's timing math: suspicion timeouts (memberlist's suspicionTimeout and
suspicion.go), local health, retransmit limits and push-pull scaling."""

from __future__ import annotations

import itertools
import math

import pytest

from laminar.swim import (
    Suspicion,
    SwimConfig,
    expected_confirmations,
    push_pull_interval_ms,
    retransmit_limit,
    suspicion_timeout_ms,
    suspicion_timeouts_ms,
)
from laminar.swim.awareness import Awareness

DEFAULT = SwimConfig()


def test_the_defaults_are_memberlists_default_lan_config() -> None:
    assert (DEFAULT.probe_interval_ms, DEFAULT.probe_timeout_ms) == (1000, 500)
    assert (DEFAULT.indirect_checks, DEFAULT.retransmit_mult) == (3, 4)
    assert (DEFAULT.suspicion_mult, DEFAULT.suspicion_max_timeout_mult) == (4, 6)
    assert DEFAULT.awareness_max_multiplier == 8
    assert (DEFAULT.gossip_interval_ms, DEFAULT.gossip_nodes) == (200, 3)


@pytest.mark.parametrize(
    "members, minimum",
    [
        (1, 4000),  # log10 scale floored at 1, as memberlist does
        (5, 4000),
        (10, 4000),
        (20, 5204),  # 4 * log10(20) * 1000 = 5204.1
        (100, 8000),
        (1000, 12000),
    ],
)
def test_suspicion_min_is_mult_log10_n_intervals_and_max_is_six_times_that(
    members: int, minimum: int
) -> None:
    assert suspicion_timeouts_ms(DEFAULT, members) == (minimum, 6 * minimum)


def test_suspicion_timeouts_follow_the_probe_interval() -> None:
    config = SwimConfig(probe_interval_ms=100, probe_timeout_ms=50, suspicion_mult=5)
    assert suspicion_timeouts_ms(config, 100) == (1000, 6000)


def test_the_timeout_starts_at_max_and_shrinks_to_min_with_confirmations() -> None:
    minimum, maximum, k = 5000, 30000, 3
    timeouts = [suspicion_timeout_ms(n, k, minimum, maximum) for n in range(6)]
    # max - (max - min) * log(1 + n) / log(1 + k): 30000, 17500, 10187.97.., 5000
    assert timeouts[:4] == [30000, 17500, 10187, 5000]
    assert timeouts[4:] == [5000, 5000]  # never below the minimum
    assert all(a > b for a, b in itertools.pairwise(timeouts[:4]))


def test_without_expected_confirmations_the_timeout_is_the_minimum() -> None:
    assert suspicion_timeout_ms(0, 0, 4000, 24000) == 4000


@pytest.mark.parametrize("members, k", [(1, 0), (3, 0), (4, 2), (20, 2), (500, 2)])
def test_expected_confirmations_is_suspicion_mult_minus_two_when_the_cluster_allows(
    members: int, k: int
) -> None:
    assert expected_confirmations(DEFAULT, members) == k


def test_a_suspicion_counts_each_independent_accuser_once() -> None:
    suspicion = Suspicion("a", expected=2, min_ms=4000, max_ms=24000, start_ms=1000)
    assert suspicion.deadline_ms == 1000 + 24000
    assert not suspicion.confirm("a")  # the first accuser is not a confirmation
    assert suspicion.confirm("b")
    assert not suspicion.confirm("b")  # a repeat
    assert suspicion.confirmations == 1
    assert suspicion.deadline_ms == 1000 + suspicion_timeout_ms(1, 2, 4000, 24000)
    assert suspicion.deadline_ms < 1000 + 24000
    assert suspicion.confirm("c")
    assert suspicion.deadline_ms == 1000 + 4000
    assert not suspicion.confirm("d")  # enough: the minimum is reached
    assert suspicion.confirmations == 2


def test_a_suspicion_needs_a_sane_window() -> None:
    with pytest.raises(ValueError):
        Suspicion("a", 2, 0, 100, 0)
    with pytest.raises(ValueError):
        Suspicion("a", 2, 200, 100, 0)


def test_local_health_scales_timeouts_and_is_bounded() -> None:
    awareness = Awareness(max_multiplier=8)
    assert awareness.scale_ms(500) == 500
    awareness.apply_delta(3)
    assert (awareness.multiplier, awareness.scale_ms(500)) == (4, 2000)
    awareness.apply_delta(100)
    assert awareness.multiplier == 8  # awareness_max_multiplier
    awareness.apply_delta(-100)
    assert awareness.multiplier == 1


@pytest.mark.parametrize("members, limit", [(1, 4), (9, 4), (10, 8), (20, 8), (99, 8), (100, 12)])
def test_each_update_is_retransmitted_retransmit_mult_times_log10_n(
    members: int, limit: int
) -> None:
    assert retransmit_limit(DEFAULT, members) == limit
    assert limit == DEFAULT.retransmit_mult * math.ceil(math.log10(members + 1))


@pytest.mark.parametrize("members, factor", [(2, 1), (32, 1), (33, 2), (64, 2), (65, 3), (129, 4)])
def test_push_pull_slows_down_for_large_clusters(members: int, factor: int) -> None:
    assert push_pull_interval_ms(DEFAULT, members) == factor * DEFAULT.push_pull_interval_ms


@pytest.mark.parametrize(
    "changes",
    [
        {"probe_timeout_ms": 1000},  # not below the probe interval
        {"probe_interval_ms": 0},
        {"gossip_nodes": 0},
        {"indirect_checks": -1},
        {"max_datagram_bytes": 70_000},
    ],
)
def test_nonsense_configurations_are_refused(changes: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SwimConfig(**changes)  # type: ignore[arg-type]
