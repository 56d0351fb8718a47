"""What the end-to-end tests run inside the cluster, in a client pod of the broker image (it
carries the Python client): ``kubectl exec -i <pod> -- python3 - <command> ...`` with this file
on stdin. Every line it prints is one JSON object, the last {"lines": N} (how many came
before it), and with $E2E_OUT set they are written to that file too. https:// brokers are
verified with the CA file $LAMINAR_CA_FILE names.

    produce BROKERS TOPIC PREFIX MAX_RECORDS MAX_S STOP_FILE
        Sends PREFIX-0, PREFIX-1, ... with the idempotent Producer, paced, until STOP_FILE
        exists, MAX_RECORDS were sent or MAX_S passed. Prints {"value", "partition", "index"}
        for every record acknowledged and {"error"} for every one that failed, then
        {"sent", "acknowledged", "errors"}.
    read BROKERS TOPIC [THROUGH]
        Prints {"partition", "index", "value"} for every committed record of every partition,
        through the commit index the replica read first reports and through THROUGH's index
        of the partition (JSON {partition: index}: what was acknowledged there). A replica's
        commit index may lag the leader's (a follower serves reads up to its own, docs/api.md),
        so the records past it are awaited with long polls, for up to READ_MAX_S.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import Future

from laminar.client import Client, RecordMetadata

PACE_S = 0.01  # between sends: a few thousand records span a fault
#: The cluster's CA for https:// brokers (the client pod mounts the Secret <cluster>-ca)
CA_FILE = os.environ.get("LAMINAR_CA_FILE") or None
READ_BATCH = 1000
READ_MAX_S = 120.0  # for a partition's acknowledged records to be committed where it is read
READ_WAIT_MS = 1000


#: Every line is also written here (env E2E_OUT): `kubectl exec` can cut the end of a
#: command's output and still exit 0 (kubernetes/kubernetes#124571), so the test checks the
#: last line, {"lines": N} (how many came before it), and reads this file when it is missing.
OUT_FILE = open(os.environ["E2E_OUT"], "w") if os.environ.get("E2E_OUT") else None  # noqa: SIM115
emitted = 0


def emit(**fields: object) -> None:
    global emitted
    line = json.dumps(fields)
    print(line, flush=True)
    if OUT_FILE is not None:
        OUT_FILE.write(line + "\n")
    emitted += 1


def produce(
    brokers: str, topic: str, prefix: str, max_records: int, max_s: float, stop_file: str
) -> None:
    deadline = time.monotonic() + max_s
    sent: list[tuple[str, Future[RecordMetadata]]] = []
    with (
        Client(brokers.split(","), ca_file=CA_FILE) as client,
        client.producer(topic, linger_ms=2) as producer,
    ):
        while len(sent) < max_records and time.monotonic() < deadline:
            if os.path.exists(stop_file):
                break
            value = f"{prefix}-{len(sent)}"
            sent.append((value, producer.send(value.encode())))
            time.sleep(PACE_S)
        producer.flush()
    acknowledged = errors = 0
    for value, future in sent:
        try:
            where = future.result(timeout=0)
        except Exception as e:  # the test reports every error by name
            errors += 1
            emit(value=value, error=f"{type(e).__name__}: {e}")
        else:
            acknowledged += 1
            emit(value=value, partition=where.partition, index=where.index)
    emit(sent=len(sent), acknowledged=acknowledged, errors=errors)


def read(brokers: str, topic: str, through: str = "{}") -> None:
    acknowledged = {int(p): int(index) for p, index in json.loads(through).items()}
    deadline = time.monotonic() + READ_MAX_S
    with Client(brokers.split(","), ca_file=CA_FILE) as client:
        for partition in range(client.partition_count(topic)):
            start = client.read(topic, partition, max_records=1)
            at = start.log_start
            end = max(start.commit_index, acknowledged.get(partition, -1))
            while at <= end:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{topic}/{partition}: index {at} not committed in {READ_MAX_S} s "
                        f"(reading through {end})"
                    )
                got = client.read(topic, partition, at, max_records=READ_BATCH,
                                  wait_ms=READ_WAIT_MS)  # fmt: skip
                for record in got.records:
                    value = record.value.decode() if record.value is not None else None
                    emit(partition=partition, index=record.index, value=value)
                if got.next_index < at:
                    raise RuntimeError(f"{topic}/{partition}: read at {at} went back")
                at = got.next_index


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "produce":
        brokers, topic, prefix, max_records, max_s, stop_file = args
        produce(brokers, topic, prefix, int(max_records), float(max_s), stop_file)
    elif command == "read":
        read(*args)
    else:
        sys.exit(f"unknown command {command!r}")
    emit(lines=emitted)  # the end: a reader that lacks it, or some lines, got a cut copy
    if OUT_FILE is not None:
        OUT_FILE.close()


if __name__ == "__main__":
    main()
