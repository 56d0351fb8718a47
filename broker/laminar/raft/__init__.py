"""Sans-I/O multi-Raft: one group per partition, whose log is the partition's segmented log."""

from .config import RaftConfig
from .messages import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    Snapshot,
)
from .raft import ProposalDropped, Raft, Ready, Role, scan_pending_confs
from .storage import MemoryRaftStorage, RaftStorage, StorageUnavailable

__all__ = [
    "ConfChange",
    "ConfChangeKind",
    "ConfState",
    "Entry",
    "EntryKind",
    "HardState",
    "MemoryRaftStorage",
    "Message",
    "MessageType",
    "ProposalDropped",
    "Raft",
    "RaftConfig",
    "RaftStorage",
    "Ready",
    "Role",
    "Snapshot",
    "StorageUnavailable",
    "scan_pending_confs",
]
