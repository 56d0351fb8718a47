"""The segmented commit log: record-batch codec, store, sparse index, segments, retention.

Layers, each using only the one below: storage → store / index → segment → segmented log.
The broker drives the segmented log itself (raft/log_storage.py; group commit: the driver
writes a round's batches, then one `sync` per log makes them durable).
"""

from .batch import (
    BATCH_HEADER_BYTES,
    BatchHeader,
    Record,
    StoredRecord,
    decode_batch,
    decode_batches,
    encode_batch,
    parse_header,
    split_batches,
    verify_batch,
)
from .config import FsyncPolicy, LogConfig
from .errors import (
    AppendInProgressError,
    AppendThresholdError,
    BatchChecksumError,
    BatchError,
    BatchFramingError,
    BatchTooLargeError,
    CorruptBatchError,
    IndexOutOfRangeError,
    LogClosedError,
    LogConfigError,
    LogError,
    MalformedRecordsError,
    NotBatchBoundaryError,
    SegmentError,
    SegmentIndexError,
    StorageError,
    StoreError,
)
from .segment import ReadResult
from .segmented_log import AppendResult, RecoveryReport, RetentionReport, SegmentedLog
from .storage import Directory, FileDirectory, MemoryDirectory, Storage

__all__ = [
    "BATCH_HEADER_BYTES",
    "AppendInProgressError",
    "AppendResult",
    "AppendThresholdError",
    "BatchChecksumError",
    "BatchError",
    "BatchFramingError",
    "BatchHeader",
    "BatchTooLargeError",
    "CorruptBatchError",
    "Directory",
    "FileDirectory",
    "FsyncPolicy",
    "IndexOutOfRangeError",
    "LogClosedError",
    "LogConfig",
    "LogConfigError",
    "LogError",
    "MalformedRecordsError",
    "MemoryDirectory",
    "NotBatchBoundaryError",
    "ReadResult",
    "Record",
    "RecoveryReport",
    "RetentionReport",
    "SegmentError",
    "SegmentIndexError",
    "SegmentedLog",
    "Storage",
    "StorageError",
    "StoreError",
    "StoredRecord",
    "decode_batch",
    "decode_batches",
    "encode_batch",
    "parse_header",
    "split_batches",
    "verify_batch",
]
