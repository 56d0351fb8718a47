"""`python -m laminar.sim --seed N` replays one seed; `--seeds A:B` runs [A, B).

Exits non-zero if any seed violates an invariant, printing the seed and its last events.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import time
from dataclasses import replace

from .cluster import InvariantViolation, SimConfig, run_seed


def _run(args: tuple[int, SimConfig]) -> tuple[int, str | None, dict[str, int]]:
    seed, config = args
    try:
        return seed, None, run_seed(seed, config)
    except InvariantViolation as e:
        return seed, str(e), {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m laminar.sim", description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run (replay) one seed and print its stats")
    which.add_argument("--seeds", help="a range A:B of seeds to run")
    parser.add_argument("--ticks", type=int, default=SimConfig.ticks, help="faulty ticks per run")
    parser.add_argument("--jobs", type=int, default=1, help="processes to run seeds in")
    args = parser.parse_args(argv)
    # Recovery reports of torn tails are expected here: crashes are the point.
    logging.getLogger("laminar.log").setLevel(logging.ERROR)
    config = replace(SimConfig(), ticks=args.ticks)
    if args.seed is not None:
        seeds = [args.seed]
    else:
        first, _, last = args.seeds.partition(":")
        seeds = list(range(int(first), int(last)))
    started = time.monotonic()
    failures = 0
    totals: dict[str, int] = {}
    work = [(seed, config) for seed in seeds]
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
    elapsed = time.monotonic() - started
    print(f"{len(seeds) - failures} passed, {failures} failed ({elapsed:.1f} s) totals {totals}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
