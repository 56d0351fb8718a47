"""Cluster metadata: the `__cluster` Raft group's state machine and where the group lives."""

from .group import METADATA_GROUP, METADATA_VOTERS, metadata_voters
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
    decode_proposal,
    encode_command,
    validate,
    validate_proposal,
)

__all__ = [
    "METADATA_GROUP",
    "METADATA_VOTERS",
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
    "decode_proposal",
    "encode_command",
    "metadata_voters",
    "validate",
    "validate_proposal",
]
