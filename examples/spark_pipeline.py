"""A streaming pipeline on Laminar: count each key's events in 10-second windows of a topic
and write the counts to another topic, as JSON values.

    laminar local-cluster up --detach          # or any cluster
    export LAMINAR_TOKEN_FILE=laminar-data/token   # `up` prints it (or: --token-file)
    python examples/spark_pipeline.py --brokers http://127.0.2.11:7070 \\
        --source events --sink event-counts --checkpoint /tmp/pipeline

Each output record: key = the event key, value = {"window_start", "window_end", "key", "count"},
written once per window and key when the window closes: when events 10 s (the watermark delay)
past its end have been seen (append mode; later events for a closed window are dropped).
--available-now processes what is there and stops; without it the query runs until Ctrl-C.
The checkpoint makes a restart continue where it stopped, and the sink's idempotent producer
keeps a retried micro-batch from writing twice.
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from laminar.spark import register

WINDOW = "10 seconds"
LATE = "10 seconds"  # the watermark delay: how late an event may come and still count


def counts(events: DataFrame) -> DataFrame:
    """Events (the laminar source's columns) -> per key and window counts, as sink rows."""
    windowed = (
        events.withWatermark("timestamp", LATE)
        .groupBy(F.window("timestamp", WINDOW), F.col("key"))
        .count()
    )
    value = F.to_json(
        F.struct(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            F.col("key").cast("string").alias("key"),
            F.col("count"),
        )
    )
    return windowed.select(F.col("key"), value.alias("value"))


def start(
    spark: SparkSession,
    brokers: str,
    source: str,
    sink: str,
    checkpoint: str,
    *,
    available_now: bool = False,
    token_file: str | None = None,
) -> object:
    """Start the query; returns Spark's StreamingQuery. The API token: `token_file`'s, else
    $LAMINAR_TOKEN, $LAMINAR_TOKEN_FILE or the current context's (read on the driver)."""
    register(spark)
    credentials = {"tokenFile": token_file} if token_file else {}
    events = (
        spark.readStream.format("laminar")
        .option("brokers", brokers)
        .options(**credentials)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
    )
    writer = (
        counts(events)
        .writeStream.format("laminar")
        .option("brokers", brokers)
        .options(**credentials)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
    )
    writer = writer.trigger(availableNow=True) if available_now else writer
    return writer.start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", required=True, help="comma-separated broker API URLs")
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--token-file", help="the API token (default: $LAMINAR_TOKEN_FILE, ...)")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("laminar-pipeline").getOrCreate()
    query = start(
        spark, args.brokers, args.source, args.sink, args.checkpoint,
        available_now=args.available_now, token_file=args.token_file,
    )  # fmt: skip
    query.awaitTermination()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
