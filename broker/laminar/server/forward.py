"""Metadata writes taken by any broker: forwarded to the metadata leader, never redirected.

A 307 is not what a caller of an admin write should have to handle: Python's urllib and many
other HTTP clients do not follow one for a POST, and those that do drop the token on the way
to another host. So, as Kafka's brokers have forwarded admin requests to the controller since
KIP-590, the broker a metadata write reaches (topics, drains, weights, transactions) serves
it: the caller is authenticated and authorized there, and the handler runs there; only its
proposal travels. The command, encoded as the metadata log stores it
(`laminar.metadata.encode_command`), goes to the leader's `POST /v1/metadata/commands` under
the brokers' own principal (`Action.INTERNAL`, the internal token): the caller's token is
never sent on. The leader proposes it as if its own client had asked and answers the index
at which it applied it, or the error it would have answered the caller itself. The entry
broker then waits until it has applied that index too, so that what the handler answers
(built from this broker's state) is what the leader would have answered, and the caller's
next request here (read-your-writes: `Laminar-Metadata-Index`) sees its write.

Bounded: one hop (the leader's side proposes, never forwards: a broker that is no longer the
leader answers 503, nothing done, and the entry broker sends the write on to the next leader
once it knows it, within METADATA_WAIT_S: `Api._metadata`), the leader's answer awaited one
request timeout plus FORWARD_SLACK_S, the local apply at most METADATA_WAIT_S.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import aiohttp
import orjson
from aiohttp import ClientSession, ClientTimeout, web

from ..contract import JSON_TYPE, METADATA_WAIT_S, PROPOSE_METADATA
from ..metadata import Command, MetadataError, decode_proposal, encode_command
from ..models import ErrorBody, MetadataCommitted, ModelError
from ..partition.errors import NotLeader
from ..txn.coordinator import EndTxn
from .http import ApiError, json_response, outcome_unknown, unavailable
from .logs import REQUEST
from .request_context import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from .api import Api

log = logging.getLogger(__name__)

#: How much longer than its own request timeout the entry broker waits for the leader's
#: answer: the leader waits up to its request timeout for the commit and answers 504 then,
#: which the entry broker passes on rather than a timeout of its own.
FORWARD_SLACK_S = 2.0
#: Connecting to the leader: a leader that takes longer is as good as gone (503, retried).
CONNECT_TIMEOUT_S = 2.0
#: The leader's statuses passed on to the caller as they are: its refusals (400 invalid, 404
#: not_found, 409 exists or fenced, 413, 415) and its 503 (nothing done) and 504 (the outcome
#: unknown). Any other (401 or 403: the brokers disagree about their secret; a 500) is not
#: the caller's to act on.
PASSED_ON = frozenset({400, 404, 409, 413, 415, 503, 504})


class MetadataForwarder:
    """Both ends of a forwarded metadata write: `forward` at the broker that took it,
    `propose` (the route's handler) at the metadata leader."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._session: ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ---- at the metadata leader ------------------------------------------------------------

    async def propose(self, request: web.Request) -> web.Response:
        """`POST /v1/metadata/commands` (brokers only): propose the command here, as if this
        broker's own client had asked; never forwarded again."""
        api = self.api
        document = await api.json_body(request)
        try:
            command = decode_proposal(orjson.dumps(document))
        except MetadataError as e:
            raise ApiError(400, "bad_request", str(e)) from e
        try:
            index = await api.propose_here(command)
        except NotLeader as e:
            leader = f" (the leader is {e.leader})" if e.leader else ""
            raise unavailable(
                f"{api.broker.id} is not the metadata leader{leader}: a forwarded write is not "
                "forwarded again; retry"
            ) from e
        if isinstance(command, EndTxn):  # the markers are this broker's to write: now
            api.txns.driver.kick()
        return json_response(MetadataCommitted(index).to_json())

    # ---- at the broker that took the write -------------------------------------------------

    async def forward(self, command: Command, leader: str | None) -> int:
        """Have the metadata leader `leader` commit `command`: its index, once applied here
        too. ApiError: the leader's refusal, 503 (nothing done: no leader known, or it could
        not be reached), 504 (the outcome unknown)."""
        broker = self.api.broker
        address = broker.api_address_of(leader)
        if leader is None or address is None or leader == broker.id:
            raise unavailable("no leader known for the cluster metadata; retry shortly")
        url = broker.api_url(address) + PROPOSE_METADATA.url()
        status, body = await self._post(url, encode_command(command), leader)
        if status == 200:
            try:
                index = MetadataCommitted.from_json(orjson.loads(body)).index
            except (ValueError, ModelError) as e:
                raise outcome_unknown(
                    "outcome_unknown",
                    f"the metadata leader {leader} answered the forwarded write with {e}: it may "
                    "or may not be applied; look before repeating it",
                ) from e
            await self._applied(index, leader)
            return index
        raise self._error(status, body, leader)

    async def _post(self, url: str, body: bytes, leader: str) -> tuple[int, bytes]:
        """POST `body` to `url` as the brokers' own principal: (status, body)."""
        api = self.api
        if self._session is None:
            self._session = ClientSession()
        headers = {
            "Authorization": f"Bearer {api.auth.internal_token}",
            "Content-Type": JSON_TYPE,
        }
        context = REQUEST.get()
        if context is not None:  # the leader's log lines about it carry the caller's id
            headers[REQUEST_ID_HEADER] = context.request_id
        tls = api.broker.tls
        timeout = ClientTimeout(
            total=api.timeout_s + FORWARD_SLACK_S, sock_connect=CONNECT_TIMEOUT_S
        )
        try:
            async with self._session.post(
                url,
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                # the cluster's CA (the current bundle: a new context, new connections)
                ssl=True if tls is None else tls.client(),
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
            # not connected: nothing was sent
            raise unavailable(
                f"the metadata leader {leader} could not be reached ({e}); retry"
            ) from e
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise outcome_unknown(
                "timeout",
                f"the metadata leader {leader} did not answer the forwarded write "
                f"({type(e).__name__}: {e}); it may still be applied: look before repeating it",
            ) from e

    def _error(self, status: int, body: bytes, leader: str) -> ApiError:
        """The caller's answer to the leader's error answer `status`, `body`."""
        try:
            error = ErrorBody.from_json(orjson.loads(body))
        except (ValueError, ModelError):
            error = ErrorBody("unavailable", f"an answer that is not an API error: {body[:80]!r}")
        if status in PASSED_ON:
            headers = {"Retry-After": "1"} if status == 503 else None
            return ApiError(status, error.code, error.message, headers=headers)
        log.error(
            "the metadata leader %s refused a forwarded metadata write: %d %s",
            leader,
            status,
            error.message,
        )
        if status < 500:  # it did nothing
            return unavailable(
                f"the metadata leader {leader} refused the forwarded write ({status}: "
                f"{error.message}); retry"
            )
        return outcome_unknown(
            "outcome_unknown",
            f"the metadata leader {leader} answered the forwarded write {status} "
            f"({error.message}): it may or may not be applied; look before repeating it",
        )

    async def _applied(self, index: int, leader: str) -> None:
        """Wait until this broker has applied the metadata through `index` (committed by the
        leader): the handler then answers from state that has the write."""
        api = self.api
        wait_s = min(METADATA_WAIT_S, api.timeout_s)
        if not await api.broker.waits.metadata_applied(index, wait_s):
            raise outcome_unknown(
                "timeout",
                f"the metadata leader {leader} applied the change (metadata index {index}), "
                f"but {api.broker.id} has not caught up with it within {wait_s:g} s: look "
                "before repeating it",
            )
