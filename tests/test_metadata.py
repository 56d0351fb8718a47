"""The metadata state machine: validation, all-or-nothing commands, snapshots, codec."""

from __future__ import annotations

import pytest

from laminar.metadata import (
    AlterTopic,
    ClusterState,
    CreateTopic,
    DeleteTopic,
    MetadataError,
    SetDraining,
    SetWeight,
    decode_command,
    encode_command,
    validate,
)

NODES = ("n1", "n2", "n3", "n4", "n5", "n6", "n7")


def create(
    name: str, partitions: int, rf: int, config: dict[str, object] | None = None
) -> CreateTopic:
    """A CreateTopic whose assignment puts every partition on the first `rf` nodes."""
    return CreateTopic(name, partitions, rf, config or {}, (NODES[:rf],) * max(partitions, 0))


def applied(*commands: object) -> ClusterState:
    state = ClusterState()
    for index, command in enumerate(commands):
        assert state.apply(index, command) is None  # type: ignore[arg-type]
    return state


def test_topics_are_created_altered_and_deleted() -> None:
    state = applied(
        create("orders", 6, 3, {"retention_ms": 60_000}),
        AlterTopic(
            "orders", partitions=8, config={"segment_bytes": 1 << 20}, assignment=(NODES[:3],) * 2
        ),
    )
    topic = state.topics["orders"]
    assert (topic.partitions, topic.replication_factor) == (8, 3)
    assert topic.config == {"retention_ms": 60_000, "segment_bytes": 1 << 20}
    assert len(topic.assignment) == 8 and topic.assignment[7] == ("n1", "n2", "n3")
    assert state.apply(2, DeleteTopic("orders")) is None
    assert state.topics == {}


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "-x", "x" * 201, "ünicode", "a b", "../etc"]
)
def test_invalid_topic_names_are_refused(name: str) -> None:
    with pytest.raises(MetadataError) as info:
        validate(create(name, 1, 1))
    assert info.value.code == "invalid"


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (create("t", 0, 1), "invalid"),
        (create("t", 1, 0), "invalid"),
        (create("t", 1, 8), "invalid"),
        (create("t", 10_001, 1), "invalid"),
        (create("t", 1, 1, {"colour": "red"}), "invalid"),
        (create("t", 1, 1, {"fsync": "sometimes"}), "invalid"),
        (create("t", 1, 1, {"retention_bytes": -1}), "invalid"),
        (create("t", True, 1), "invalid"),  # type: ignore[arg-type]
        (CreateTopic("t", 2, 1, {}, (("n1",),)), "invalid"),  # one partition unassigned
        (CreateTopic("t", 1, 2, {}, (("n1", "n1"),)), "invalid"),
        (CreateTopic("t", 1, 1, {}, (("n1", "n2"),)), "invalid"),  # more voters than RF
        (CreateTopic("t", 1, 1, {}, (("bad id",),)), "invalid"),
        (SetWeight("n1", -1), "invalid"),
        (SetWeight("bad id", 1), "invalid"),
    ],
)
def test_invalid_commands_are_refused(command: object, code: str) -> None:
    with pytest.raises(MetadataError) as info:
        validate(command)  # type: ignore[arg-type]
    assert info.value.code == code


def test_commands_invalid_against_the_state_change_nothing() -> None:
    state = applied(create("orders", 6, 3))
    before = state.snapshot()
    for index, (command, code) in enumerate(
        [
            (create("orders", 1, 1), "exists"),
            (AlterTopic("orders", partitions=5), "invalid"),
            (AlterTopic("missing", partitions=9), "not_found"),
            (AlterTopic("orders", partitions=9), "invalid"),  # new partitions unassigned
            (DeleteTopic("missing"), "not_found"),
            (AlterTopic("orders", config={"segment_bytes": 1}), "invalid"),
        ],
        start=1,
    ):
        error = state.apply(index, command)
        assert error is not None and error.code == code
        assert state.snapshot().replace(b'"applied_index": %d' % index, b'"applied_index": 0') == (
            before
        )
    with pytest.raises(ValueError):
        state.apply(3, DeleteTopic("orders"))  # an index already applied


def test_weights_and_drains() -> None:
    state = applied(SetWeight("n1", 5), SetDraining("n2", True), SetDraining("n3", True))
    assert (state.weight("n1"), state.weight("n9")) == (5, 1)
    assert state.draining == {"n2", "n3"}
    state.apply(3, SetDraining("n2", False))
    assert state.draining == {"n3"}
    # a worker drains apart from its broker (docs/workers.md); weights are the broker's
    validate(SetDraining("n2~1", True))
    for command in (SetWeight("n2~1", 2), SetDraining("n2~", True), SetDraining("~1", True)):
        with pytest.raises(MetadataError):
            validate(command)


def test_snapshot_round_trip_is_canonical() -> None:
    state = applied(
        create("b", 2, 1, {"fsync": "never"}),
        create("a", 1, 3),
        SetWeight("n2", 3),
        SetDraining("n1", True),
    )
    restored = ClusterState.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert restored.topics == state.topics and restored.applied_index == 3
    with pytest.raises(MetadataError):
        ClusterState.restore(b'{"version": 99}')


def test_command_codec_round_trip_and_rejections() -> None:
    for command in (
        create("t", 3, 2, {"retention_ms": 5}),
        AlterTopic("t", partitions=4, assignment=(("n1", "n2"),)),
        DeleteTopic("t"),
        SetWeight("n1", 2),
        SetDraining("n1", True),
    ):
        assert decode_command(encode_command(command)) == command  # type: ignore[arg-type]
    for junk in (
        b"",
        b"[]",
        b'{"op": "nope"}',
        b'{"op": "delete_topic"}',
        b"\xff",
        b'{"op": "delete_topic", "name": ".."}',
    ):
        with pytest.raises(MetadataError):
            decode_command(junk)
