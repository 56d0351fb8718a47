"""HTTP pieces shared by the API's handlers: JSON errors and the JSON rendering of records."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..log.errors import CorruptBatchError

if TYPE_CHECKING:
    from ..partition.replica import Replica


def json_response(
    body: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer, encoded with orjson (acquire and read answers carry many records)."""
    return web.Response(
        body=orjson.dumps(body),
        status=status,
        headers=headers,
        content_type="application/json",
        charset="utf-8",
    )


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> web.Response:
        body = {"error": {"code": self.code, "message": self.message, **self.extra}}
        return json_response(body, status=self.status, headers=self.headers)


def unavailable(message: str) -> ApiError:
    """503: nothing was done (no leader known, not ready, shutting down); retry."""
    return ApiError(503, "unavailable", message, headers={"Retry-After": "1"})


def damaged(replica: Replica, error: CorruptBatchError) -> ApiError:
    """A read met a batch damaged on disk (never served). Another replica has it: 503 while
    this one is repaired. This is the partition's only voter: 422 with where to read on."""
    if replica.repairable:
        return unavailable(
            f"{replica.group}: this replica's batch at {error.index} is damaged on disk and "
            "is being fetched again from the leader; retry (another replica may serve it)"
        )
    _, end = replica.log.batch_range(error.index)
    return ApiError(
        422,
        "corrupt_data",
        f"{replica.group}: the records {error.index}..{end - 1} are damaged on disk and the "
        f"partition has no other replica to fetch them from; read on from {end}",
        next_index=end,
    )


def outcome_unknown(code: str, message: str) -> ApiError:
    """504: a write was proposed but whether it committed is not known (`timeout`: not within
    the request timeout; `outcome_unknown`: leadership was lost, or the replica closed, first).
    It may still commit: only a retry the broker deduplicates is safe."""
    return ApiError(504, code, message)


def record_json(record: Any) -> dict[str, Any]:
    try:
        out: dict[str, Any] = {
            "index": record.index,
            "timestamp_ms": record.timestamp_ms,
            "key": None if record.key is None else record.key.decode(),
            "value": None if record.value is None else record.value.decode(),
            "headers": {name: value.decode() for name, value in record.headers},
        }
    except UnicodeDecodeError:
        return {
            "index": record.index,
            "timestamp_ms": record.timestamp_ms,
            "encoding": "base64",
            "key": _b64(record.key),
            "value": _b64(record.value),
            "headers": {name: base64.b64encode(value).decode() for name, value in record.headers},
        }
    return out


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()
