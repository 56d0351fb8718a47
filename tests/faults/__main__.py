"""`python -m tests.faults`: one seeded run (or rounds of runs for `--duration-s`), a JSON
summary on stdout, exit status 1 on any violation (docs/reliability.md, "The fault-injection
suite")."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from .net import missing_tools
from .runner import RunConfig, run, say
from .schedule import KINDS, parse_kinds

EXIT_VIOLATIONS = 1
EXIT_CANNOT_RUN = 2
EXIT_HARNESS = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--brokers", type=int, default=3, choices=range(3, 8))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--faults", default="mixed", help=f"mixed, or a comma-separated list of {', '.join(KINDS)}"
    )
    parser.add_argument(
        "--fault-count", type=int, default=0, help="faults per run (default: one of each kind)"
    )
    parser.add_argument(
        "--duration-s", type=float, default=0,
        help="keep running rounds (seed, seed + 1, ...) until this much time has passed or a "
        "round fails",
    )  # fmt: skip
    parser.add_argument("--run-dir", type=Path, help="logs and summary.json (default: a temp dir)")
    parser.add_argument("--json-out", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    reason = missing_tools()
    if reason:
        print(json.dumps({"ok": None, "skipped": reason}))
        return EXIT_CANNOT_RUN
    kinds = parse_kinds(args.faults)
    count = args.fault_count or len(kinds)
    root = args.run_dir or Path(tempfile.mkdtemp(prefix="laminar-faults-"))
    deadline = time.monotonic() + args.duration_s
    rounds = []
    seed = args.seed
    while True:
        config = RunConfig(args.brokers, seed, args.faults, count, root / f"seed-{seed}")
        summary = run(config)
        rounds.append(summary)
        say(f"seed {seed}: {'ok' if summary['ok'] else 'VIOLATIONS'} in {summary['took_s']} s")
        if not summary["ok"] or time.monotonic() >= deadline:
            break
        seed += 1
    result = rounds[0] if len(rounds) == 1 else {
        "ok": all(r["ok"] for r in rounds),
        "rounds": len(rounds),
        "per_round": [
            {"seed": r["seed"], "ok": r["ok"], "took_s": r["took_s"],
             "violations": r["violations"]["by_kind"]}
            for r in rounds
        ],
        "failed": [r for r in rounds if not r["ok"]],
        "unavailability_s_by_kind": _merge([r["unavailability_s_by_kind"] for r in rounds]),
        "replay": rounds[-1]["replay"],
    }  # fmt: skip
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text)
    last = rounds[-1]
    if not last["ok"]:
        say(f"violations: {last['violations']['by_kind']}; seed {last['seed']}")
        say(f"replay: {last['replay']}")
        return EXIT_VIOLATIONS
    if any(r["harness_problems"] for r in rounds):
        say("the harness could not inject every fault as asked: see harness_problems")
        return EXIT_HARNESS
    return 0


def _merge(items: list[dict[str, list[float | str]]]) -> dict[str, list[float | str]]:
    merged: dict[str, list[float | str]] = {}
    for item in items:
        for kind, values in item.items():
            merged.setdefault(kind, []).extend(values)
    return merged


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        say(f"interrupted ({e}); namespaces, mounts and brokers removed")
        sys.exit(130)
