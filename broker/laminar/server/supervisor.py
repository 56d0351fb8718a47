"""`laminar serve --workers N` with N > 1: start the broker's N workers and keep them running.

Each worker is `laminar serve` again, with the same arguments and `--worker-index w`
(docs/workers.md). A worker that exits is started again after a pause that doubles from
RESTART_MIN_S to RESTART_MAX_S while it keeps failing within STARTUP_S of its start; one
that failed MAX_QUICK_FAILURES times in a row that way stops the broker (exit 1: a port in
use, a damaged disk; its output says why). SIGTERM and SIGINT are passed on to every worker,
which stops gracefully (hands its leaderships over); the supervisor exits once all have, 0
if all exited 0. SIGHUP is passed on as well: each worker re-reads the credentials and TLS
files. The workers get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG). Their
process ids are in `<data dir>/workers.json`, for tools and tests. With `--steer-port`, it
holds the steer port's sockets (`laminar.server.steering`) and hands worker w the w-th, as
the file descriptor LAMINAR_STEER_FD names.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from . import logs, steering, tracing
from .config import BrokerConfig

log = logging.getLogger(__name__)

RESTART_MIN_S = 0.5
RESTART_MAX_S = 30.0
#: a worker that exits sooner than this after its start failed to start
STARTUP_S = 10.0
MAX_QUICK_FAILURES = 5
POLL_S = 0.05
PR_SET_PDEATHSIG = 1
PIDS_FILE = "workers.json"
#: a worker's socket of the steer port's group: the file descriptor it inherits
STEER_FD_VARIABLE = "LAMINAR_STEER_FD"
STEER_BACKLOG = 1024


def _die_with_parent() -> None:  # (runs in the child, before exec)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Worker:
    def __init__(
        self, index: int, command: list[str], steered: socket.socket | None = None
    ) -> None:
        self.index = index
        self.command = command
        #: its socket of the steer port's group (`laminar.server.steering`), if any
        self.steered = steered
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restart_at: float | None = 0.0  # start now
        self.pause_s = RESTART_MIN_S
        self.quick_failures = 0

    def start(self) -> None:
        env: dict[str, str] | None = None
        fds: tuple[int, ...] = ()
        if self.steered is not None:
            fds = (self.steered.fileno(),)
            env = dict(os.environ, **{STEER_FD_VARIABLE: str(fds[0])})
        self.process = subprocess.Popen(
            self.command, preexec_fn=_die_with_parent, pass_fds=fds, env=env
        )
        self.started_at = time.monotonic()
        self.restart_at = None

    def exited(self, code: int, now: float) -> None:
        """The worker exited with `code` (not asked to): plan its restart."""
        if now - self.started_at < STARTUP_S:
            self.quick_failures += 1
            self.pause_s = min(RESTART_MAX_S, self.pause_s * 2)
        else:
            self.quick_failures = 0
            self.pause_s = RESTART_MIN_S
        log.warning(
            "worker %d exited with %d; starting it again in %.1f s", self.index, code, self.pause_s
        )
        self.process = None
        self.restart_at = now + self.pause_s


def worker_command(argv: list[str], workers: int, index: int) -> list[str]:
    """`laminar serve` as worker `index` of `workers` (the later flags win)."""
    return [
        sys.executable,
        "-m",
        "laminar",
        *argv,
        "--workers",
        str(workers),
        "--worker-index",
        str(index),
    ]


def supervise(config: BrokerConfig, argv: list[str]) -> int:
    """Run the workers until SIGTERM or SIGINT (or one cannot start); the exit status. The
    workers log as the supervisor does: they get its arguments (--log-level, --log-format)."""
    logs.configure(config.log_level, config.log_format, config.node_id)
    if config.otel_endpoint is not None and (problem := tracing.missing_packages()):
        log.critical("laminar serve: %s", problem)  # (each worker would fail so, again and again)
        return 1
    steered: list[socket.socket | None] = [None] * config.workers
    if config.steer_port:
        try:
            sockets, mechanism = steering.listen(
                config.host,
                config.steer_port,
                config.workers,
                STEER_BACKLOG,
                pin_dir=config.xdp_pin_dir,  # (where `laminar-xdp load` pins the program)
            )
        except steering.SteeringError as e:
            log.critical("laminar serve: %s", e)
            return 1
        steered = list(sockets)
        log.info(
            "steer port %d: %s",
            config.steer_port,
            f"connections go to worker (source port mod workers), by the {mechanism} program"
            if mechanism
            else "the kernel refused both programs; connections spread by hash",
        )
    workers = [
        Worker(w, worker_command(argv, config.workers, w), steered[w])
        for w in range(config.workers)
    ]
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)

    def reload(signum: int, frame: FrameType | None) -> None:
        """SIGHUP (re-read the credentials and TLS files: server/app.py): to every worker."""
        for worker in workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGHUP)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    signal.signal(signal.SIGHUP, reload)
    pids_file = config.data_dir / PIDS_FILE
    status = 0
    while True:
        now = time.monotonic()
        changed = False
        for worker in workers:
            process = worker.process
            if process is not None and (code := process.poll()) is not None:
                changed = True
                if stopping:
                    worker.process = None
                    status = status or int(code != 0)
                    continue
                worker.exited(code, now)
                if worker.quick_failures >= MAX_QUICK_FAILURES:
                    log.critical(
                        "worker %d failed to start %d times in a row; stopping the broker",
                        worker.index,
                        worker.quick_failures,
                    )
                    stop(signal.SIGTERM, None)
                    status = 1
            if not stopping and worker.restart_at is not None and worker.restart_at <= now:
                worker.start()
                changed = True
        if changed:
            _write_pids(pids_file, workers)
        if stopping and all(w.process is None for w in workers):
            break
        time.sleep(POLL_S)
    pids_file.unlink(missing_ok=True)
    return status


def _write_pids(path: Path, workers: list[Worker]) -> None:
    pids = {str(w.index): w.process.pid for w in workers if w.process is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"supervisor": os.getpid(), "workers": pids}))
    temporary.replace(path)
