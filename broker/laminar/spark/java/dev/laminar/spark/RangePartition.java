package dev.laminar.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One Spark input partition: records low <= index < high of one topic partition, and the API
 * URLs of the replicas that may serve it, best first (planned on the driver, shipped to an
 * executor).
 */
final class RangePartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final String topic;
  final int partition;
  final long low;
  final long high;
  final String[] replicaUrls;

  RangePartition(String topic, int partition, long low, long high, String[] replicaUrls) {
    this.topic = topic;
    this.partition = partition;
    this.low = low;
    this.high = high;
    this.replicaUrls = replicaUrls.clone();
  }

  @Override
  public String[] preferredLocations() {
    return new String[0]; // the brokers are not Spark executors
  }

  @Override
  public String toString() {
    return topic + "/" + partition + " [" + low + ", " + high + ")";
  }
}
