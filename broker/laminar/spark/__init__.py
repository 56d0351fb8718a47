"""`laminar` for PySpark (>= 4.0; admission control and availableNow on >= 4.2).

    from laminar.spark import register
    register(spark)
    df = spark.read.format("laminar").option("brokers", "http://127.0.2.11:7070") \\
        .option("subscribe", "orders").load()

Options and columns are Spark's Kafka connector's (docs/spark.md maps each option): the source
gives `key`, `value` (binary), `topic`, `partition`, `offset`, `timestamp`, `timestampType`,
with includeHeaders `headers`, and `index` (Laminar's name of `offset`); the sink takes `value`
and optionally `key`, `headers`, `topic`, `partition`.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource

from .arrow import schema_ddl
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
        return schema_ddl(include)

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
