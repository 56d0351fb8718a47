"""Weighted rendezvous placement: shares follow weights, and membership changes move only
what they must."""

from __future__ import annotations

import pytest

from laminar.placement import Candidate, owner, partition_key, place, rank, unit_hash

KEYS = [partition_key(f"topic-{t}", p) for t in range(60) for p in range(500)]  # 30,000


def first_choices(candidates: list[Candidate]) -> dict[str, str]:
    return {key: place(key, candidates, 1)[0] for key in KEYS}


def test_unit_hash_is_strictly_inside_the_unit_interval() -> None:
    values = [unit_hash(key, "n") for key in KEYS[:5000]]
    assert all(0.0 < v < 1.0 for v in values)
    assert 0.45 < sum(values) / len(values) < 0.55


def test_shares_are_proportional_to_weights() -> None:
    candidates = [Candidate("a", 1), Candidate("b", 2), Candidate("c", 3), Candidate("d", 4)]
    counts: dict[str, int] = {}
    for node in first_choices(candidates).values():
        counts[node] = counts.get(node, 0) + 1
    for candidate in candidates:
        expected = candidate.weight / 10
        assert abs(counts[candidate.id] / len(KEYS) - expected) < 0.01, counts


@pytest.mark.parametrize("n", [3, 5, 9])
def test_adding_a_node_moves_about_its_share_and_only_to_it(n: int) -> None:
    before = [Candidate(f"n{i}") for i in range(n)]
    after = [*before, Candidate("new")]
    old, new = first_choices(before), first_choices(after)
    moved = [key for key in KEYS if old[key] != new[key]]
    assert all(new[key] == "new" for key in moved)
    assert abs(len(moved) / len(KEYS) - 1 / (n + 1)) < 0.01


def test_adding_a_node_changes_each_replica_set_by_at_most_that_node() -> None:
    before = [Candidate(f"n{i}") for i in range(5)]
    after = [*before, Candidate("new")]
    changed = 0
    for key in KEYS[:5000]:
        old, new = set(place(key, before, 3)), set(place(key, after, 3))
        assert new - old <= {"new"} and len(old - new) <= 1
        changed += old != new
    assert 0.5 < changed / 5000 / (3 / 6) < 1.5  # about rf / (n + 1) of the sets change


def test_removing_a_node_moves_only_its_own_partitions() -> None:
    everyone = [Candidate(f"n{i}") for i in range(6)]
    old = first_choices(everyone)
    new = first_choices([c for c in everyone if c.id != "n3"])
    for key in KEYS:
        if old[key] != "n3":
            assert new[key] == old[key]
        else:
            assert new[key] != "n3"


def test_dead_draining_and_zero_weight_nodes_host_nothing() -> None:
    candidates = [
        Candidate("a"),
        Candidate("b", alive=False),
        Candidate("c", draining=True),
        Candidate("d", weight=0),
        Candidate("e"),
    ]
    assert {n for key in KEYS[:2000] for n in place(key, candidates, 3)} == {"a", "e"}
    assert rank("t/0", candidates) in (["a", "e"], ["e", "a"])
    assert place("t/0", [Candidate("b", alive=False)], 3) == []


def test_errors_and_worker_routing() -> None:
    with pytest.raises(ValueError):
        place("t/0", [Candidate("a")], 0)
    with pytest.raises(ValueError):
        Candidate("a", weight=-1)
    with pytest.raises(ValueError):
        owner("t/0", [])
    workers = ["w0", "w1", "w2", "w3"]
    owners = [owner(key, workers) for key in KEYS[:8000]]
    assert all(abs(owners.count(w) / 8000 - 0.25) < 0.02 for w in workers)
    assert owner("t/0", workers) == owner("t/0", list(reversed(workers)))
