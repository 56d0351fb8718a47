"""One HTTP call to the brokers, following 307s by hand, and what its answer allows a checker
to conclude: every answer is kept, nothing is retried here."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

MAX_REDIRECTS = 5
BATCH_TYPE = "application/vnd.laminar.batch"

#: Outcomes of a write. "definite" ones prove that nothing was written; "ambiguous" ones
#: do not. Why each is where it is (docs/api.md, "503 or 504"):
#: * refused: the TCP connection was never established, so no byte reached a broker;
#: * redirect_loop: every hop was answered 307 (a redirect proposes nothing);
#: * 4xx (400 bad input, 404 unknown topic, 409 sequence conflict, 413, 415, 429 queue full):
#:   the broker refused the request before proposing it;
#: * 503: "the broker did nothing with the request" (no leader known, not ready, stopping,
#:   or a write the next leader certainly did not commit);
#: * timeout / connection_lost: the request may have reached the leader and been proposed;
#: * 504 (timeout, outcome_unknown): proposed, "MAY still commit later";
#: * 500 and any other status: unknown server state (and a violation of its own).
DEFINITE_STATUSES = frozenset({400, 404, 409, 413, 415, 429, 503})


@dataclass
class Answer:
    status: int  # 0: no HTTP answer (see `error`)
    error: str  # "", or refused / timeout / connection_lost / redirect_loop
    body: bytes
    headers: dict[str, str]
    url: str
    sent_s: float  # time.monotonic() when the request left
    answered_s: float

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def definite_failure(self) -> bool:
        """True when the request certainly changed nothing (see DEFINITE_STATUSES)."""
        return self.error in ("refused", "redirect_loop") or self.status in DEFINITE_STATUSES

    @property
    def outcome(self) -> str:
        if self.status:
            return str(self.status)
        return self.error

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None

    def error_code(self) -> str:
        data = self.json()
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return str(data["error"].get("code", ""))
        return ""

    def message(self) -> str:
        data = self.json()
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return str(data["error"].get("message", ""))[:300]
        return self.body[:300].decode(errors="replace")


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json_body: Any = None,
    body: bytes | None = None,
    content_type: str | None = None,
    accept: str = "application/json",
    timeout_s: float = 5.0,
    follow: bool = True,
) -> Answer:
    """One request (and the 307s that move it to a leader), never raising for network
    errors: they become an Answer with status 0 and an error name."""
    if json_body is not None:
        body = orjson.dumps(json_body)
        content_type = "application/json"
    headers = {"Accept": accept}
    if content_type:
        headers["Content-Type"] = content_type
    sent_s = time.monotonic()
    deadline = sent_s + timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            return Answer(0, "timeout", b"", {}, url, sent_s, time.monotonic())
        timeout = aiohttp.ClientTimeout(total=remaining_s, sock_connect=min(remaining_s, 2.0))
        try:
            async with session.request(
                method, url, data=body, headers=headers, allow_redirects=False, timeout=timeout
            ) as response:
                data = await response.read()
                status = response.status
                answer_headers = dict(response.headers)
        except aiohttp.ClientConnectorError:
            # connect() failed: nothing was sent
            return Answer(0, "refused", b"", {}, url, sent_s, time.monotonic())
        except TimeoutError:
            return Answer(0, "timeout", b"", {}, url, sent_s, time.monotonic())
        except (aiohttp.ClientError, OSError) as e:
            return Answer(0, "connection_lost", str(e).encode(), {}, url, sent_s, time.monotonic())
        location = answer_headers.get("Location")
        if follow and status in (307, 308) and location:
            url = location
            continue
        return Answer(status, "", data, answer_headers, url, sent_s, time.monotonic())
    return Answer(0, "redirect_loop", b"", {}, url, sent_s, time.monotonic())
