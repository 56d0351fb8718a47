"""Futures that answer a waiter who may have given up on them (an HTTP request whose timeout
passed): a failure set on one counts as retrieved at once, so asyncio never reports it as
"Future exception was never retrieved"; a waiter still awaiting it gets the exception as usual.
"""

from __future__ import annotations

import asyncio
from typing import Any


def answer_future(loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    future = loop.create_future()
    future.add_done_callback(_retrieve)
    return future


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
