package dev.laminar.spark;

import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("laminar-jvm")}: batch reads of Laminar topics in the JVM, with the
 * options and columns of the Python {@code laminar} source (docs/spark.md). Rows are made in
 * the executors' JVMs straight from the brokers' answers, with no Python worker between.
 */
public final class LaminarSource implements TableProvider, DataSourceRegister {
  public static final String NAME = "laminar-jvm";

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return Schema.of(Options.flag(options, "includeHeaders", false));
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new LaminarTable(schema, new CaseInsensitiveStringMap(properties));
  }

  static final class LaminarTable implements Table, SupportsRead {
    private final StructType schema;
    private final CaseInsensitiveStringMap options;

    LaminarTable(StructType schema, CaseInsensitiveStringMap options) {
      this.schema = schema;
      this.options = options;
    }

    @Override
    public String name() {
      return NAME;
    }

    @Override
    @SuppressWarnings("deprecation") // (Spark 4 still calls it; columns() derives from it)
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return Set.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap scanOptions) {
      return new LaminarScan(Options.parse(scanOptions.isEmpty() ? options : scanOptions), schema);
    }
  }
}
