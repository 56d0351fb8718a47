"""Appends answered without a task (issue 22): the HTTP/1.1 fast path's `NowHandler`
(laminar.server.h1) for `POST /v1/topics/{topic}/partitions/{partition}/records`.

With one record per request, the coroutines around an append (the fast path's `_serve`, both
middlewares, `Api.append` and the wait for its commit), its task and its `web.Response` held
about a fifth of a broker's event loop (bench/RESULTS.md, issue 22, ninth sitting). The
common append needs none of them: all it does before its proposal is synchronous, and then it
waits for its commit only. `AppendNow` does what the middlewares and `Api.append` do on the
way to the proposal, proposes, and answers from a callback on the commit's outcome
(`Deadlines.watch`, with the same timeout).

It takes only an append whose answer is the one `Api.append` would give, and leaves any other
one to it, untouched, before anything is proposed: every refusal (authentication, the topic
or partition, a leader elsewhere, overload, a bad or compressed-and-large batch, a duplicate's
sequence conflict, ...), a transactional or control batch, a client's metadata index that
this broker has not applied yet, and every request while tracing is on or the request log is
at debug (their spans and lines are the middlewares'). From its proposal on it answers the
outcome as `Api.append` does: the base index, or the same 503 and 504 errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, cast

import orjson
from aiohttp import web

from ..contract import BATCH_TYPE, JSON_TYPE, METADATA_INDEX_HEADER, TOPIC_NAME
from ..log.batch import BatchHeader, parse_header, verify_batch
from ..models import AppendResult
from ..partition.errors import CommitLost, CommitUnknown, ReplicaClosed
from ..partition.replica import Replica
from . import request_context, tracing
from .h1 import FastRequest
from .http import internal, unavailable
from .logs import REQUEST, RequestContext
from .request_context import PARTITION, REQUEST_ID_HEADER, request_id

if TYPE_CHECKING:
    from .api import Api

log = logging.getLogger(__name__)

#: the head of an append's answer before its metadata index and request id (as `json_response`
#: and the middlewares make it)
_OK_HEAD = "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"


class AppendNow:
    """The `NowHandler` of appends, for `api`."""

    def __init__(self, api: Api, inline_bytes: int) -> None:
        self.api = api
        #: a compressed batch or a JSON body larger than this is decoded in a worker thread:
        #: `Api.append` takes it
        self.inline_bytes = inline_bytes

    def __call__(self, request: FastRequest, body: bytes) -> bool:
        if tracing.ENABLED or request_context.log.isEnabledFor(logging.DEBUG):
            return False
        started = time.perf_counter()
        api = self.api
        core = api.broker.core
        headers = request.headers
        seen = headers.get(METADATA_INDEX_HEADER)
        if seen is not None and not (
            seen.isascii()
            and seen.isdigit()
            and len(seen) <= 19
            and int(seen) <= core.meta_applied_index
        ):
            return False
        match = request.match_info
        topic, text = match["topic"], match["partition"]
        if not (TOPIC_NAME.fullmatch(topic) and PARTITION.fullmatch(text)):
            return False
        partition = int(text)
        known = core.state.topics.get(topic)
        if known is None or partition >= known.partitions:
            return False
        replica = core.replica(topic, partition)
        if replica is None or not replica.is_leader:
            return False
        if replica.pending_bytes + len(body) > replica.max_pending_bytes:
            return False
        as_web = cast(web.Request, request)  # (what these use of it, a FastRequest has)
        try:
            api.auth.authorize(as_web)
            api.check_body_headers(as_web)
            taken = self._batch(request.content_type, body, replica)
        except Exception:  # whatever it is, Api.append answers it
            return False
        if taken is None:
            return False
        batch, header, digest = taken
        if header.is_control or header.is_transactional:
            return False
        rid = request_id(headers.get(REQUEST_ID_HEADER))
        # the log context, as the middleware sets it: for lines logged while proposing, and
        # for the answer's callback (which runs in the context it was added in)
        context = REQUEST.set(RequestContext(rid, topic, partition))
        try:
            try:
                future, duplicate = replica.propose(batch, header, digest)
            except Exception:  # nothing was proposed: Api.append answers it
                return False
            # proposed: from here on this request is answered here, whatever happens
            api.broker.wake()
            answer = partial(
                self._answer, request, rid, started, topic, header.record_count, len(body),
                duplicate,
            )  # fmt: skip
            api.commits.watch(future).add_done_callback(answer)
            return True
        finally:
            REQUEST.reset(context)

    def _batch(
        self, content_type: str, body: bytes, replica: Replica
    ) -> tuple[bytes, BatchHeader, int | None] | None:
        """The batch of an append's `body`, verified, with its header and (a binary body's)
        payload digest; None when `Api.append` has to decode it in a worker thread, or answer
        that it is too large."""
        limit = replica.log.config.batch_limit_bytes
        if content_type == BATCH_TYPE:
            if len(body) > self.inline_bytes and parse_header(body).is_compressed:
                return None
            header, digest = verify_batch(body, limit)
            return body, header, digest
        if content_type == JSON_TYPE and len(body) <= self.inline_bytes:
            batch = self.api.json_batch(body)
            return (batch, parse_header(batch), None) if len(batch) <= limit else None
        return None

    def _answer(
        self,
        request: FastRequest,
        rid: str,
        started: float,
        topic: str,
        records: int,
        size: int,
        duplicate: bool,
        outcome: asyncio.Future[int],
    ) -> None:
        """Answer the append once its commit's `outcome` is known. A fault while answering (a
        bug) is answered 500, not left to the connection's idle timeout."""
        api = self.api
        try:
            base = outcome.result()
        except (TimeoutError, CommitUnknown, CommitLost) as e:
            error = api.commit_error(e)
        except ReplicaClosed as e:
            error = unavailable(f"{e}; retry")
        except Exception:
            log.exception("request %s: an append's commit failed unexpectedly", rid)
            error = internal()
        else:
            try:
                api.metrics.append_latency.observe(time.perf_counter() - started)
                api.metrics.appended(topic, records, size)
                api.count_request(cast(web.Request, request), 200)
                body = orjson.dumps(AppendResult(base, records, duplicate).to_json())
                index = api.broker.core.meta_applied_index
                head = (
                    f"{_OK_HEAD}{METADATA_INDEX_HEADER}: {index}\r\n{REQUEST_ID_HEADER}: {rid}\r\n"
                )
                request.answer((head, body))
                return
            except Exception:
                log.exception("request %s: answering an append failed", rid)
                error = internal()  # (not sent if the answer went out before the fault)
        response = api.error_response(cast(web.Request, request), error)
        response.headers[REQUEST_ID_HEADER] = rid
        request.answer(response)
