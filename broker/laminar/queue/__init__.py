"""Shared queues on the log: consumer groups with the Qpid delivery guarantees."""

from .state import (
    Accept,
    Acquire,
    DeadLettered,
    Expire,
    Granted,
    QueueCommand,
    QueueConfig,
    QueueError,
    QueueState,
    Reject,
    Release,
    Result,
    decode_command,
    encode_command,
    validate,
)

__all__ = [
    "Accept",
    "Acquire",
    "DeadLettered",
    "Expire",
    "Granted",
    "QueueCommand",
    "QueueConfig",
    "QueueError",
    "QueueState",
    "Reject",
    "Release",
    "Result",
    "decode_command",
    "encode_command",
    "validate",
]
