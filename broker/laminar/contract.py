"""What the HTTP API's two ends agree on (docs/api.md), declared once and imported by the
broker's server and by the client.

`METADATA_INDEX_HEADER`: read-your-writes for cluster metadata. Every `/v1` answer carries the
index up to which the answering broker has applied the cluster metadata (topics, members'
weights and drains: the `__cluster` Raft group). A client sends back the highest index it has
seen; a broker behind it waits (up to `METADATA_WAIT_S`) until it has applied that far before
it serves the request, or answers 503 (nothing done; another broker may be ahead). So a
client that changed the metadata, on any broker, reads its change back from every broker.
"""

from __future__ import annotations

METADATA_INDEX_HEADER = "Laminar-Metadata-Index"
#: How long a broker behind a client's metadata index waits for it before answering 503.
METADATA_WAIT_S = 5.0
#: The header's value: a Raft index, ASCII digits, below 2**63.
MAX_METADATA_INDEX = 2**63 - 1
