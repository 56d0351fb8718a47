package dev.laminar.spark;

import org.apache.spark.sql.types.StructType;

/** The source's columns: the Kafka connector's in its order, then `index` (laminar/spark/arrow.py). */
final class Schema {
  static final String DDL =
      "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
          + "timestampType int";
  static final String HEADERS_DDL = "headers array<struct<key:string,value:binary>>";
  static final String INDEX_DDL = "index long";

  private Schema() {}

  static StructType of(boolean includeHeaders) {
    return StructType.fromDDL(
        DDL + ", " + (includeHeaders ? HEADERS_DDL + ", " : "") + INDEX_DDL);
  }
}
