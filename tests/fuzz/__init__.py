"""Bounded fuzzing that runs in CI (docs/security.md, "Fuzzing"): the HTTP API under schemathesis
against a live cluster, and the binary decoders under Hypothesis.

Every run is derandomized (the same examples every time), so a failure replays as it is, and
bounded by a fixed number of examples per test. For a longer campaign locally,
`LAMINAR_FUZZ_EXAMPLES=N` runs N examples in every fuzz test instead (per operation for the
API), and `LAMINAR_FUZZ_RANDOM=1` draws new examples each run (a failure then prints the
`@reproduce_failure` blob that replays it)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: False under LAMINAR_FUZZ_RANDOM=1: every run draws other examples.
DERANDOMIZE = not os.environ.get("LAMINAR_FUZZ_RANDOM")


def fuzz_examples(ci_examples: int) -> int:
    """How many examples a fuzz test runs: `ci_examples`, unless LAMINAR_FUZZ_EXAMPLES says."""
    return max(1, int(os.environ.get("LAMINAR_FUZZ_EXAMPLES") or ci_examples))


def decoder_settings(ci_examples: int) -> settings:
    """Hypothesis settings of a binary decoder's fuzz test: `fuzz_examples(ci_examples)`
    examples, derandomized unless LAMINAR_FUZZ_RANDOM, no example database, no deadline."""
    return settings(
        max_examples=fuzz_examples(ci_examples),
        derandomize=DERANDOMIZE,
        print_blob=not DERANDOMIZE,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
