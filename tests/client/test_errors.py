"""Error answers of the API (docs/api.md, "All errors") map to the client's exception classes."""

from __future__ import annotations

import pytest

from laminar.client import (
    BadRequest,
    Conflict,
    CorruptData,
    LaminarError,
    NotFound,
    OutOfRange,
    Overloaded,
    PayloadTooLarge,
    Timeout,
    Unauthorized,
    Unavailable,
    error_from_response,
)


def body(code: str, **extra: object) -> dict[str, object]:
    return {"error": {"code": code, "message": f"about {code}", **extra}}


@pytest.mark.parametrize(
    ("status", "code", "cls", "retryable"),
    [
        (400, "bad_request", BadRequest, False),
        (400, "corrupt_batch", BadRequest, False),
        (401, "unauthorized", Unauthorized, False),
        (404, "not_found", NotFound, False),
        (405, "method_not_allowed", BadRequest, False),
        (409, "conflict", Conflict, False),
        (413, "payload_too_large", PayloadTooLarge, False),
        (415, "unsupported_media_type", BadRequest, False),
        (416, "out_of_range", OutOfRange, False),
        (429, "overloaded", Overloaded, True),
        (503, "unavailable", Unavailable, True),
        (504, "timeout", Timeout, True),
    ],
)
def test_each_status_has_its_class(
    status: int, code: str, cls: type[LaminarError], retryable: bool
) -> None:
    error = error_from_response(status, body(code))
    assert type(error) is cls
    assert isinstance(error, LaminarError)
    assert (error.status, error.code, error.message) == (status, code, f"about {code}")
    assert error.body == body(code)
    assert error.retryable is retryable
    assert not error.ambiguous
    assert code in str(error)


def test_out_of_range_carries_the_log_start() -> None:
    error = error_from_response(416, body("out_of_range", log_start=42))
    assert isinstance(error, OutOfRange)
    assert error.log_start == 42
    assert OutOfRange(416, "out_of_range", "x").log_start is None
    assert OutOfRange(416, "out_of_range", "x", log_start=7).log_start == 7


def test_answers_that_are_not_the_error_schema_still_map_by_status() -> None:
    error = error_from_response(502, None)  # a proxy's: it may have reached the broker
    assert isinstance(error, Timeout) and error.code == "unknown"
    assert isinstance(error_from_response(500, None), Timeout)
    assert type(error_from_response(418, "teapot")) is LaminarError
    assert isinstance(error_from_response(404, {"unexpected": 1}), NotFound)


def test_damaged_records_say_where_reading_goes_on() -> None:
    error = error_from_response(422, body("corrupt_data", next_index=17))
    assert isinstance(error, CorruptData) and error.next_index == 17
    assert not error.retryable
