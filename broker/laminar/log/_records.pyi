"""Type stub of the C record walker (`_records.c`); see `laminar.log.records`."""

def records_problem(
    payload: bytes | bytearray | memoryview,
    record_count: int,
    first_timestamp_ms: int,
    max_timestamp_ms: int,
    /,
) -> str | None: ...
