"""A member drops its replica on the word of its group's leader (a status report that no
longer lists it, seen twice: a removed member may never hear of its removal from Raft), on
whole node cores (`NodeCore`) over in-memory storage, but never on a report older than what
that leader has sent it since: a leader whose placement target flaps removes a member and adds
it back within one status round, and the old replica's acknowledgements then count for the
member. Dropping it would leave a voter that holds nothing (a simulation seed found this)."""

from __future__ import annotations

from laminar.log.batch import Record, encode_batch

from .test_leader_balance import NODES, Cluster


def test_a_report_older_than_the_leaders_later_entries_drops_nothing() -> None:
    cluster = Cluster()
    cluster.create_topic(1)
    cluster.run_until(lambda: cluster.all_led(1), 200)
    ((group, leader),) = cluster.leaders().items()
    follower = next(n for n in NODES if n != leader)
    core = cluster.cores[follower]
    led = cluster.cores[leader].replicas[group].raft
    followed = core.replicas[group].raft
    cluster.run_until(lambda: followed.log.committed == led.log.last_index(), 50)
    # the leader's report, made before it sent the follower more (its adding back, say)
    stale = {
        "voters": [n for n in NODES if n != follower],
        "learners": [],
        "term": led.term,
        "commit_index": led.log.committed,
    }
    led.propose(encode_batch([Record(value=b"x")]), 1)
    cluster.run_until(lambda: followed.log.last_index() > stale["commit_index"], 20)
    grace_ms = core.config.removed_grace_ms
    cluster.run(grace_ms // 100 + 20)  # (a replica hosted this briefly is never dropped)
    for _ in range(3):
        assert core.collect_removed({group: stale}) == []
    assert group in core.replicas
    # a report that has seen everything the follower holds: dropped once seen twice
    fresh = {**stale, "commit_index": followed.log.last_index()}
    assert core.collect_removed({group: fresh}) == []
    assert core.collect_removed({group: fresh}) == [group]
    assert group not in core.replicas
