"""`python -m laminar.sim --seed N` replays one seed; `--seeds A:B` runs [A, B).

The default scenario is the Raft fault mix (`laminar.sim.cluster`: Raft groups over the real
log). `--node` runs whole brokers' cores (`laminar.sim.node_cluster`: the `NodeCore` the
broker runs, with SWIM, placement, the metadata group and the partition status table inside:
joins, a drain, a weight change and a crash under every fault; `--workers N` gives each
broker N workers, `laminar.workers`, and has two brokers change their count); `--queue` runs the
shared-queue scenario (consumers acquiring, accepting, releasing, rejecting and crashing on
top of the fault mix). Exits non-zero if any seed violates an invariant, printing the seed,
its last events and its replay command.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import time
from dataclasses import replace

from .cluster import SCENARIO as RAFT_SCENARIO
from .cluster import InvariantViolation, SimConfig, run_seed
from .node_cluster import SCENARIO as NODE_SCENARIO
from .node_cluster import run_node_seed
from .queue_sim import SCENARIO as QUEUE_SCENARIO
from .queue_sim import run_queue_seed


def _run(args: tuple[int, SimConfig, str, int]) -> tuple[int, str | None, dict[str, int]]:
    seed, config, scenario, workers = args
    try:
        if scenario == "node":
            return seed, None, run_node_seed(seed, config, workers=workers)
        if scenario == "queue":
            return seed, None, run_queue_seed(seed, config)
        return seed, None, run_seed(seed, config)
    except InvariantViolation as e:
        return seed, str(e), {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m laminar.sim", description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run (replay) one seed and print its stats")
    which.add_argument("--seeds", help="a range A:B of seeds to run")
    parser.add_argument("--ticks", type=int, help="faulty ticks per run (default: the scenario's)")
    parser.add_argument("--jobs", type=int, default=1, help="processes to run seeds in")
    scenarios = parser.add_mutually_exclusive_group()
    scenarios.add_argument(
        "--node", action="store_true", help="run the node scenario (NodeCore; slower per seed)"
    )
    scenarios.add_argument("--queue", action="store_true", help="run the shared-queue scenario")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="with --node: workers per broker (more than 1: two brokers change their count)",
    )
    args = parser.parse_args(argv)
    if args.workers != 1 and not args.node:
        parser.error("--workers needs --node")
    # Recovery reports of torn tails are expected here: crashes are the point.
    logging.getLogger("laminar").setLevel(logging.CRITICAL)
    scenario = "node" if args.node else "queue" if args.queue else "raft"
    config = NODE_SCENARIO if args.node else QUEUE_SCENARIO if args.queue else RAFT_SCENARIO
    if args.ticks is not None:
        config = replace(config, ticks=args.ticks)
    if args.seed is not None:
        seeds = [args.seed]
    else:
        first, _, last = args.seeds.partition(":")
        seeds = list(range(int(first), int(last)))
    started = time.monotonic()
    failures = 0
    totals: dict[str, int] = {}
    work = [(seed, config, scenario, args.workers) for seed in seeds]
    if args.jobs > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            results = pool.imap(_run, work, chunksize=4)
            outcomes = list(results)
    else:
        outcomes = [_run(item) for item in work]
    for seed, failure, stats in outcomes:
        if failure is not None:
            failures += 1
            print(failure, file=sys.stderr)
        for key, value in stats.items():
            if key != "digest":
                totals[key] = totals.get(key, 0) + value
        if len(seeds) == 1 and failure is None:
            print(f"seed {seed}: ok {stats}")
        elif failure is None and args.node:
            print(f"seed {seed}: ok", flush=True)
    elapsed = time.monotonic() - started
    print(f"{len(seeds) - failures} passed, {failures} failed ({elapsed:.1f} s) totals {totals}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
