"""The queue scenario of the simulator: consumer groups on Raft partitions under crashes,
partitions, lost messages and compaction, and an admin resetting and deleting groups. Many
seeds keep the Qpid guarantees (never two holders, nothing accepted redelivered, every message
accepted or dead-lettered exactly once since the last reset); a seed replays exactly; and a
broken state machine is caught."""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from laminar.queue.applier import QueueApplier
from laminar.queue.rewind import plan_reset
from laminar.queue.state import (
    Accept,
    DeadLetter,
    DeadLettered,
    Group,
    QueueCommand,
    QueueState,
    Reject,
    Release,
    Reset,
    Result,
)
from laminar.sim import InvariantViolation, queue_sim
from laminar.sim.queue_sim import SCENARIO, STAT_KEYS, QueueSimulation

from ..conftest import sim_first_lines

SEEDS = int(os.environ.get("LAMINAR_QUEUE_SIM_SEEDS", "30"))
JOBS = 2
SHORT = replace(SCENARIO, ticks=150)


@pytest.fixture(autouse=True)
def _quiet_recovery_reports() -> None:
    logging.getLogger("laminar.log").setLevel(logging.ERROR)


def _run(seed: int) -> dict[str, int]:
    logging.getLogger("laminar.log").setLevel(logging.ERROR)
    return QueueSimulation(seed).run()  # raises InvariantViolation with a replay line


def test_many_seeds_keep_the_queue_guarantees_under_faults() -> None:
    totals: Counter[str] = Counter()
    with multiprocessing.get_context("fork").Pool(JOBS) as pool:
        for stats in pool.imap(_run, range(SEEDS)):
            assert stats["messages"] > 0 and stats["accepts"] > 0
            if not stats["group_resets"] and not stats["group_deletes"]:
                # every message ended one way or the other (each run checks each message
                # since the last reset or delete; without one, that is all of them)
                assert stats["accepts"] + stats["dead_letters"] == stats["messages"]
            totals.update({k: v for k, v in stats.items() if k != "digest"})
    exercised = (
        "grants",
        "pipelined_acquires",  # naming records proposed and not applied yet
        "handed_off_acquires",  # proposed behind new records, persisted in their Ready
        "redeliveries",
        "accepts",
        "releases",
        "rejects",
        "renewals",
        "expiries",
        "refused",  # stale choices of a lagging or deposed leader
        "dead_letters",
        "max_delivery_dead_letters",
        "dlq_duplicate_appends",  # a leader change between the DLQ append and its commit
        "dlq_failures",
        "lost_answers",
        "repeated_settles",  # a consumer settling again after its answer was lost
        "late_settles",  # settling after the lease ended (refused)
        "consumer_crashes",
        "crashes",
        "snapshots",  # installed on lagging replicas: their appliers reset from the data
        "queue_resets",
        "queue_compactions",
        "queue_checkpoints",
        "elections",
        "confs",
        "group_resets",
        "group_deletes",
        "group_admin_refused",  # busy (not forced), or planned before the groups moved on
        "rewinds_below_forgotten_ranges",  # carrying the record ranges the leader read
    )
    missing = [key for key in exercised if totals[key] == 0]
    assert not missing, f"never exercised: {missing} ({dict(totals)})"


def test_a_seed_replays_exactly() -> None:
    def run(seed: int) -> tuple[dict[str, int], list[object]]:
        simulation = QueueSimulation(seed, SHORT)
        stats = simulation.run()
        return stats, list(simulation.trace)

    first = run(7)
    assert first == run(7)
    assert set(STAT_KEYS) <= set(first[0])
    assert run(8)[0] != first[0]


def test_cli_replays_a_queue_seed_independently_of_string_hashing() -> None:
    outputs = sim_first_lines("--queue", "--seed", "3", "--ticks", "150")
    assert outputs[0].startswith("seed 3: ok")
    assert outputs[0] == outputs[1]


def _violation(pattern: str, seeds: int = 20) -> str:
    """The first failure matching `pattern` among the seeds (other failures are skipped, so
    that a bug elsewhere does not hide what a mutation must trip)."""
    seen = []
    for seed in range(seeds):
        try:
            QueueSimulation(seed, SHORT).run()
        except InvariantViolation as e:
            if re.search(pattern, str(e)):
                return str(e)
            seen.append(str(e).splitlines()[0])
    raise AssertionError(f"no seed failed with {pattern!r}; failures: {seen}")


def test_the_checks_catch_an_acquire_that_ignores_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    def free(self: QueueState, group: Group, index: int, now_ms: int) -> bool:
        return index >= group.cursor and index not in group.done | set(group.dead_pending)

    monkeypatch.setattr(QueueState, "_free", free)
    failure = _violation("two holders")
    assert "replay: python -m laminar.sim --queue --seed" in failure


def test_the_checks_catch_redelivery_of_accepted_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def free(self: QueueState, group: Group, index: int, now_ms: int) -> bool:
        holding = group.acquired.get(index)
        if index in group.dead_pending or index < group.cursor:
            return False
        return holding is None or holding.deadline_ms <= now_ms  # forgets `done`

    monkeypatch.setattr(QueueState, "_free", free)
    _violation(r"accepted message \d+ redelivered")


def test_the_checks_catch_reused_dead_letter_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    def dead_letter(
        self: QueueState, group: Group, index: int, reason: str, deliveries: int, result: Result
    ) -> None:
        group.deliveries.pop(index, None)
        group.dead_pending[index] = DeadLetter(group.next_dead_sequence, reason, deliveries)
        result.dead_lettered.append(index)  # the sequence never advances

    monkeypatch.setattr(QueueState, "_dead_letter", dead_letter)
    # the oracle's sequence numbers disagree, or the idempotent DLQ producer sees a clash
    _violation(r"dead letters \{.*\} != |names both")


def test_the_checks_catch_a_dead_letter_that_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    apply = QueueState.apply

    def forgetful(self: QueueState, command: QueueCommand) -> Result:
        if not isinstance(command, DeadLettered):
            return apply(self, command)
        group, result = self.group(command.group), Result()
        for index in command.indexes:
            if group.dead_pending.pop(index, None) is not None:
                group.dead_lettered_total += 1  # but not marked done: it is free again
                result.done.append(index)
        return result

    monkeypatch.setattr(QueueState, "apply", forgetful)
    # handed out again, or (if only never-given-out and returned messages are offered) stuck
    _violation(r"dead-lettered message \d+ redelivered|stopped draining")


def test_the_checks_catch_a_replica_that_ignores_installed_snapshots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(QueueApplier, "reset", lambda self: None)
    _violation("different queue states|past the oracle")


def test_the_checks_catch_a_settle_after_the_lease_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    apply = QueueState.apply

    def clockless(self: QueueState, command: QueueCommand) -> Result:
        if isinstance(command, Accept | Release | Reject):
            command = replace(command, now_ms=None)  # a lease not expired yet counts as held
        return apply(self, command)

    monkeypatch.setattr(QueueState, "apply", clockless)
    _violation("answered done but did not take effect")


def test_the_checks_catch_a_settle_answered_done_for_someone_elses_settlement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Anything:
        def __eq__(self, other: object) -> bool:
            return True

    def any_settlement(self: Group, index: int) -> Any:
        return Anything()  # every message not held counts as settled by whoever asks

    monkeypatch.setattr(Group, "settlement", any_settlement)
    _violation("answered done but did not take effect")


def test_the_checks_catch_a_repeated_settle_that_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Group, "settlement", lambda self, index: None)  # remembers nothing
    _violation(r"repeated \w+ of \d+ refused")


def test_the_checks_catch_a_reset_of_a_busy_group_without_force(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(QueueState, "busy", lambda self, name, now_ms: None)
    _violation("busy is True, the state answered None")


def test_the_checks_catch_a_rewind_that_misses_record_ranges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def careless(*args: Any, **kwargs: Any) -> Reset:
        command = plan_reset(*args, **kwargs)
        return replace(command, ranges=command.ranges[1:])  # the first range left out

    monkeypatch.setattr(queue_sim, "plan_reset", careless)
    _violation(r"put the cursor at \d+, not \d+|accepted 0 times")
