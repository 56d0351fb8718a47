"""Running a piece of a test as another uid: what an unprivileged broker may do."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def in_a_child_as(uid: int, work: Callable[[], object]) -> object:
    """`work()` in a forked child that dropped to `uid` (and so every capability)."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            answer = json.dumps(work())
        except BaseException as e:
            answer = json.dumps(f"{type(e).__name__}: {e}")
        os.write(writing, answer.encode())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return json.loads(out)
