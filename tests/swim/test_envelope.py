"""The envelope every datagram carries under its MAC (sender address, timestamp, nonce) and
the core's checks on it: a genuine datagram replayed from another address, replayed from the
same one, or too old or too new, is dropped and never answered (docs/security.md)."""

from __future__ import annotations

import random

import pytest

from laminar.swim import SwimConfig
from laminar.swim.address import sender_matches
from laminar.swim.codec import Codec, Stamp, encode_update
from laminar.swim.core import ReplayCache, Swim
from laminar.swim.member import Addresses, Member
from laminar.swim.messages import Ack, Alive, Datagram, Gossip, Ping, Sync
from laminar.swim.sim import SwimSimConfig, SwimSimulation

from .helpers import CLUSTER, SECRET, Harness, codec, member, stamp

WALL_MS = 1_700_000_000_000  # a wall clock far from the monotonic one


def ping_from(sender: str, seq: int, at_ms: int) -> bytes:
    return codec(sender=sender).encode(Ping(seq, "me", 1, "a", 1), stamp=stamp(at_ms))


def test_a_genuine_ping_replayed_from_another_address_is_not_answered() -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    genuine = ping_from("a:7946", 11, h.now_ms)
    h.core.receive(genuine, "a:7946", h.now_ms)
    h.collect()
    assert [(s.to, s.datagram.message) for s in h.take_sent()] == [("a:7946", Ack(11))]
    h.core.receive(genuine, "evil:7946", h.now_ms)  # sniffed, sent again from elsewhere
    assert h.core.outbox() == []
    assert h.core.dropped == {"wrong_sender": 1}


def test_a_sync_replayed_from_another_address_is_not_answered() -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    request = codec(sender="a:7946").encode(Sync("a", True, ()), stamp=stamp(h.now_ms))
    h.core.receive(request, "evil:7946", h.now_ms)
    assert h.core.outbox() == []
    h.core.receive(request, "a:7946", h.now_ms)  # the genuine one is still answered
    h.collect()
    assert {s.to for s in h.take_sent()} == {"a:7946"}
    assert h.core.dropped == {"wrong_sender": 1}


def test_an_exact_replay_from_the_same_address_is_dropped() -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    genuine = ping_from("a:7946", 12, h.now_ms)
    h.core.receive(genuine, "a:7946", h.now_ms)
    h.core.outbox()
    for delay_ms in (0, 1_000, SKEW_MS - 1):
        h.core.receive(genuine, "a:7946", h.now_ms + delay_ms)
        assert h.core.outbox() == []
    assert h.core.dropped == {"replay": 3}
    # The same message in a fresh datagram (another nonce) is answered.
    h.core.receive(ping_from("a:7946", 12, h.now_ms), "a:7946", h.now_ms)
    assert len(h.core.outbox()) == 1


SKEW_MS = SwimConfig().max_clock_skew_ms


@pytest.mark.parametrize("offset_ms", [-SKEW_MS - 1, SKEW_MS + 1, -3_600_000, 10**9])
def test_a_timestamp_outside_the_window_is_dropped(offset_ms: int) -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    now_ms = 40_000_000
    h.core.receive(ping_from("a:7946", 13, now_ms + offset_ms), "a:7946", now_ms)
    assert h.core.outbox() == []
    assert h.core.dropped == {"stale": 1}


@pytest.mark.parametrize("offset_ms", [-SKEW_MS, -60_000, 0, 60_000, SKEW_MS])
def test_a_timestamp_inside_the_window_is_accepted(offset_ms: int) -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    now_ms = 40_000_000
    h.core.receive(ping_from("a:7946", 14, now_ms + offset_ms), "a:7946", now_ms)
    assert [to for to, _ in h.core.outbox()] == ["a:7946"] and h.core.dropped == {}


def test_the_wall_clock_stamps_and_checks_datagrams_while_timers_follow_now_ms() -> None:
    """A driver passes the monotonic clock for timers and the wall clock for stamps: peers
    compare wall clocks, never each other's monotonic ones."""
    me = member("me")
    core = Swim(SwimConfig(), me, ["s:7946"], random.Random(1), CLUSTER, SECRET)
    core.tick(5, WALL_MS)
    sent = [codec().decode(data) for _, data in core.outbox()]
    assert sent and all(isinstance(d, Datagram) for d in sent)
    assert {d.timestamp_ms for d in sent if isinstance(d, Datagram)} == {WALL_MS}
    assert {d.sender for d in sent if isinstance(d, Datagram)} == {"me:7946"}
    nonces = [d.nonce for d in sent if isinstance(d, Datagram)]
    assert len(set(nonces)) == len(nonces)
    ping = codec(sender="s:7946").encode(Ping(1, "me", 1, "s", 1), stamp=Stamp(WALL_MS, 1))
    core.receive(ping, "s:7946", 6, WALL_MS + 1)
    assert [to for to, _ in core.outbox()][:1] == ["s:7946"]
    stale = codec(sender="s:7946").encode(Ping(2, "me", 1, "s", 1), stamp=Stamp(6, 2))
    core.receive(stale, "s:7946", 7, WALL_MS + 2)  # stamped with a monotonic clock
    assert core.outbox() == [] and core.dropped == {"stale": 1}


def test_a_datagram_claiming_to_come_from_us_is_dropped() -> None:
    h = Harness()
    h.take_sent()
    ours = codec(sender="me:7946").encode(Sync("me", True, ()), stamp=stamp(h.now_ms))
    h.core.receive(ours, "me:7946", h.now_ms)
    assert h.core.outbox() == [] and h.core.dropped == {"wrong_sender": 1}


@pytest.mark.parametrize(
    "declared, source, expected",
    [
        ("10.0.0.1:7946", "10.0.0.1:7946", True),
        ("10.0.0.1:7946", "10.0.0.2:7946", False),  # another host
        ("10.0.0.1:7946", "10.0.0.1:7947", False),  # another port
        ("10.0.0.1:7946", "[::ffff:10.0.0.1]:7946", True),  # dual-stack socket
        ("[fd00::1]:7946", "[fd00:0:0::1]:7946", True),  # the same IPv6 address spelled twice
        ("[fd00::1]:7946", "[fd00::2]:7946", False),
        ("pod-0.peers:7946", "10.0.0.1:7946", True),  # resolves to it
        ("POD-0.peers.:7946", "10.0.0.1:7946", True),  # names are case-insensitive
        ("pod-1.peers:7946", "10.0.0.1:7946", False),  # resolves elsewhere
        ("pod-2.peers:7946", "10.0.0.1:7946", None),  # not resolved yet
        ("pod-0.peers:7947", "10.0.0.1:7946", False),
        ("garbage", "10.0.0.1:7946", False),
    ],
)
def test_the_declared_sender_must_be_the_source(
    declared: str, source: str, expected: bool | None
) -> None:
    names = {"pod-0.peers": {"10.0.0.1"}, "pod-1.peers": {"10.0.0.9"}}

    def check_host(name: str, ip: str) -> bool | None:
        known = names.get(name)
        return None if known is None else ip in known

    assert sender_matches(declared, source, check_host) is expected


def test_a_declared_host_name_is_checked_through_the_driver() -> None:
    answers: dict[str, bool | None] = {"a": None}
    asked: list[tuple[str, str]] = []

    def check_host(name: str, ip: str) -> bool | None:
        asked.append((name, ip))
        return answers[name]

    core = Swim(
        SwimConfig(), member("me"), [], random.Random(1), CLUSTER, SECRET, check_host=check_host
    )
    core.tick(0)
    core.outbox()
    for seq, answer in enumerate((None, False, True)):
        answers["a"] = answer
        core.receive(
            codec(sender="a:7946").encode(Ping(seq, "me", 1, "a", 1), stamp=stamp(0)),
            "10.1.1.1:7946",
            0,
        )
    assert asked == [("a", "10.1.1.1")] * 3
    assert core.dropped == {"unverified_sender": 1, "wrong_sender": 1}
    ((to, reply), *_) = core.outbox()
    decoded = codec().decode(reply)
    assert to == "10.1.1.1:7946" and isinstance(decoded, Datagram)
    assert decoded.message == Ack(2)
    without = Swim(SwimConfig(), member("me"), [], random.Random(1), CLUSTER, SECRET)
    without.receive(
        codec(sender="a:7946").encode(Ping(1, "me", 1, "a", 1), stamp=stamp(0)), "10.1.1.1:7946", 0
    )
    assert without.dropped == {"wrong_sender": 1}


def test_the_replay_cache_is_bounded_and_forgetting_never_lets_a_replay_through() -> None:
    cache = ReplayCache(window_ms=120_000, per_sender=4, max_senders=2)
    now = 1_000_000
    for nonce in range(6):
        assert cache.accept("a:1", now + nonce, nonce, now)
    assert len(cache) == 4
    for nonce in range(6):  # the forgotten ones are below the floor, the others remembered
        assert not cache.accept("a:1", now + nonce, nonce, now)
    assert cache.accept("a:1", now + 10, 10, now)
    # Older than the window: forgotten, and refused by the floor (the core's clock check
    # refuses them too, but a clock that steps back must not reopen them).
    assert cache.accept("a:1", now + 20, 20, now + 200_000)
    assert len(cache) == 1
    assert not cache.accept("a:1", now + 10, 10, now)
    # Senders: the least recently heard is forgotten; a new one starts above its floor.
    assert cache.accept("b:1", now + 5, 5, now)
    assert cache.accept("c:1", now + 5, 5, now)  # "a:1" goes
    assert not cache.accept("a:1", now + 20, 20, now)  # its last datagram stays refused
    assert cache.accept("a:1", now + 21, 21, now)


def test_a_full_member_table_of_senders_still_bounds_the_cache() -> None:
    config = SwimConfig(max_members=4, replay_cache_per_sender=2)
    h = Harness(config=config)
    for i in range(20):
        sender = f"s{i}:7946"
        for _ in range(5):
            h.core.receive(
                codec(config, sender=sender).encode(Gossip(), stamp=stamp(h.now_ms)),
                sender,
                h.now_ms,
            )
    assert len(h.core._replays) <= config.max_members * config.replay_cache_per_sender


def test_the_simulator_drops_duplicated_datagrams_as_replays_and_still_converges() -> None:
    sim = SwimSimulation(5, SwimSimConfig(nodes=6, seeds=2, duplicate_rate=0.3))
    sim.run_until(20_000)
    assert sim.stats["duplicated"] > 0
    replays = sum(sim.core(n).dropped.get("replay", 0) for n in sim.up())
    # Every duplicate that reached a node after its original was refused (a few reach a
    # node that is not up yet, or are dropped for another reason first).
    assert 0 < replays <= sim.stats["duplicated"]
    assert all(sorted(sim.view(n)) == sorted(sim.nodes) for n in sim.up())


def test_a_datagram_replayed_in_the_simulator_from_another_node_changes_nothing() -> None:
    sim = SwimSimulation(6, SwimSimConfig(nodes=4, seeds=1))
    sim.run_until(10_000)
    before = sim.view("n01")
    # A genuine alive update of a newcomer, sealed by n00 ...
    newcomer = Member("ghost", Addresses("g:1", "g:2", "10.0.9.9:7946"), weight=1000, epoch=1)
    data = Codec(sim.config.cluster_id, sim.config.secret, 1400, sender=sim.address("n00")).encode(
        Gossip(), [encode_update(Alive(newcomer, 0))], stamp=Stamp(sim.now_ms, 1)
    )
    # ... arriving from n02's address: dropped.
    sim.inject("n01", data, sim.address("n02"))
    sim.run_for(1)
    assert sim.core("n01").dropped.get("wrong_sender") == 1
    assert "ghost" not in sim.view("n01") and sim.view("n01").keys() == before.keys()
