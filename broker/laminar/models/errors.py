"""The API's error answer in JSON (docs/api.md, "All errors"):
`{"error": {"code", "message", ...}}`, with where to go on for some codes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from .checks import json_object, optional_integer, optional_string, string


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """An error: its `code` (the spec's ErrorCode), a message for people, and, for some codes,
    where to go on: the leader (`not_leader`), the log start (`out_of_range`), the index to
    read on from (`corrupt_data`). The JSON leaves out what is None."""

    SCHEMA: ClassVar[str] = "#/components/schemas/Error"

    code: str
    message: str
    #: `not_leader`: the leader's node id and API URL
    leader: str | None = None
    leader_url: str | None = None
    #: `out_of_range`: the partition's first index
    log_start: int | None = None
    #: `corrupt_data`: where reading can go on
    next_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        for key in ("leader", "leader_url", "log_start", "next_index"):
            value = getattr(self, key)
            if value is not None:
                error[key] = value
        return {"error": error}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        detail = json_object(json_object(obj).get("error"), "error must be an object")
        return cls(
            code=string(detail, "code"),
            message=string(detail, "message"),
            leader=optional_string(detail, "leader"),
            leader_url=optional_string(detail, "leader_url"),
            log_start=optional_integer(detail, "log_start"),
            next_index=optional_integer(detail, "next_index"),
        )
