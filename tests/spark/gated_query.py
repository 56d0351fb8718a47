"""A streaming query run in a process of its own by test_spark's kill test:

    python gated_query.py BROKERS TOKEN_FILE SOURCE SINK CHECKPOINT GATE

reads topic SOURCE from the start into topic SINK with the laminar sink (availableNow), and
holds the rows of SOURCE's partition 1 until the file GATE exists (at most GATE_WAIT_S): the
task of partition 0 then writes its share of the batch while the other waits, and the test
kills the process with the batch half written.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql.functions import udf

from laminar.spark import register

#: longer than test_spark waits for partition 0's share (WRITTEN_WAIT_S): a gate that opened
#: on its own would let the batch commit, and the test would see a whole batch
GATE_WAIT_S = 600.0
QUERY_TIMEOUT_S = 600


def main(brokers: str, token_file: str, source: str, sink: str, checkpoint: str, gate: str) -> int:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("laminar-gated-query")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    register(spark)

    @udf("binary")
    def gated(partition: int, value: bytes) -> bytes:
        if partition == 1:
            deadline = time.monotonic() + GATE_WAIT_S
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        return value

    query = (
        spark.readStream.format("laminar")
        .option("brokers", brokers)
        .option("tokenFile", token_file)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", gated("partition", "value").alias("value"))
        .writeStream.format("laminar")
        .option("brokers", brokers)
        .option("tokenFile", token_file)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=QUERY_TIMEOUT_S)
    failed = query.exception()
    spark.stop()
    if failed is not None:
        print(failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
