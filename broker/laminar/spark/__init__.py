"""`laminar` for PySpark (>= 4.0; admission control and availableNow on >= 4.2).

    from laminar.spark import register
    register(spark)
    df = spark.read.format("laminar").option("brokers", "http://127.0.2.11:7070") \\
        .option("topic", "orders").load()

Options and columns mirror Spark's Kafka connector (docs/spark.md): the source gives `key`,
`value` (binary), `topic`, `partition`, `index`, `timestamp` and, with includeHeaders,
`headers`; the sink takes `value` and optionally `key`, `headers`, `topic`, `partition`.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource

from .arrow import HEADERS_DDL, SCHEMA_DDL
from .options import Options
from .sink import BatchWriter, StreamWriter
from .source import BatchReader, DataLossError, StreamReader

NAME = "laminar"


class LaminarDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return f"{SCHEMA_DDL}, {HEADERS_DDL}" if include else SCHEMA_DDL

    def reader(self, schema: Any) -> BatchReader:
        return BatchReader(Options.parse(self.options, stream=False).with_credentials())

    def streamReader(self, schema: Any) -> StreamReader:
        return StreamReader(Options.parse(self.options, stream=True).with_credentials())

    def writer(self, schema: Any, overwrite: bool) -> BatchWriter:
        return BatchWriter(Options.parse(self.options, stream=False, sink=True).with_credentials())

    def streamWriter(self, schema: Any, overwrite: bool) -> StreamWriter:
        return StreamWriter(Options.parse(self.options, stream=True, sink=True).with_credentials())


def register(spark: SparkSession) -> None:
    """Make `format("laminar")` known to this session."""
    spark.dataSource.register(LaminarDataSource)


__all__ = ["NAME", "DataLossError", "LaminarDataSource", "register"]
