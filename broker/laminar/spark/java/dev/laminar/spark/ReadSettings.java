package dev.laminar.spark;

import java.io.Serializable;
import java.util.List;

/**
 * What every executor's reads need, resolved on the driver: the brokers, the credentials (the
 * token itself, not where it came from) and the row options.
 */
final class ReadSettings implements Serializable {
  private static final long serialVersionUID = 1L;

  final List<String> brokers;
  final String token; // null: requests go without one
  final String caFile; // null: the JVM's default trust store
  final boolean includeHeaders;
  final boolean failOnDataLoss;
  final long requestTimeoutMs;

  ReadSettings(
      List<String> brokers, String token, String caFile, boolean includeHeaders,
      boolean failOnDataLoss, long requestTimeoutMs) {
    this.brokers = List.copyOf(brokers);
    this.token = token;
    this.caFile = caFile;
    this.includeHeaders = includeHeaders;
    this.failOnDataLoss = failOnDataLoss;
    this.requestTimeoutMs = requestTimeoutMs;
  }
}
