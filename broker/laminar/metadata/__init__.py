"""Cluster metadata: the `__cluster` Raft group's state machine and where the group lives."""

from .state import (
    AlterTopic,
    ClusterState,
    Command,
    CreateTopic,
    DeleteTopic,
    MetadataError,
    SetDraining,
    SetWeight,
    Topic,
    decode_command,
    encode_command,
    validate,
)

__all__ = [
    "AlterTopic",
    "ClusterState",
    "Command",
    "CreateTopic",
    "DeleteTopic",
    "MetadataError",
    "SetDraining",
    "SetWeight",
    "Topic",
    "decode_command",
    "encode_command",
    "validate",
]
