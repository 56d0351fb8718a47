"""SWIM under the deterministic simulator: 20 real cores, virtual time, a lossy, delaying,
partitionable network. Each test states the bound it asserts and derives it from the config."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from laminar.swim import (
    EventKind,
    MemberStatus,
    SwimConfig,
    retransmit_limit,
    suspicion_timeouts_ms,
)
from laminar.swim.codec import Codec, Stamp, encode_update
from laminar.swim.messages import Dead, Gossip, Suspect
from laminar.swim.sim import Observation, SwimSimConfig, SwimSimulation

NODES = 20
MINUTE_MS = 60_000
#: Let the cluster form (nodes start within 2 s and join through 3 seeds) before faults.
WARM_UP_MS = 30_000
LOSSY = SwimSimConfig(nodes=NODES, loss_rate=0.10)


def dissemination_bound_ms(config: SwimConfig, members: int) -> int:
    """Each node passes an update on retransmit_limit times, at least one per gossip round
    (more when piggybacked on probes): by then it has reached everyone with overwhelming
    probability (SWIM's infection-style spread takes O(log n) rounds)."""
    return retransmit_limit(config, members) * config.gossip_interval_ms


def dead_detection_bound_ms(config: SwimConfig, members: int) -> int:
    """How long after a crash every member has declared it dead:
    * one probe interval, at the worst local-health multiplier, until some member's round
      robin reaches it (with n - 1 members each probing one member per interval, the expected
      wait is well under one interval);
    * one more such interval for that probe to fail (ping, ping-req, end of the interval);
    * the maximum suspicion timeout (no confirmations at all);
    * the dissemination of the dead declaration.
    """
    scaled_interval_ms = config.probe_interval_ms * config.awareness_max_multiplier
    _, max_suspicion_ms = suspicion_timeouts_ms(config, members)
    return 2 * scaled_interval_ms + max_suspicion_ms + dissemination_bound_ms(config, members)


def rejoin_bound_ms(config: SwimConfig) -> int:
    """After a partition heals: within one reconnect interval every member on the majority
    side has synced with a dead member (the isolated side learns it was declared dead and
    refutes), and one push-pull interval repairs anything gossip missed."""
    return config.reconnect_interval_ms + config.push_pull_interval_ms


def of(
    observations: Iterable[Observation], kind: EventKind, about: str, since_ms: int = 0
) -> dict[str, int]:
    """observer -> time of its first `kind` event about `about` at or after `since_ms`."""
    first: dict[str, int] = {}
    for o in observations:
        if o.event.kind is kind and o.event.state.id == about and o.event.at_ms >= since_ms:
            first.setdefault(o.observer, o.event.at_ms)
    return first


def everyone_sees_everyone_alive(sim: SwimSimulation) -> bool:
    """All nodes up, and each sees all of them alive, at their current epoch."""
    epochs = {n: sim.core(n).members()[n].epoch for n in sim.up()}
    return len(epochs) == NODES and all(
        len(sim.view(observer)) == NODES
        and all(
            state.status is MemberStatus.ALIVE and state.epoch == epochs[member_id]
            for member_id, state in sim.view(observer).items()
        )
        for observer in sim.up()
    )


def run_until_converged(sim: SwimSimulation, limit_ms: int) -> int:
    """Advance in 100 ms steps until every node sees all 20 alive; the time it took."""
    start = sim.now_ms
    while sim.now_ms - start <= limit_ms:
        if everyone_sees_everyone_alive(sim):
            return sim.now_ms - start
        sim.run_for(100)
    raise AssertionError(f"not converged within {limit_ms} ms")


def test_the_cluster_forms_through_the_seeds() -> None:
    sim = SwimSimulation(1, SwimSimConfig(nodes=NODES))
    # Usually a few seconds; a member that gossip happened to miss is found when the other
    # pings it (within one probe round) or at the next push-pull, whichever comes first.
    run_until_converged(sim, limit_ms=sim.config.swim.push_pull_interval_ms)
    joined = [o for o in sim.observations if o.event.kind is EventKind.JOINED]
    assert len(joined) == NODES * (NODES - 1)  # each node saw each other join, once


def test_no_false_positives_in_ten_minutes_at_ten_percent_loss() -> None:
    sim = SwimSimulation(2024, LOSSY)
    sim.run_until(10 * MINUTE_MS)
    wrong = [o for o in sim.observations if o.event.kind in (EventKind.DEAD, EventKind.LEFT)]
    assert wrong == [], wrong[:5]
    assert everyone_sees_everyone_alive(sim)
    # The faults were real and were survived: probes failed, suspicions were refuted.
    assert sim.stats["lost"] > 0.09 * sim.stats["sent"]
    suspicions = [o for o in sim.observations if o.event.kind is EventKind.SUSPECT]
    refutations = [o for o in sim.observations if o.event.kind is EventKind.ALIVE]
    assert len(suspicions) > 100
    assert len(refutations) == len(suspicions)
    assert max(sim.core(n).incarnation for n in sim.up()) > 0


@pytest.mark.parametrize("seed, victim", [(1, "n07"), (2, "n00"), (3, "n19")])
def test_a_crashed_node_is_declared_dead_by_everyone_within_the_bound(
    seed: int, victim: str
) -> None:
    sim = SwimSimulation(seed, LOSSY)
    sim.run_until(WARM_UP_MS)
    run_until_converged(sim, limit_ms=MINUTE_MS)  # under loss, someone is often suspect
    crashed_at = sim.now_ms
    sim.crash(victim)
    bound_ms = dead_detection_bound_ms(LOSSY.swim, NODES)
    assert bound_ms == 2 * 8000 + 31_224 + 8 * 200  # 48.8 s for 20 members
    sim.run_until(crashed_at + bound_ms)
    dead = of(sim.observations, EventKind.DEAD, victim, since_ms=crashed_at)
    assert sorted(dead) == sorted(n for n in sim.up())
    assert max(dead.values()) - crashed_at <= bound_ms
    assert all(sim.view(n)[victim].status is MemberStatus.DEAD for n in sim.up())
    # and nobody else was declared dead meanwhile
    others = [o for o in sim.observations if o.event.kind is EventKind.DEAD]
    assert {o.event.state.id for o in others} == {victim}


@pytest.mark.parametrize(
    "isolated",
    [("n05",), ("n01",), ("n05", "n06", "n07")],
    ids=["one node", "one seed", "three nodes"],
)
def test_a_partitioned_node_declared_dead_rejoins_after_the_partition_heals(
    isolated: tuple[str, ...],
) -> None:
    sim = SwimSimulation(7, SwimSimConfig(nodes=NODES, loss_rate=0.05))
    sim.run_until(WARM_UP_MS)
    incarnations = {n: sim.core(n).incarnation for n in isolated}
    sim.isolate(isolated)
    sim.run_for(2 * MINUTE_MS)
    majority = [n for n in sim.up() if n not in isolated]
    for node in isolated:
        assert all(sim.view(m)[node].status is MemberStatus.DEAD for m in majority)
    healed_at = sim.now_ms
    sim.heal()
    took_ms = run_until_converged(sim, rejoin_bound_ms(sim.config.swim))
    assert took_ms <= rejoin_bound_ms(sim.config.swim)
    for node in isolated:
        # it refuted its death with a higher incarnation, and everyone saw it come back
        assert sim.core(node).incarnation > incarnations[node]
        assert all(sim.view(m)[node].incarnation == sim.core(node).incarnation for m in majority)
        # (the isolated side may have lost members too: with most of its view unreachable,
        # its own refutations rarely reach each other)
        assert set(majority) <= set(of(sim.observations, EventKind.JOINED, node, healed_at))


def test_a_quickly_restarted_node_is_accepted_as_its_new_epoch() -> None:
    sim = SwimSimulation(11, SwimSimConfig(nodes=NODES, loss_rate=0.05))
    sim.run_until(WARM_UP_MS)
    old_epoch = sim.core("n03").members()["n03"].epoch
    sim.crash("n03")
    sim.run_for(1000)  # back before anyone could declare it dead
    restarted_at = sim.now_ms
    sim.restart("n03")
    new_epoch = sim.core("n03").members()["n03"].epoch
    assert new_epoch > old_epoch
    run_until_converged(sim, limit_ms=30_000)
    others = [n for n in sim.up() if n != "n03"]
    for observer in others:
        state = sim.view(observer)["n03"]
        assert (state.epoch, state.status) == (new_epoch, MemberStatus.ALIVE)
    joined = [
        o
        for o in sim.observations
        if o.event.kind is EventKind.JOINED
        and o.event.state.id == "n03"
        and o.event.at_ms >= restarted_at
    ]
    assert sorted(o.observer for o in joined) == others
    assert {o.event.state.epoch for o in joined} == {new_epoch}
    assert not of(sim.observations, EventKind.DEAD, "n03")


def test_a_node_restarted_after_being_declared_dead_comes_back_as_its_new_epoch() -> None:
    sim = SwimSimulation(12, SwimSimConfig(nodes=NODES, loss_rate=0.05))
    sim.run_until(WARM_UP_MS)
    sim.crash("n03")
    sim.run_for(dead_detection_bound_ms(sim.config.swim, NODES))
    assert all(sim.view(n)["n03"].status is MemberStatus.DEAD for n in sim.up())
    sim.restart("n03")
    new_epoch = sim.core("n03").members()["n03"].epoch
    run_until_converged(sim, limit_ms=30_000)
    assert all(sim.view(n)["n03"].epoch == new_epoch for n in sim.up())
    assert sim.core("n03").incarnation == 0  # a new run starts over; the epoch decides


def test_forged_and_foreign_datagrams_are_counted_and_change_nothing() -> None:
    sim = SwimSimulation(13, SwimSimConfig(nodes=NODES))
    sim.run_until(WARM_UP_MS)
    assert everyone_sees_everyone_alive(sim)
    before = {n: sim.view(n) for n in sim.up()}
    config = sim.config
    accusation = [
        encode_update(Dead("n01", 0, 99, "n02")),
        encode_update(Suspect("n04", 0, 99, "x")),
    ]
    for epoch_member in ("n01", "n04"):  # aim at the real epochs too
        state = before["n00"][epoch_member]
        accusation.append(encode_update(Dead(epoch_member, state.epoch, 99, "n02")))
    stamp = Stamp(sim.now_ms, 1)
    forged = Codec(config.cluster_id, b"guessed secret", 1400, sender="10.9.9.9:7946").encode(
        Gossip(), accusation, stamp=stamp
    )
    foreign = Codec("another-cluster", config.secret, 1400, sender=sim.address("n02")).encode(
        Gossip(), accusation, stamp=stamp
    )
    for target in sim.up():
        sim.inject(target, forged, "10.9.9.9:7946")
        sim.inject(target, foreign, sim.address("n02"))
        sim.inject(target, b"\x00" * 80, "10.9.9.9:7946")
    sim.run_for(10_000)
    for node in sim.up():
        dropped = sim.core(node).dropped
        assert (dropped["bad_mac"], dropped["wrong_cluster"], dropped["bad_magic"]) == (1, 1, 1)
        assert sim.view(node) == before[node]
    assert not [o for o in sim.observations if o.event.kind is not EventKind.JOINED]


def test_weight_and_leaving_updates_reach_every_node() -> None:
    sim = SwimSimulation(14, LOSSY)
    sim.run_until(WARM_UP_MS)
    run_until_converged(sim, limit_ms=MINUTE_MS)
    changed_at = sim.now_ms
    sim.update_self("n04", weight=5)
    sim.update_self("n09", leaving=True)

    def seen_everywhere() -> bool:
        return all(
            (view["n04"].member.weight, view["n04"].member.leaving) == (5, False)
            and (view["n09"].member.weight, view["n09"].member.leaving) == (1, True)
            for view in (sim.view(n) for n in sim.up())
        )

    # Gossip reaches almost everyone within the dissemination bound; with lambda = 4 and 10%
    # loss a member misses an update about once in a thousand, and its next push-pull (one
    # interval at most) repairs that.
    bound_ms = dissemination_bound_ms(LOSSY.swim, NODES) + LOSSY.swim.push_pull_interval_ms
    while not seen_everywhere():
        assert sim.now_ms - changed_at <= bound_ms, "not everywhere within the bound"
        sim.run_for(100)
    for node in ("n04", "n09"):
        updated = of(sim.observations, EventKind.UPDATED, node, changed_at)
        assert sorted(updated) == [n for n in sim.up() if n != node]


def test_a_member_that_leaves_is_seen_as_left_not_dead() -> None:
    sim = SwimSimulation(15, LOSSY)
    sim.run_until(WARM_UP_MS)
    left_at = sim.now_ms
    sim.leave("n08")
    sim.run_for(3 * sim.config.swim.gossip_interval_ms)  # the runtime lingers this long
    sim.crash("n08")
    sim.run_for(2 * MINUTE_MS)
    others = [n for n in sim.up() if n != "n08"]
    assert sorted(of(sim.observations, EventKind.LEFT, "n08", left_at)) == others
    assert not of(sim.observations, EventKind.DEAD, "n08")
    assert all(sim.view(n)["n08"].status is MemberStatus.LEFT for n in others)


def _faulty_run(seed: int) -> tuple[list[Observation], dict[str, int]]:
    sim = SwimSimulation(seed, SwimSimConfig(nodes=10, loss_rate=0.1, duplicate_rate=0.05))
    sim.run_until(20_000)
    sim.crash("n03")
    sim.isolate(["n05", "n06"])
    sim.run_until(80_000)
    sim.heal()
    sim.restart("n03")
    sim.update_self("n07", weight=3)
    sim.run_until(120_000)
    return sim.observations, sim.stats


def test_a_seed_replays_exactly() -> None:
    first = _faulty_run(21)
    assert first == _faulty_run(21)
    kinds = {o.event.kind for o in first[0]}
    assert {EventKind.DEAD, EventKind.JOINED, EventKind.UPDATED} <= kinds
    assert _faulty_run(22) != first
