"""The operator's log: its level (LAMINAR_OPERATOR_LOG_LEVEL, the chart's logLevel), and
routine success kept quiet.

kopf logs "Timer 'refresh_topic_status' succeeded." at INFO each time a timer runs: every
3 s per Topic, 67 lines a second at 200 Topics. Those lines are demoted to DEBUG: they show
at level debug, and at info only what changed (a handler's outcome, a decision, a failure).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

LEVEL_ENV = "LAMINAR_OPERATOR_LOG_LEVEL"
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: The loggers the level applies to: kopf's, and the operator's own.
LOGGERS = ("kopf", "laminar_operator", "laminar")
#: kopf's per-object logger, where handler outcomes are logged.
OBJECTS_LOGGER = "kopf.objects"
ROUTINE = re.compile(r"^Timer '[^']*' succeeded\.$")


class RoutineSuccess(logging.Filter):
    """Demotes a timer's routine success to DEBUG (dropped unless DEBUG is enabled)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not ROUTINE.match(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def level_of(environ: Mapping[str, str]) -> int | None:
    """The level LEVEL_ENV names; None when unset (kopf's: info, or debug with its
    --verbose); a ValueError saying what is allowed."""
    name = (environ.get(LEVEL_ENV) or "").strip().lower()
    if not name:
        return None
    if name not in LEVELS:
        raise ValueError(f"{LEVEL_ENV}={name!r}: one of {', '.join(LEVELS)}")
    return LEVELS[name]


def configure(level: int | None) -> None:
    """Set the level of the operator's loggers (None: leave it), and keep routine success
    quiet (idempotent)."""
    if level is not None:
        for name in LOGGERS:
            logging.getLogger(name).setLevel(level)
    objects = logging.getLogger(OBJECTS_LOGGER)
    if not any(isinstance(f, RoutineSuccess) for f in objects.filters):
        objects.addFilter(RoutineSuccess())
