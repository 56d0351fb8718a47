package dev.laminar.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;

/** A batch read: planned on the driver (Planner), read range by range on the executors. */
final class LaminarScan implements ScanBuilder, Scan, Batch {
  private final Options options;
  private final StructType schema;

  LaminarScan(Options options, StructType schema) {
    this.options = options.withCredentials(); // on the driver: the executors get the token
    this.schema = schema;
  }

  @Override
  public Scan build() {
    return this;
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    return "laminar-jvm " + options.subscribed();
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    return new Planner(options).plan().toArray(new InputPartition[0]);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new Factory(options.settings());
  }

  static final class Factory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final ReadSettings settings;

    Factory(ReadSettings settings) {
      this.settings = settings;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      return new RangeReader((RangePartition) partition, settings);
    }
  }
}
