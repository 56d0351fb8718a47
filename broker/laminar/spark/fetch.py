"""The source's reads of one partition: answers received straight into reused buffers over one
HTTP/1.1 keep-alive connection, with the general client as the fallback.

On the bench's 1.12 GB (bench/RESULTS.md, issue 26) the general client (aiohttp: chunks of
256 KiB, joined into one `bytes` per answer, on an event loop in another thread) spent about
1.4-1.9 CPU seconds receiving what this receives in about 0.8: `recv_into` a buffer kept
from one read to the one after next, nothing joined or copied. Spark's Python workers share
the machine's cores with the JVM and the brokers, so that second is read speed.

Only the plain case takes this path: a 200 answer of stored batches with a Content-Length,
from the replica the general client would pick for the partition (`read_replicas`). Any other
answer (a redirect, 416 out of range, 503, an error, JSON) and any connection failure is
asked again through the general client (`AsyncClient.read_batches`), which follows
redirects, retries, fails over, and raises the errors the source handles; from then on the
range's reads all go that way.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import ssl
import threading
from types import TracebackType
from typing import NamedTuple
from urllib.parse import urlencode, urlsplit

import numpy as np

from ..client import Client
from ..client.client import read_replicas
from ..client.models import RawRead, ReadResult
from ..contract import (
    BATCH_TYPE,
    COMMIT_INDEX_HEADER,
    LOG_START_HEADER,
    NEXT_INDEX_HEADER,
    READ_RECORDS,
)
from ..tls import client_context

#: Free answer buffers kept for the next reads of this process (Spark reuses its Python
#: workers from task to task): a new one costs page faults on every byte.
MAX_FREE_BUFFERS = 4
_free: list[np.ndarray] = []
_free_lock = threading.Lock()


def _take_buffer(size: int) -> np.ndarray:
    """A free buffer of at least `size` bytes, else a new one (not zeroed: it is written
    before it is read)."""
    with _free_lock:
        for at, buffer in enumerate(_free):
            if buffer.nbytes >= size:
                return _free.pop(at)
    return np.empty(size, dtype=np.uint8)


def _give_back(buffer: np.ndarray) -> None:
    with _free_lock:
        if len(_free) < MAX_FREE_BUFFERS:
            _free.append(buffer)


class Answer(NamedTuple):
    """A binary read answer in a buffer of the fetcher's (`Fetcher.release` it once its
    rows are copied out), or the general client's answer (`buffer` None)."""

    read: RawRead | ReadResult
    buffer: np.ndarray | None = None


class _NotPlain(Exception):
    """The answer is not a plain 200 of stored batches: ask the general client."""


class Fetcher:
    """Reads of one topic partition, one at a time in a thread of its own (`submit`), so that
    the caller decodes one answer while the next arrives."""

    def __init__(
        self, client: Client, topic: str, partition: int, *, token: str | None,
        ca_file: str | None, wait_ms: int,
    ) -> None:  # fmt: skip
        self.client = client
        self.topic = topic
        self.partition = partition
        self.wait_ms = wait_ms
        self._headers = {"Accept": BATCH_TYPE, "Connection": "keep-alive"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._ca_file = ca_file
        self._connection: http.client.HTTPConnection | None = None
        self._plain = True  # False once an answer was not plain: the general client from then
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "laminar-spark-read")

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
        if self._connection is not None:
            self._connection.close()

    def submit(
        self, at: int, max_records: int, max_bytes: int
    ) -> concurrent.futures.Future[Answer]:
        """Read from index `at` (at most `max_records` records and about `max_bytes`)."""
        return self._thread.submit(self._read, at, max_records, max_bytes)

    def release(self, answer: Answer) -> None:
        """`answer`'s buffer may be filled again: nothing refers to its bytes any more."""
        if answer.buffer is not None:
            _give_back(answer.buffer)

    def _read(self, at: int, max_records: int, max_bytes: int) -> Answer:
        if self._plain:
            try:
                return self._plain_read(at, max_records, max_bytes)
            except (_NotPlain, OSError, http.client.HTTPException, ssl.SSLError, ValueError):
                self._plain = False
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
        read = self.client.run(
            self.client.async_client.read_batches(
                self.topic, self.partition, at, max_records=max_records, max_bytes=max_bytes,
                wait_ms=self.wait_ms,
            )
        )  # fmt: skip
        return Answer(read)

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is not None:
            return self._connection
        description = self.client.describe_topic(self.topic)
        state = description.partition(self.partition)
        if state is None:
            raise _NotPlain
        replicas = read_replicas(self.topic, self.partition, state, self.client.cluster().members)
        url = urlsplit(replicas[0] if replicas else state.leader_url or "")
        timeout_s = self.client.async_client.timeout_s + self.wait_ms / 1000
        if url.scheme == "https":
            context = client_context(self._ca_file)
            self._connection = http.client.HTTPSConnection(
                url.netloc, timeout=timeout_s, context=context
            )
        elif url.scheme == "http":
            self._connection = http.client.HTTPConnection(url.netloc, timeout=timeout_s)
        else:
            raise _NotPlain
        return self._connection

    def _plain_read(self, at: int, max_records: int, max_bytes: int) -> Answer:
        connection = self._connect()
        _, path = READ_RECORDS.at(topic=self.topic, partition=self.partition)
        query = {"from": at, "max_records": max_records, "max_bytes": max_bytes}
        if self.wait_ms:
            query["wait_ms"] = self.wait_ms
        connection.request("GET", f"{path}?{urlencode(query)}", headers=self._headers)
        response = connection.getresponse()
        length = response.getheader("Content-Length")
        if (
            response.status != 200
            or not (response.getheader("Content-Type") or "").startswith(BATCH_TYPE)
            or length is None
        ):
            response.read()
            raise _NotPlain
        size = int(length)
        buffer = _take_buffer(size)
        view = buffer.data[:size]
        got = 0
        while got < size:
            count = response.readinto(view[got:])
            if not count:
                raise http.client.IncompleteRead(bytes(view[:got]), size - got)
            got += count
        next_index = response.getheader(NEXT_INDEX_HEADER)
        read = RawRead(
            view,  # type: ignore[arg-type]  # (a buffer: decoded before it is filled again)
            None if next_index is None else int(next_index),
            int(response.getheader(COMMIT_INDEX_HEADER) or -1),
            int(response.getheader(LOG_START_HEADER) or 0),
        )
        return Answer(read, buffer)
