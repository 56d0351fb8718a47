"""The broker's own log lines (its diagnostics; the commit log is laminar.log): the level and
format `--log-level` and `--log-format` choose, and the request context that every line
logged while an API request is served carries (its request id, topic and partition; set by
laminar.server.request_context).

Text lines are as they have always been (time, node, level, message), with the request id
appended when there is one. JSON lines are one object per line (docs/logging.md): `ts`,
`level`, `logger`, `message`, `node`, then `worker`, `request_id`, `topic`, `partition` and
`exception` when known. The context is a contextvar, so a line logged by any code the
request runs (on its task) carries it; a worker thread does not inherit it.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from enum import StrEnum
from typing import Any, NamedTuple, TextIO

import orjson


class LogLevel(StrEnum):
    """The lowest level of the lines the broker's own loggers write (`--log-level`)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def number(self) -> int:
        """The `logging` module's number for this level."""
        return int(logging.getLevelName(self.value.upper()))


class LogFormat(StrEnum):
    """How a log line is written (`--log-format`)."""

    #: `<time> <node> <LEVEL> <message>[ request_id=<id>]`, for people
    TEXT = "text"
    #: one JSON object per line, for log collectors
    JSON = "json"


#: Libraries (aiohttp, asyncio, OpenTelemetry) log at this level and above even with
#: `--log-level debug`: their debug lines are about their internals, and many.
LIBRARY_MIN_LEVEL = logging.INFO
#: The loggers `--log-level` sets: the broker's own.
BROKER_LOGGER = "laminar"
#: The text format's line, without the request id (as the broker's lines always were).
TEXT_FORMAT = "%(asctime)s {node} %(levelname)s %(message)s"


class RequestContext(NamedTuple):
    """What the API request being served is: its id, and its topic and partition when its
    route names them. (A tuple: one is made per request, a frozen dataclass costs several
    times as much.)"""

    request_id: str
    topic: str | None = None
    partition: int | None = None


#: The request whose serving the current task is part of (None: none).
REQUEST: ContextVar[RequestContext | None] = ContextVar("laminar_request", default=None)


def rfc3339_ms(seconds: float) -> str:
    """`seconds` since the epoch as RFC 3339 UTC with milliseconds
    (`2025-01-31T12:00:00.123Z`)."""
    whole = int(seconds)
    millis = int((seconds - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON (no newline in it: a traceback's are escaped)."""

    def __init__(self, node: str, worker: int | None = None) -> None:
        super().__init__()
        self.node = node
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": rfc3339_ms(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "node": self.node,
        }
        if self.worker is not None:
            line["worker"] = self.worker
        context = REQUEST.get()
        if context is not None:
            line["request_id"] = context.request_id
            if context.topic is not None:
                line["topic"] = context.topic
            if context.partition is not None:
                line["partition"] = context.partition
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # (a message that is not valid text, such as a lone surrogate, still makes a line)
        return orjson.dumps(line, default=str).decode("utf-8", "replace")


class TextFormatter(logging.Formatter):
    """The broker's text line, with ` request_id=<id>` after the message while a request is
    served (before any traceback)."""

    def __init__(self, node: str) -> None:
        super().__init__(TEXT_FORMAT.format(node=node.replace("%", "%%")))

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        context = REQUEST.get()
        if context is None:
            return text
        return f"{text} request_id={context.request_id}"


def formatter(log_format: LogFormat, node: str, worker: int | None = None) -> logging.Formatter:
    """The formatter of `log_format` for the lines of `node` (and its `worker`)."""
    if log_format is LogFormat.JSON:
        return JsonFormatter(node, worker)
    return TextFormatter(node)


def configure(
    level: LogLevel,
    log_format: LogFormat,
    node: str,
    worker: int | None = None,
    stream: TextIO | None = None,
) -> None:
    """Send every log line of this process to `stream` (default stderr) in `log_format`: the
    broker's own at `level` and above, the libraries' at `level` or LIBRARY_MIN_LEVEL,
    whichever is higher; Python's warnings become log lines too (so that, in JSON, every
    line of the process's output is one)."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter(log_format, node, worker))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(level.number, LIBRARY_MIN_LEVEL))
    logging.getLogger(BROKER_LOGGER).setLevel(level.number)
    logging.captureWarnings(True)
