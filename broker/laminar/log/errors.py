"""The log's errors: one type per layer, each wrapping the layer below with `raise ... from`.

Layers, bottom up: storage (files or memory) → batch codec → store / index → segment →
segmented log. Errors about the caller's input (a malformed batch, an index out of range, a
stream over its threshold) are raised before anything is changed.
"""


class StorageError(Exception):
    """The storage backend (a file or its in-memory stand-in) failed an I/O operation."""


class BatchError(ValueError):
    """Bytes that should be a record batch are not a valid one."""


class BatchFramingError(BatchError):
    """The batch's framing is wrong: magic, version, lengths or counts."""


class MalformedRecordsError(BatchFramingError):
    """The batch's header and checksum hold but its records section breaks the framing rules
    (`laminar.log.records`). Appends refuse it; a reader that meets one already stored (from
    before appends checked records) goes on at `next_index`, the first index after it."""

    def __init__(self, message: str, *, base_index: int, next_index: int) -> None:
        super().__init__(message)
        self.base_index = base_index
        self.next_index = next_index


class DecompressionError(BatchFramingError):
    """A compressed records section cannot be decompressed within its bounds: damaged, over the
    limit, or not the length it declares (`batch.verify_records` turns it into a
    MalformedRecordsError, with the batch's indexes)."""


class BatchChecksumError(BatchError):
    """The batch's xxh3-64 checksum does not match its bytes."""


class BatchTooLargeError(BatchError):
    """The batch is larger than the configured `max_batch_bytes`."""


class StoreError(Exception):
    """A segment store file (`<base>.log`) is unreadable, damaged or failed to write."""


class SegmentIndexError(Exception):
    """A sparse segment index (`<base>.index`) is damaged or failed to write."""


class SegmentError(Exception):
    """A segment (store + index) could not be opened, appended to, read or truncated."""


class LogError(Exception):
    """The segmented log refused or failed an operation."""


class LogConfigError(LogError, ValueError):
    """A log configuration value is out of range."""


class IndexOutOfRangeError(LogError):
    """An index lies outside `[start_index, next_index)` (or `[start, next]` for truncate)."""

    def __init__(self, index: int, start_index: int, next_index: int) -> None:
        super().__init__(f"index {index} is outside the log [{start_index}, {next_index})")
        self.index = index
        self.start_index = start_index
        self.next_index = next_index


class NotBatchBoundaryError(LogError):
    """Truncation must cut between whole batches; this index lies inside one."""

    def __init__(self, index: int, batch_base_index: int, batch_next_index: int) -> None:
        super().__init__(
            f"index {index} is inside the batch [{batch_base_index}, {batch_next_index}); "
            "truncate to a batch boundary"
        )
        self.index = index
        self.batch_base_index = batch_base_index
        self.batch_next_index = batch_next_index


class AppendThresholdError(LogError):
    """A streaming append declared or sent more bytes than its append threshold allows."""


class CorruptBatchError(LogError):
    """A stored batch failed its checksum or framing check; it is never served."""

    def __init__(self, message: str, *, index: int, segment_base_index: int) -> None:
        super().__init__(message)
        self.index = index
        self.segment_base_index = segment_base_index


class LogClosedError(LogError):
    """The log was closed."""


class AppendInProgressError(LogError):
    """A streaming append holds the log; other writes must wait for it to finish."""


#: What a failed write or sync raises, after which a broker stops (fail-stop: a round half
#: persisted cannot be retried safely, as the kernel may have dropped the unsynced pages).
STORAGE_FAILURES = (OSError, StorageError, StoreError, SegmentError, SegmentIndexError, LogError)
