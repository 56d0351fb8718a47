package dev.laminar.spark;

/** Records of a range were removed (retention) before they were read (failOnDataLoss). */
public final class DataLossException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  DataLossException(String message) {
    super(message);
  }
}
