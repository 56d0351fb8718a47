"""The client's errors: one class per API error status (docs: docs/api.md, "All errors").

Every error the broker answers with is raised as a `LaminarError` subclass carrying the HTTP
`status`, the API error `code`, the human `message` and the whole decoded JSON `body`. Failures
that never got an answer (no broker reachable, the client's own deadline) use status 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laminar.models import ErrorBody, ModelError


class LaminarError(Exception):
    """An error answered by a broker (or status 0: no answer at all).

    `ambiguous` is set when the call may have taken effect although it failed: a write
    answered 504 (its outcome is unknown), or an attempt whose connection broke after the
    request was sent. `retryable` says whether a retry may succeed: before repeating a write
    that is not idempotent (an append without a producer id), look at `ambiguous` first.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body: Mapping[str, Any] = body if body is not None else {}
        self.ambiguous = False

    @property
    def retryable(self) -> bool:
        """True for errors a retry may cure (the broker did nothing, or is idempotent)."""
        return False


class BadRequest(LaminarError):
    """400 `bad_request` / `corrupt_batch`, 405 and 415: the request itself is wrong."""


class Unauthorized(LaminarError):
    """401: the bearer token is missing or wrong."""


class Forbidden(LaminarError):
    """403 `forbidden`: the token's principal may not do this (its role, or the topic is not
    in its scope)."""


class NotFound(LaminarError):
    """404: unknown topic, partition, node or route."""


class Conflict(LaminarError):
    """409: the topic exists, or a producer sequence is out of order."""


class PayloadTooLarge(LaminarError):
    """413: the request body is over the broker's limit (default 8 MiB)."""


class OutOfRange(LaminarError):
    """416: `from` is below the partition's log start (`log_start`: the first index kept)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        body: Mapping[str, Any] | None = None,
        log_start: int | None = None,
    ) -> None:
        super().__init__(status, code, message, body)
        if log_start is None:
            detail = self.body.get("error")
            value = detail.get("log_start") if isinstance(detail, Mapping) else None
            log_start = value if isinstance(value, int) else None
        self.log_start = log_start


class CorruptData(LaminarError):
    """422: the records asked for are damaged on disk and the partition has no other replica
    to fetch them from (`next_index`: where reading can go on)."""

    @property
    def next_index(self) -> int | None:
        detail = self.body.get("error")
        value = detail.get("next_index") if isinstance(detail, Mapping) else None
        return value if isinstance(value, int) else None


class Overloaded(LaminarError):
    """429: the partition's queue of appends awaiting commit is full; retry later."""

    @property
    def retryable(self) -> bool:
        return True


class Unavailable(LaminarError):
    """503 (nothing was done: no leader known, not ready, the broker is stopping) or status 0:
    no broker could be reached (or the connection broke: then `ambiguous`)."""

    @property
    def retryable(self) -> bool:
        return True


class Timeout(LaminarError):
    """504, the outcome of a write is unknown: `timeout` (not committed within the broker's
    request timeout) or `outcome_unknown` (the replica closed, or a queue command's leader
    stepped down, first); it MAY still commit. Or status 0: the client's own deadline passed
    before an answer."""

    @property
    def retryable(self) -> bool:
        return True


_BY_STATUS: dict[int, type[LaminarError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: BadRequest,
    409: Conflict,
    413: PayloadTooLarge,
    415: BadRequest,
    416: OutOfRange,
    422: CorruptData,
    429: Overloaded,
    503: Unavailable,
    504: Timeout,
}


def error_from_response(status: int, body: Any) -> LaminarError:
    """The exception for an error answer: `body` is the decoded JSON (anything, if it was not
    JSON). Other 5xx statuses than the broker's 503 and 504 (a 500, a proxy's 502) map to
    `Timeout`: the request may have reached the broker, so a write's outcome is unknown.
    Other unknown statuses map to `LaminarError`, and a body that is not the API's error
    (`ErrorBody`: a proxy's, say) to code `unknown`."""
    try:
        error = ErrorBody.from_json(body)
        code, message = error.code, error.message
    except ModelError:
        code, message = "unknown", f"HTTP {status}"
    mapping = body if isinstance(body, Mapping) else None
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = Timeout if 500 <= status < 600 else LaminarError
    return cls(status, code, message, mapping)
