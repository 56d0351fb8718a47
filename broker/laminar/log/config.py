"""The log's knobs in one place, with units in the names and documented defaults."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .errors import LogConfigError

KIB = 1024
MIB = 1024 * KIB


class FsyncPolicy(StrEnum):
    """When appended bytes are made durable with fdatasync."""

    #: Group commit: an append completes only after an fdatasync that covers it; concurrent
    #: appends share one fdatasync.
    ALWAYS = "always"
    #: fdatasync every `fsync_interval_ms`; an append completes once written.
    INTERVAL = "interval"
    #: Never fdatasync (benchmarks only): a power cut may lose anything.
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class LogConfig:
    #: A segment rolls once its store reaches this size.
    segment_bytes: int = 64 * MIB
    #: How far an append may take a segment past `segment_bytes`; None = segment_bytes // 2.
    segment_overflow_bytes: int | None = None
    #: Largest batch accepted (header included); must fit in the overflow.
    #: None = min(8 MiB, segment_overflow_bytes).
    max_batch_bytes: int | None = None
    #: Retention by size: drop the oldest sealed segments while the log is larger. None = off.
    retention_bytes: int | None = None
    #: Retention by age: drop sealed segments sealed longer ago than this. None = off.
    retention_ms: int | None = None
    #: Roll the active segment once it is older than this, so age retention can reach it.
    segment_ms: int | None = None
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(self, "fsync", FsyncPolicy(self.fsync))
        if self.segment_bytes < 4 * KIB:
            raise LogConfigError(f"segment_bytes={self.segment_bytes} is below 4096")
        if self.segment_overflow_bytes is None:
            object.__setattr__(self, "segment_overflow_bytes", self.segment_bytes // 2)
        if self.max_batch_bytes is None:
            object.__setattr__(self, "max_batch_bytes", min(8 * MIB, self.overflow_bytes))
        if self.batch_limit_bytes < 128:
            raise LogConfigError(f"max_batch_bytes={self.max_batch_bytes} is below 128")
        if self.batch_limit_bytes > self.overflow_bytes:
            raise LogConfigError(
                f"max_batch_bytes={self.max_batch_bytes} exceeds "
                f"segment_overflow_bytes={self.overflow_bytes}: a batch must fit in the overflow"
            )
        for name in ("retention_bytes", "retention_ms", "segment_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise LogConfigError(f"{name}={value} must be positive or None")
        if self.fsync_interval_ms <= 0:
            raise LogConfigError(f"fsync_interval_ms={self.fsync_interval_ms} must be positive")

    @property
    def batch_limit_bytes(self) -> int:
        """`max_batch_bytes` once resolved."""
        assert self.max_batch_bytes is not None
        return self.max_batch_bytes

    @property
    def overflow_bytes(self) -> int:
        assert self.segment_overflow_bytes is not None
        return self.segment_overflow_bytes
