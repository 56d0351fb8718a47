"""The SWIM core, one rule per test (SWIM paper, memberlist, Lifeguard): a real core driven by
hand-made datagrams and virtual time, asserting on what it sends, its table and its events."""

from __future__ import annotations

import random

import pytest

from laminar.swim import (
    EventKind,
    MemberState,
    MemberStatus,
    SwimConfig,
    retransmit_limit,
    suspicion_timeout_ms,
    suspicion_timeouts_ms,
)
from laminar.swim.codec import Codec, Stamp, encode_update
from laminar.swim.core import Swim
from laminar.swim.messages import (
    Ack,
    Alive,
    Dead,
    Gossip,
    Left,
    Nack,
    Ping,
    PingReq,
    Suspect,
    Sync,
    Update,
)

from .helpers import CLUSTER, SECRET, Harness, Sent, codec, member, stamp

ALIVE, SUSPECT, DEAD, LEFT = (
    MemberStatus.ALIVE,
    MemberStatus.SUSPECT,
    MemberStatus.DEAD,
    MemberStatus.LEFT,
)
PEERS = ("a", "b", "c", "d")


def run_until_pinged(h: Harness, name: str, limit_ms: int = 60_000) -> Sent:
    """Advance until the core pings `name`; returns that ping."""
    while h.now_ms < limit_ms:
        for sent in h.pings():
            if sent.to == f"{name}:7946":
                return sent
        h.run_for(50)
    raise AssertionError(f"{name} was never pinged")


def updates_in(sent: list[Sent]) -> list[Update]:
    return [u for s in sent for u in s.datagram.updates]


# ---- ping, ack, ping-req ------------------------------------------------------------------


def test_a_ping_is_acked_to_its_sender_with_the_same_seq() -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    h.deliver(Ping(42, "me", 1, "a", 1), from_addr="a:1")
    assert [(s.to, s.datagram.message) for s in h.take_sent()] == [("a:1", Ack(42))]


@pytest.mark.parametrize("source_epoch", [1, 2], ids=["unknown member", "newer run"])
def test_a_ping_from_a_member_we_do_not_know_starts_a_push_pull_with_it(
    source_epoch: int,
) -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    source = "stranger" if source_epoch == 1 else "a"
    h.deliver(Ping(42, "me", 1, source, source_epoch), from_addr="x:1")
    ack, sync = h.take_sent()
    assert (ack.to, ack.datagram.message) == ("x:1", Ack(42))
    assert sync.to == "x:1" and isinstance(sync.datagram.message, Sync)
    assert sync.datagram.message.reply_wanted


def test_a_ping_meant_for_another_member_or_a_newer_run_is_not_acked() -> None:
    h = Harness()
    h.deliver(Ping(42, "someone-else", 1, "a", 1), from_addr="x:1")
    h.deliver(Ping(43, "me", 2, "a", 1), from_addr="x:1")
    assert h.take_sent() == []
    assert h.core.dropped == {"wrong_target": 2}


def test_a_ping_for_our_previous_run_is_acked_with_news_of_this_one() -> None:
    h = Harness()
    h.add("a")
    h.take_sent()
    h.deliver(Ping(42, "me", 0, "a", 1), from_addr="x:1")
    (ack,) = h.take_sent()
    assert ack.datagram.message == Ack(42)
    assert ack.datagram.updates[0] == Alive(member("me"), 0)


def test_an_unanswered_probe_goes_indirect_then_suspects_then_declares_dead() -> None:
    h = Harness(responsive={"b", "c", "d"})
    h.add(*PEERS)
    h.core.events()
    ping = run_until_pinged(h, "a")
    assert isinstance(ping.datagram.message, Ping)
    seq, t0 = ping.datagram.message.seq, ping.at_ms
    h.take_sent()
    h.run_until(t0 + 499)
    assert not [s for s in h.sent if isinstance(s.datagram.message, PingReq)]
    h.run_until(t0 + 500)  # probe timeout: k = 3 others are asked to ping a
    requests = [s for s in h.sent if isinstance(s.datagram.message, PingReq)]
    assert sorted(s.to for s in requests) == ["b:7946", "c:7946", "d:7946"]
    assert {s.datagram.message for s in requests} == {PingReq(seq, "a", 1, "a:7946")}
    h.run_until(t0 + 999)
    assert h.core.members()["a"].status is ALIVE
    h.run_until(t0 + 1000)  # end of the probe interval: suspect
    events = h.core.events()
    assert [(e.kind, e.state.id, e.at_ms) for e in events] == [(EventKind.SUSPECT, "a", t0 + 1000)]
    assert Suspect("a", 1, 0, "me") in updates_in(h.sent)
    # Nobody confirms: dead after the maximum timeout (5 members: 4 s .. 24 s).
    _, maximum = suspicion_timeouts_ms(h.config, 5)
    h.run_until(t0 + 1000 + maximum - 1)
    assert h.core.members()["a"].status is SUSPECT
    h.run_until(t0 + 1000 + maximum)
    assert [(e.kind, e.state.id, e.at_ms) for e in h.core.events()] == [
        (EventKind.DEAD, "a", t0 + 1000 + maximum)
    ]
    assert Dead("a", 1, 0, "me") in updates_in(h.sent)


def test_an_ack_ends_the_probe_without_suspicion() -> None:
    h = Harness(responsive=set(PEERS))
    h.add(*PEERS)
    h.run_until(30_000)
    assert len(h.pings()) >= 25
    assert {e.kind for e in h.core.events()} == {EventKind.JOINED}
    assert all(s.status is ALIVE for s in h.core.members().values())
    assert not [s for s in h.sent if isinstance(s.datagram.message, PingReq)]


def test_an_ack_relayed_by_a_ping_req_member_saves_the_target() -> None:
    h = Harness(responsive={"b", "c", "d"})
    h.add(*PEERS)
    ping = run_until_pinged(h, "a")
    assert isinstance(ping.datagram.message, Ping)
    h.run_until(ping.at_ms + 500)
    h.deliver(Ack(ping.datagram.message.seq), from_addr="c:7946")
    h.run_until(ping.at_ms + 1000)
    assert h.core.members()["a"].status is ALIVE
    assert h.core.health_multiplier == 1


def test_a_ping_req_is_relayed_and_the_ack_forwarded() -> None:
    h = Harness()
    h.deliver(PingReq(9, "t", 1, "t:7946"), from_addr="req:7946")
    (ping,) = h.take_sent()
    assert ping.to == "t:7946" and isinstance(ping.datagram.message, Ping)
    assert ping.datagram.message.target == "t"
    h.deliver(Ack(ping.datagram.message.seq), from_addr="t:7946")
    assert [(s.to, s.datagram.message) for s in h.take_sent()] == [("req:7946", Ack(9))]
    h.run_for(5000)
    assert not [s for s in h.take_sent() if isinstance(s.datagram.message, Nack)]


def test_a_relay_that_hears_nothing_nacks_before_the_requesters_interval_ends() -> None:
    h = Harness()
    h.deliver(PingReq(9, "t", 1, "t:7946"), from_addr="req:7946")
    h.take_sent()
    h.run_for(399)
    assert h.take_sent() == []
    h.run_for(1)  # 80% of the probe timeout
    assert [(s.to, s.datagram.message) for s in h.take_sent()] == [("req:7946", Nack(9))]


def test_relays_in_flight_are_bounded() -> None:
    h = Harness(config=SwimConfig(max_pending_relays=2))
    for seq in range(3):
        h.deliver(PingReq(seq, "t", 1, "t:7946"), from_addr="req:7946")
    assert len(h.take_sent()) == 2
    assert h.core.dropped == {"relay_full": 1}


def test_round_robin_probes_every_member_once_per_round_in_a_fresh_shuffle() -> None:
    names = ("a", "b", "c", "d", "e", "f")
    h = Harness(responsive=set(names))
    h.add(*names)
    h.run_until(1000 + 6 * 6 * 1000)
    targets = [s.to.removesuffix(":7946") for s in h.pings()][:36]
    rounds = [targets[i : i + 6] for i in range(0, 36, 6)]
    assert all(sorted(r) == list(names) for r in rounds), rounds
    assert len({tuple(r) for r in rounds}) > 1  # reshuffled between rounds
    gaps = {b.at_ms - a.at_ms for a, b in zip(h.pings(), h.pings()[1:], strict=False)}
    assert gaps == {1000}  # one probe per interval while healthy


def test_a_newcomer_joins_the_probe_order_at_a_random_position() -> None:
    first_rounds = set()
    for seed in range(8):
        h = Harness(seed=seed, responsive={"a", "b", "c", "d", "z"})
        h.add(*PEERS)
        h.add("z")
        h.run_until(5000)
        targets = [s.to.removesuffix(":7946") for s in h.pings()][:5]
        assert sorted(targets) == ["a", "b", "c", "d", "z"]
        first_rounds.add(targets.index("z"))
    assert len(first_rounds) > 1  # not always appended at the end


# ---- Lifeguard ----------------------------------------------------------------------------


def test_missed_nacks_lower_local_health_and_stretch_the_probe_interval() -> None:
    h = Harness()
    h.add("a")  # no relays to ask: a failed probe counts one
    first = run_until_pinged(h, "a")
    h.run_until(first.at_ms + 3500)
    pings = [s.at_ms - first.at_ms for s in h.pings() if s.to == "a:7946"]
    # suspect after 1 s (multiplier 2), next probe 2 s long (multiplier 3)
    assert pings[:3] == [0, 1000, 3000]
    assert h.core.health_multiplier == 3


def test_nacks_from_every_relay_spare_local_health() -> None:
    h = Harness(responsive={"b", "c", "d"})
    h.add(*PEERS)
    ping = run_until_pinged(h, "a")
    assert isinstance(ping.datagram.message, Ping)
    h.run_until(ping.at_ms + 500)
    for relay in ("b", "c", "d"):
        h.deliver(Nack(ping.datagram.message.seq), from_addr=f"{relay}:7946")
    h.run_until(ping.at_ms + 1000)
    assert h.core.members()["a"].status is SUSPECT
    assert h.core.health_multiplier == 1


def test_missing_nacks_count_against_local_health_up_to_the_maximum() -> None:
    h = Harness(config=SwimConfig(awareness_max_multiplier=3), responsive={"b", "c", "d"})
    h.add(*PEERS)
    ping = run_until_pinged(h, "a")
    h.take_sent()
    h.run_until(ping.at_ms + 10_000)
    assert h.core.members()["a"].status is SUSPECT
    # Three missing nacks: +3, capped at multiplier 3. Each acked probe then gives one back.
    starts = [s.at_ms - ping.at_ms for s in h.pings()]
    assert starts[:4] == [1000, 1000 + 3000, 1000 + 3000 + 2000, 1000 + 3000 + 2000 + 1000]


def test_the_probe_timeout_scales_with_local_health() -> None:
    h = Harness()  # nobody answers, nobody nacks
    h.add("a", "b", "c")
    h.run_until(4000)
    pings = [s.at_ms for s in h.pings()]
    requests = sorted({s.at_ms for s in h.sent if isinstance(s.datagram.message, PingReq)})
    # healthy: ping-req after 500 ms; two missing nacks later: after 3 x 500 ms
    assert requests[:2] == [pings[0] + 500, pings[1] + 1500]
    assert pings[1] == pings[0] + 1000


def test_buddy_system_a_ping_to_a_suspect_carries_its_suspicion_first() -> None:
    h = Harness(responsive=set(PEERS))
    h.add(*PEERS)
    h.deliver(Gossip(), [Suspect("a", 1, 0, "b")])
    ping = run_until_pinged(h, "a")
    assert ping.datagram.updates[0] == Suspect("a", 1, 0, "me")


def test_independent_confirmations_shorten_the_suspicion() -> None:
    h = Harness(responsive=set(PEERS))
    h.add(*PEERS)
    h.run_for(10)
    start = h.now_ms
    h.deliver(Gossip(), [Suspect("a", 1, 0, "b")])
    h.deliver(Gossip(), [Suspect("a", 1, 0, "b")])  # the same accuser again: no confirmation
    h.deliver(Gossip(), [Suspect("a", 1, 0, "c")])
    minimum, maximum = suspicion_timeouts_ms(h.config, 5)
    one = suspicion_timeout_ms(1, 2, minimum, maximum)
    assert minimum < one < maximum
    h.run_until(start + one - 1)
    assert h.core.members()["a"].status is SUSPECT
    h.deliver(Gossip(), [Suspect("a", 1, 0, "d")])  # second confirmation: the minimum, passed
    h.run_for(0)
    dead = [e for e in h.core.events() if e.kind is EventKind.DEAD]
    assert [(e.state.id, e.at_ms) for e in dead] == [("a", start + one - 1)]


def test_a_confirmation_is_gossiped_on() -> None:
    h = Harness(responsive=set(PEERS))
    h.add(*PEERS)
    h.run_for(5000)
    h.deliver(Gossip(), [Suspect("a", 1, 0, "b")])
    h.run_for(2000)
    h.take_sent()
    h.deliver(Gossip(), [Suspect("a", 1, 0, "c")])
    h.run_for(2000)
    assert Suspect("a", 1, 0, "c") in updates_in(h.sent)


# ---- incarnations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "accusation, incarnation",
    [
        (Suspect("me", 1, 0, "a"), 1),
        (Suspect("me", 1, 5, "a"), 6),
        (Dead("me", 1, 0, "a"), 1),
        (Left("me", 1, 3), 4),
        (Alive(member("me", weight=9), 0), 1),  # someone speaks for us: we correct it
    ],
)
def test_only_the_member_refutes_by_raising_its_own_incarnation(
    accusation: Update, incarnation: int
) -> None:
    h = Harness()
    h.add("a")
    h.deliver(Gossip(), [accusation])
    assert h.core.incarnation == incarnation
    assert h.core.members()["me"].status is ALIVE
    assert h.core.health_multiplier == 2  # being accused hints that we are the slow one
    h.deliver(Ping(1, "me", 1, "a", 1), from_addr="a:7946")
    assert Alive(member("me"), incarnation) in updates_in(h.take_sent())
    assert all(e.state.id != "me" for e in h.core.events())


@pytest.mark.parametrize(
    "accusation",
    [
        Suspect("me", 1, 0, "a"),  # older incarnation than ours (1 after the first refute)
        Suspect("me", 0, 7, "a"),  # about a previous run (older epoch)
        Dead("me", 0, 7, "a"),
        Alive(member("me", epoch=0, weight=3), 9),
    ],
)
def test_stale_accusations_are_not_refuted(accusation: Update) -> None:
    h = Harness()
    h.deliver(Gossip(), [Suspect("me", 1, 0, "a")])
    assert h.core.incarnation == 1
    h.deliver(Gossip(), [accusation])
    assert h.core.incarnation == 1


def test_a_stale_accusation_is_answered_by_repeating_our_current_incarnation() -> None:
    h = Harness(responsive={"a"})
    h.add("a")
    h.deliver(Gossip(), [Suspect("me", 1, 0, "a")])
    h.run_for(10_000)  # the refutation has been sent as often as it will be
    h.take_sent()
    health = h.core.health_multiplier
    h.deliver(Ping(2, "me", 1, "a", 1), [Suspect("me", 1, 0, "b")], from_addr="a:7946")
    (ack,) = h.take_sent()
    assert ack.datagram.updates[0] == Alive(member("me"), 1)
    assert (h.core.incarnation, h.core.health_multiplier) == (1, health)


def test_an_update_about_a_newer_run_of_ourselves_is_counted_not_obeyed() -> None:
    h = Harness()
    h.deliver(Gossip(), [Dead("me", 2, 0, "a"), Alive(member("me", epoch=2), 0)])
    assert h.core.incarnation == 0
    assert h.core.members()["me"].status is ALIVE
    assert h.core.dropped == {"superseded": 2}


def test_a_core_never_raises_another_members_incarnation() -> None:
    h = Harness(responsive={"b", "c", "d"})
    h.add("b", "c", "d")
    h.add("a", incarnation=3)
    ping = run_until_pinged(h, "a")
    h.run_until(ping.at_ms + 1000)
    assert h.core.members()["a"].incarnation == 3
    assert Suspect("a", 1, 3, "me") in updates_in(h.sent)


@pytest.mark.parametrize(
    "setup, update, status, incarnation",
    [
        # alive at 5
        ((), Suspect("a", 1, 5, "b"), SUSPECT, 5),
        ((), Suspect("a", 1, 4, "b"), ALIVE, 5),
        ((), Suspect("a", 1, 7, "b"), SUSPECT, 7),
        ((), Dead("a", 1, 5, "b"), DEAD, 5),
        ((), Dead("a", 1, 4, "b"), ALIVE, 5),
        ((), Left("a", 1, 5), LEFT, 5),
        ((), Alive(member("a", weight=2), 5), ALIVE, 5),
        ((), Alive(member("a"), 6), ALIVE, 6),
        # suspect at 5
        ((Suspect("a", 1, 5, "b"),), Alive(member("a"), 5), SUSPECT, 5),
        ((Suspect("a", 1, 5, "b"),), Alive(member("a"), 6), ALIVE, 6),
        ((Suspect("a", 1, 5, "b"),), Dead("a", 1, 5, "c"), DEAD, 5),
        ((Suspect("a", 1, 5, "b"),), Left("a", 1, 5), LEFT, 5),
        # dead at 5
        ((Dead("a", 1, 5, "b"),), Alive(member("a"), 5), DEAD, 5),
        ((Dead("a", 1, 5, "b"),), Suspect("a", 1, 6, "c"), DEAD, 5),
        ((Dead("a", 1, 5, "b"),), Left("a", 1, 5), LEFT, 5),
        ((Dead("a", 1, 5, "b"),), Alive(member("a"), 6), ALIVE, 6),
        # left at 5
        ((Left("a", 1, 5),), Dead("a", 1, 6, "b"), LEFT, 5),
        ((Left("a", 1, 5),), Alive(member("a"), 5), LEFT, 5),
        ((Left("a", 1, 5),), Alive(member("a"), 6), ALIVE, 6),
    ],
)
def test_precedence_of_states_and_incarnations(
    setup: tuple[Update, ...], update: Update, status: MemberStatus, incarnation: int
) -> None:
    h = Harness()
    h.add("b", "c")
    h.add("a", incarnation=5)
    h.deliver(Gossip(), setup)
    h.deliver(Gossip(), [update])
    state = h.core.members()["a"]
    assert (state.status, state.incarnation) == (status, incarnation)


def test_events_say_what_changed() -> None:
    h = Harness()
    h.add("a", incarnation=1)
    h.deliver(Gossip(), [Suspect("a", 1, 1, "b")])
    h.deliver(Gossip(), [Alive(member("a", weight=4), 2)])  # refuted, with a new weight
    h.deliver(Gossip(), [Alive(member("a", weight=4, leaving=True), 3)])
    h.deliver(Gossip(), [Dead("a", 1, 3, "b")])
    h.deliver(Gossip(), [Alive(member("a"), 4)])
    h.deliver(Gossip(), [Left("a", 1, 4)])
    kinds = [(e.kind, e.state.incarnation) for e in h.core.events()]
    assert kinds == [
        (EventKind.JOINED, 1),
        (EventKind.SUSPECT, 1),
        (EventKind.ALIVE, 2),
        (EventKind.UPDATED, 2),
        (EventKind.UPDATED, 3),
        (EventKind.DEAD, 3),
        (EventKind.JOINED, 4),
        (EventKind.LEFT, 4),
    ]


# ---- epochs -------------------------------------------------------------------------------


def test_a_newer_epoch_replaces_the_member_whatever_the_incarnation() -> None:
    h = Harness()
    h.add("b", "c")
    h.add("a", incarnation=9)
    h.deliver(Gossip(), [Suspect("a", 1, 9, "b")])
    h.deliver(Gossip(), [Alive(member("a", epoch=2, weight=3), 0)])  # restarted
    state = h.core.members()["a"]
    assert (state.status, state.epoch, state.incarnation, state.member.weight) == (
        ALIVE,
        2,
        0,
        3,
    )
    assert [e.kind for e in h.core.events()][-1] is EventKind.JOINED
    # The previous run is gone for good: nothing about epoch 1 matters any more.
    h.deliver(Gossip(), [Alive(member("a", epoch=1), 20), Dead("a", 1, 20, "b")])
    h.deliver(Gossip(), [Left("a", 1, 30), Suspect("a", 1, 40, "c")])
    assert h.core.members()["a"] == state
    h.deliver(Gossip(), [Suspect("a", 2, 0, "b")])
    assert h.core.members()["a"].status is SUSPECT


def test_a_restart_after_being_declared_dead_is_a_join() -> None:
    h = Harness()
    h.add("b", "c")
    h.add("a", incarnation=4)
    h.deliver(Gossip(), [Dead("a", 1, 4, "b")])
    h.deliver(Gossip(), [Alive(member("a", epoch=5), 0)])
    assert [e.kind for e in h.core.events()][-2:] == [EventKind.DEAD, EventKind.JOINED]
    assert h.core.members()["a"].status is ALIVE


# ---- dissemination ------------------------------------------------------------------------


def test_each_update_is_sent_at_most_retransmit_limit_times() -> None:
    h = Harness(responsive={*PEERS, "z"})
    h.add(*PEERS)
    h.run_for(20_000)
    h.take_sent()
    h.add("z")
    h.run_for(60_000)
    announcement = Alive(member("z"), 0)
    sent = [u for u in updates_in(h.sent) if u == announcement]
    limit = retransmit_limit(h.config, 6)
    assert limit == 4
    assert len(sent) == limit


def test_piggybacking_fills_datagrams_but_never_past_the_bound() -> None:
    config = SwimConfig()
    h = Harness(config=config)
    names = [f"member-with-a-rather-long-name-{i:03d}" for i in range(40)]
    for i in range(0, 40, 5):
        h.add(*names[i : i + 5])
    h.take_sent()
    h.run_for(3000)
    assert h.sent
    assert max(s.size for s in h.sent) <= config.max_datagram_bytes
    largest_update = max(len(encode_update(Alive(member(n), 0))) for n in names)
    full = [s for s in h.sent if s.size > config.max_datagram_bytes - largest_update]
    assert full, "updates were waiting but datagrams were sent with room to spare"
    assert max(len(s.datagram.updates) for s in h.sent) > 1


def test_gossip_goes_out_only_when_there_is_news() -> None:
    h = Harness(responsive=set(PEERS))
    h.add(*PEERS)
    h.run_for(20_000)
    h.take_sent()
    h.run_for(10_000)
    assert not [s for s in h.sent if isinstance(s.datagram.message, Gossip)]
    h.deliver(Gossip(), [Alive(member("a", weight=2), 1)])
    h.run_for(1000)
    gossip = [s for s in h.sent if isinstance(s.datagram.message, Gossip)]
    assert gossip
    assert len({s.to for s in gossip if s.at_ms == gossip[0].at_ms}) == h.config.gossip_nodes


# ---- join, sync, leave, update ------------------------------------------------------------


def test_a_new_node_syncs_with_its_seeds_until_it_learns_a_member() -> None:
    h = Harness(seeds=["s1:7946", "s2:7946", "me:7946"], responsive={"s1", "x"})
    # (its own address is skipped)
    syncs = [s for s in h.take_sent() if isinstance(s.datagram.message, Sync)]
    assert sorted(s.to for s in syncs) == ["s1:7946", "s2:7946"]
    sync = syncs[0].datagram.message
    assert isinstance(sync, Sync) and sync.reply_wanted
    assert [(e.id, e.status) for e in sync.entries] == [("me", ALIVE)]
    h.run_for(1000)
    assert len([s for s in h.take_sent() if isinstance(s.datagram.message, Sync)]) == 2
    reply = Sync("s1", False, (h.core.members()["me"], *_alive("s1", "x")))
    h.deliver(reply, from_addr="s1:7946")
    assert h.core.joined
    assert {e.state.id for e in h.core.events()} == {"s1", "x"}
    h.run_for(10_000)
    assert not [s for s in h.sent if isinstance(s.datagram.message, Sync)]


def _alive(*names: str) -> list[MemberState]:
    return [MemberState(member(n), ALIVE, 0) for n in names]


def test_a_sync_request_is_answered_with_the_whole_table() -> None:
    h = Harness()
    h.add("b", "c")
    h.deliver(Sync("x", True, tuple(_alive("x"))), from_addr="x:7946")
    (reply,) = [s for s in h.take_sent() if isinstance(s.datagram.message, Sync)]
    assert reply.to == "x:7946"
    assert isinstance(reply.datagram.message, Sync) and not reply.datagram.message.reply_wanted
    assert [e.id for e in reply.datagram.message.entries] == ["me", "b", "c", "x"]


def test_someone_elses_dead_is_only_our_suspect_in_a_sync() -> None:
    h = Harness()
    h.add("b", "c")
    dead_b = MemberState(member("b"), DEAD, 0)
    unknown = MemberState(member("q"), SUSPECT, 0)
    h.deliver(Sync("c", False, (dead_b, unknown)), from_addr="c:7946")
    assert h.core.members()["b"].status is SUSPECT
    assert "q" not in h.core.members()


def test_a_member_that_left_before_we_knew_it_is_learned_from_a_sync() -> None:
    """No update follows a member's leave: a node started after it left (or that knew only
    an older run of it) takes a sync's left entry as it is, so that it knows the member is
    away (placement keeps a departed broker's replicas); a newer alive run replaces it."""
    h = Harness()
    h.add("b", "c")
    h.core.events()
    entries = (
        MemberState(member("q"), LEFT, 3),  # never heard of
        MemberState(member("b", epoch=2), LEFT, 0),  # a newer run of b, which left
        MemberState(member("c", epoch=0), LEFT, 0),  # an older run of c: stale
    )
    h.deliver(Sync("c", False, entries), from_addr="c:7946")
    members = h.core.members()
    assert (members["q"].status, members["q"].incarnation) == (LEFT, 3)
    assert (members["b"].status, members["b"].epoch) == (LEFT, 2)
    assert (members["c"].status, members["c"].epoch) == (ALIVE, 1)
    assert [(e.kind, e.state.id) for e in h.core.events()] == [
        (EventKind.LEFT, "q"),
        (EventKind.LEFT, "b"),
    ]
    h.deliver(Gossip(), [Alive(member("q", epoch=2), 0)])
    assert h.core.members()["q"].status is ALIVE
    assert [(e.kind, e.state.id) for e in h.core.events()] == [(EventKind.JOINED, "q")]


def test_dead_members_are_forgotten_after_the_retention_but_those_that_left_are_not() -> None:
    h = Harness(config=SwimConfig(dead_member_retention_ms=5_000), responsive={"c"})
    h.add("a", "b", "c")
    h.deliver(Gossip(), [Dead("a", 1, 0, "c"), Left("b", 1, 0)])
    h.run_for(60_000)  # many probe rounds, each of which forgets the expired
    assert sorted(h.core.members()) == ["b", "c", "me"]
    assert h.core.members()["b"].status is LEFT


def test_leaving_tells_every_live_member_and_stops_probing() -> None:
    h = Harness(responsive={"a", "b"})
    h.add("a", "b")
    h.run_for(3000)
    h.take_sent()
    h.core.leave(h.now_ms)
    h.collect()
    sent = h.take_sent()
    assert sorted(s.to for s in sent) == ["a:7946", "b:7946"]
    assert all(s.datagram.updates[0] == Left("me", 1, 0) for s in sent)
    assert h.core.members()["me"].status is LEFT and h.core.has_left
    h.deliver(Gossip(), [Suspect("me", 1, 0, "a")])
    h.run_for(20_000)
    assert h.pings() == []
    assert h.core.incarnation == 0  # a member that left does not refute
    with pytest.raises(RuntimeError):
        h.core.update_self(weight=2)


def test_updating_weight_or_leaving_raises_the_incarnation_and_is_gossiped() -> None:
    h = Harness(responsive={"a", "b"})
    h.add("a", "b")
    h.core.update_self(weight=5)
    assert h.core.incarnation == 1
    h.core.update_self(leaving=True)
    h.core.update_self(weight=5, leaving=True)  # no change, no new incarnation
    assert h.core.incarnation == 2
    h.run_for(3000)
    assert Alive(member("me", weight=5, leaving=True), 2) in updates_in(h.sent)
    with pytest.raises(ValueError):
        h.core.update_self(weight=0)


def test_starting_to_leave_is_told_to_every_live_member_at_once() -> None:
    h = Harness(responsive={"a", "b"})
    h.add("a", "b", "c")
    h.deliver(Gossip(), [Dead("c", 1, 0, "a")])
    h.run_for(3000)
    h.take_sent()
    h.core.update_self(leaving=True)  # a broker's graceful stop has begun
    h.collect()
    sent = h.take_sent()
    assert sorted(s.to for s in sent) == ["a:7946", "b:7946"]  # (not the dead one)
    assert all(s.datagram.updates[0] == Alive(member("me", leaving=True), 1) for s in sent)
    h.core.update_self(weight=3)  # any other change waits for gossip
    h.collect()
    assert h.take_sent() == []


# ---- bounds and bad input -----------------------------------------------------------------


def test_bad_datagrams_are_counted_and_change_nothing() -> None:
    h = Harness()
    h.add("a", "b")
    before = h.core.members()
    h.core.events()
    h.take_sent()
    accusation = [encode_update(Dead("a", 1, 0, "b"))]
    good = codec(sender="evil:1").encode(Gossip(), accusation, stamp=stamp(h.now_ms))
    tampered = bytearray(good)
    tampered[20] ^= 0xFF
    foreign = Codec("another-cluster", SECRET, 1400, sender="evil:1").encode(
        Gossip(), accusation, stamp=stamp(h.now_ms)
    )
    forged = Codec(CLUSTER, b"not the secret", 1400, sender="evil:1").encode(
        Gossip(), accusation, stamp=stamp(h.now_ms)
    )
    for data in (b"", b"x" * 100, bytes(tampered), foreign, forged, b"\0" * 2000):
        h.core.receive(data, "evil:1", h.now_ms)
    assert h.core.dropped == {
        "truncated": 1,
        "bad_magic": 1,
        "bad_mac": 2,
        "wrong_cluster": 1,
        "oversized": 1,
    }
    assert h.core.members() == before
    assert h.core.outbox() == [] and h.core.events() == []


def test_the_member_table_is_bounded() -> None:
    h = Harness(config=SwimConfig(max_members=4))
    h.add("a", "b", "c")
    h.add("d")
    assert "d" not in h.core.members()
    assert h.core.dropped == {"members_full": 1}
    h.deliver(Gossip(), [Dead("b", 1, 0, "a")])
    h.add("d")  # the dead member makes room
    assert sorted(h.core.members()) == ["a", "c", "d", "me"]


def test_pending_events_are_bounded() -> None:
    h = Harness(config=SwimConfig(max_pending_events=3))
    h.add("a", "b", "c", "d", "e")
    assert [e.state.id for e in h.core.events()] == ["c", "d", "e"]
    assert h.core.dropped == {"event_overflow": 2}


def test_the_same_seed_and_inputs_give_the_same_datagrams() -> None:
    def run(seed: int) -> list[tuple[str, bytes]]:
        core = Swim(SwimConfig(), member("me"), ["s:7946"], random.Random(seed), CLUSTER, SECRET)
        out: list[tuple[str, bytes]] = []
        gossip = codec(sender="s:7946").encode(
            Gossip(), [encode_update(Alive(member(n), 0)) for n in PEERS], stamp=Stamp(0, 1)
        )
        core.receive(gossip, "s:7946", 0)
        for now_ms in range(0, 20_000, 10):
            core.tick(now_ms)
            out += core.outbox()
        return out

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_a_member_that_cannot_be_encoded_is_refused() -> None:
    with pytest.raises(ValueError):
        Swim(SwimConfig(), member("x" * 200), [], random.Random(1), CLUSTER, SECRET)
    with pytest.raises(ValueError):
        Swim(SwimConfig(), member("me", weight=0), [], random.Random(1), CLUSTER, SECRET)
