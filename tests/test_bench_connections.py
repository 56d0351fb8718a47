"""`laminar bench`'s client connections: one per append in flight, within what the brokers let
one client address hold (a broker refuses each connection over its cap: a connect and a 429
before the client learns the cap; bench/RESULTS.md, issue 22, thirty-first and thirty-second
sittings)."""

from __future__ import annotations

from laminar import settings
from laminar.bench import DEFAULT_CONNECTIONS, connections_for


def test_every_append_in_flight_gets_a_connection_up_to_the_brokers_caps() -> None:
    cap = settings.MAX_CONNECTIONS_PER_CLIENT.default
    assert connections_for(6, 64, 3) == 6 * 64 + 16  # the scale phase: nothing queues
    assert connections_for(6, 5, 1) == DEFAULT_CONNECTIONS  # never below the client's default
    assert connections_for(10_000, 1, 1) == cap  # one broker: its cap, not 10,016
    assert connections_for(3_000, 1, 3) == 3 * cap
