"""Workers (`laminar.workers`): node ids, the default count from the cgroup's CPU quota, and
ownership: every partition has exactly one owning worker on each broker that hosts it,
before and after workers are added or removed, and such a change moves only what it must."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from laminar.partition.reconcile import plan_topic
from laminar.placement import Candidate, hosts, place
from laminar.server.config import BrokerConfig, new_secret
from laminar.swim import Addresses, Member, MemberState, MemberStatus
from laminar.workers import (
    broker_of,
    cgroup_cpu_limit,
    expand,
    peer_address,
    usable_cores,
    worker_address,
    worker_id,
    worker_ids,
    worker_index,
)

KEYS = [f"t{t}/{p}" for t in range(20) for p in range(200)]


def test_worker_ids() -> None:
    assert worker_ids("n1", 3) == ("n1", "n1~1", "n1~2")
    for node in worker_ids("broker-0.x", 5):
        assert broker_of(node) == "broker-0.x"
        assert worker_id("broker-0.x", worker_index(node)) == node
    for bad in (-1, 64):
        with pytest.raises(ValueError):
            worker_id("n1", bad)
    with pytest.raises(ValueError):
        worker_ids("n1", 0)
    assert worker_address("10.0.0.1:7070", 2) == "10.0.0.1:7076"
    assert worker_address("[::1]:7071", 1) == "[::1]:7074"
    assert worker_address("anything", 0) == "anything"


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_cgroup_quota_caps_the_cores(tmp_path: Path) -> None:
    v2 = "0::/\n"
    affinity = len(os.sched_getaffinity(0))
    root = _cgroup(tmp_path / "a", {"cpu.max": "150000 100000\n"})
    assert cgroup_cpu_limit(root, v2) == 1.5
    assert usable_cores(root, v2) == min(affinity, 2)
    root = _cgroup(tmp_path / "b", {"cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(root, v2) is None
    assert usable_cores(root, v2) == affinity
    # v2, a nested cgroup under a parent with the lower limit
    root = _cgroup(
        tmp_path / "c", {"kube/pod/cpu.max": "400000 100000", "kube/cpu.max": "50000 100000"}
    )
    assert cgroup_cpu_limit(root, "0::/kube/pod\n") == 0.5
    assert usable_cores(root, "0::/kube/pod\n") == 1
    # v1: cpu,cpuacct hierarchy, quota -1 for none
    v1 = "4:memory:/x\n3:cpu,cpuacct:/x\n"
    root = _cgroup(
        tmp_path / "d", {"cpu/x/cpu.cfs_quota_us": "100000", "cpu/x/cpu.cfs_period_us": "100000"}
    )
    assert cgroup_cpu_limit(root, v1) == 1.0
    root = _cgroup(
        tmp_path / "e", {"cpu/x/cpu.cfs_quota_us": "-1", "cpu/x/cpu.cfs_period_us": "100000"}
    )
    assert cgroup_cpu_limit(root, v1) is None
    assert cgroup_cpu_limit(tmp_path / "missing", v2) is None
    assert 1 <= usable_cores() <= affinity  # this machine's own cgroup


def test_the_default_is_one_worker_per_usable_core_where_ports_are_fixed(tmp_path: Path) -> None:
    def workers(**kwargs: int) -> int:
        config = BrokerConfig("n1", tmp_path, secret=new_secret(), allow_anonymous=True, **kwargs)
        return config.workers

    assert workers() == usable_cores()  # the default ports: fixed
    assert workers(workers=0) == usable_cores()
    assert workers(api_port=0) == 1  # an ephemeral port: worker w's could not be derived
    assert workers(peer_port=0) == 1
    assert workers(workers=1) == 1


def _brokers(workers: dict[str, int]) -> list[Candidate]:
    return [Candidate(b, workers=worker_ids(b, n) if n > 1 else ()) for b, n in workers.items()]


def _owners(candidates: list[Candidate]) -> dict[str, list[str]]:
    return {key: hosts(key, candidates, 3) for key in KEYS}


def test_each_hosting_broker_has_exactly_one_owning_worker() -> None:
    candidates = _brokers({"a": 2, "b": 1, "c": 3, "d": 4})
    shares: dict[str, int] = {}
    for key, nodes in _owners(candidates).items():
        assert [broker_of(n) for n in nodes] == place(key, candidates, 3)
        assert len({broker_of(n) for n in nodes}) == 3
        for node in nodes:
            shares[node] = shares.get(node, 0) + 1
    # every worker owns a share of its broker's partitions, all alike within the broker
    for c in candidates:
        counts = [shares.get(w, 0) for w in c.workers or (c.id,)]
        assert min(counts) > 0.8 * max(counts)


@pytest.mark.parametrize("change", ["add", "remove"])
def test_a_change_of_workers_moves_only_the_partitions_of_that_worker(change: str) -> None:
    before = _brokers({"a": 2, "b": 1, "c": 3})
    after = _brokers({"a": 3 if change == "add" else 1, "b": 1, "c": 3})
    old, new = _owners(before), _owners(after)
    moved = 0
    for key in KEYS:
        if old[key] == new[key]:
            continue
        moved += 1
        assert [broker_of(n) for n in old[key]] == [broker_of(n) for n in new[key]]
        (gone,) = set(old[key]) - set(new[key])
        (came,) = set(new[key]) - set(old[key])
        assert broker_of(gone) == broker_of(came) == "a"
        if change == "add":
            assert came == "a~2"  # only to the new worker
        else:
            assert gone == "a~1"  # only from the removed worker
    assert moved > 0


def test_plans_target_workers_and_prefer_one_of_them() -> None:
    candidates = _brokers({"a": 2, "b": 2, "c": 2})
    plan = plan_topic("t", 60, 3, candidates)
    for p, (target, preferred) in enumerate(zip(plan.targets, plan.preferred, strict=True)):
        assert list(target) == hosts(f"t/{p}", candidates, 3)
        assert preferred in target
    led = [broker_of(p) for p in plan.preferred if p is not None]
    assert {led.count(b) for b in "abc"} == {20}  # balanced by broker, as without workers
    assert plan_topic("t", 60, 3, _brokers({"a": 1, "b": 1, "c": 1})).targets == tuple(
        tuple(place(f"t/{p}", _brokers({"a": 1, "b": 1, "c": 1}), 3)) for p in range(60)
    )


def test_swim_members_expand_to_their_workers() -> None:
    addresses = Addresses("10.0.0.1:7070", "10.0.0.1:7071", "10.0.0.1:7072")
    states = [
        MemberState(Member("a", addresses, workers=3, workers_down=0b010), MemberStatus.ALIVE, 1),
        MemberState(Member("b", addresses, workers=2), MemberStatus.LEFT, 1),
        MemberState(Member("c", addresses), MemberStatus.SUSPECT, 1),
    ]
    assert expand(states) == {
        "a": (MemberStatus.ALIVE, "10.0.0.1:7070", "10.0.0.1:7071"),
        "a~1": (MemberStatus.DEAD, "10.0.0.1:7073", "10.0.0.1:7074"),
        "a~2": (MemberStatus.ALIVE, "10.0.0.1:7076", "10.0.0.1:7077"),
        "b": (MemberStatus.LEFT, "10.0.0.1:7070", "10.0.0.1:7071"),
        "b~1": (MemberStatus.LEFT, "10.0.0.1:7073", "10.0.0.1:7074"),
        "c": (MemberStatus.SUSPECT, "10.0.0.1:7070", "10.0.0.1:7071"),
    }


def test_a_nodes_peer_address_is_the_one_its_members_expansion_gives() -> None:
    """`peer_address` (what `Broker.send` looks up for each destination) agrees with `expand`
    (what `Broker.members` holds) on every node id, those that no member stands for
    included."""
    states = [
        MemberState(
            Member(
                name,
                Addresses(f"10.0.0.{n}:7070", f"10.0.0.{n}:7071", f"10.0.0.{n}:7072"),
                workers=workers,
                workers_down=down,
            ),
            status,
            1,
        )
        for n, (name, workers, down, status) in enumerate(
            [
                ("a", 3, 0b010, MemberStatus.ALIVE),
                ("b", 2, 0, MemberStatus.LEFT),
                ("c", 1, 0, MemberStatus.DEAD),
                ("d", 12, 0b1, MemberStatus.SUSPECT),
            ]
        )
    ]
    expanded = expand(states)
    by_id = {state.member.id: state.member for state in states}
    nodes = [*expanded, "e", "e~1", "a~3", "a~0", "a~01", "a~x", "a~", "a~~1", "d~11", "d~12"]
    nodes += ["a~\u0661", "a~-1", "a~+1", "a~ 1", "c~1", "~1", ""]
    for node in nodes:
        member = by_id.get(broker_of(node))
        expected = expanded[node][2] if node in expanded else None
        assert peer_address(member, node) == expected, node
    assert peer_address(by_id["a"], "b~1") is None  # another member's node
