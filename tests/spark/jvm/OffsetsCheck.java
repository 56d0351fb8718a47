import com.fasterxml.jackson.databind.JsonNode;
import dev.laminar.spark.Offsets;
import dev.laminar.spark.Replicas;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import net.jpountz.xxhash.XXHashFactory;

/**
 * Test driver for tests/spark/jvm/test_jvm_offsets.py: each stdin line names a pure function
 * ("fn") of Offsets, Replicas or Xxh64 and its arguments, as the Python function takes them;
 * each answer is what it returns, in the Python function's JSON shape.
 */
public final class OffsetsCheck {
  private OffsetsCheck() {}

  public static void main(String[] args) throws IOException {
    CheckIo.serve(OffsetsCheck::answer);
  }

  private static Object answer(JsonNode r) {
    switch (r.path("fn").asText()) {
      case "spec": {
        Offsets.Spec spec = Offsets.spec(r.path("value").asText(), r.path("name").asText());
        return spec.word != null ? spec.word : spec.offsets;
      }
      case "timestamps":
        return Offsets.timestamps(r.path("value").asText(), r.path("name").asText());
      case "resolve":
        return Offsets.resolve(
            Offsets.spec(r.path("wanted").asText(), r.path("name").asText()),
            bounds(r.path("bounds")),
            r.path("name").asText());
      case "timestamps_wanted":
        return Offsets.timestampsWanted(
            r.path("every_ms").isNull() ? null : r.path("every_ms").asLong(),
            r.path("by_partition").isNull() ? null : r.path("by_partition").asText(),
            bounds(r.path("bounds")),
            r.path("name").asText());
      case "place_by_time":
        return Offsets.placeByTime(
            offsets(r.path("offsets")),
            offsets(r.path("wanted")),
            offsets(r.path("found")),
            bounds(r.path("bounds")),
            r.path("starting").asBoolean(),
            r.path("strategy").asText());
      case "plan": {
        List<Object> out = new ArrayList<>();
        long minPartitions =
            r.path("min_partitions").isNull() ? 0 : r.path("min_partitions").asLong();
        for (Offsets.Range range :
            Offsets.plan(offsets(r.path("start")), offsets(r.path("end")), minPartitions)) {
          out.add(List.of(range.topic(), range.partition(), range.low(), range.high()));
        }
        return out;
      }
      case "read_replicas": {
        List<String> inSync = new ArrayList<>();
        r.path("in_sync").forEach(n -> inSync.add(n.asText()));
        List<Replicas.Member> members = new ArrayList<>();
        for (JsonNode m : r.path("members")) {
          members.add(
              new Replicas.Member(
                  m.path("id").asText(), m.path("api_url").asText(), m.path("state").asText(),
                  m.path("weight").asLong(), m.path("draining").asBoolean()));
        }
        return Replicas.readReplicas(
            r.path("topic").asText(), r.path("partition").asInt(), inSync, members);
      }
      case "xxh64":
        return Long.toUnsignedString(xxh64(HexFormat.of().parseHex(r.path("hex").asText())));
      default:
        throw new IllegalStateException("no function " + r.path("fn"));
    }
  }

  /** {topic: {partition: [log_start, end]}}. */
  /** XXH64 as Replicas hashes (lz4-java's), to compare with the `xxhash` package's. */
  private static long xxh64(byte[] data) {
    return XXHashFactory.fastestJavaInstance().hash64().hash(data, 0, data.length, 0L);
  }

  private static Map<String, Map<String, Offsets.Bounds>> bounds(JsonNode node) {
    Map<String, Map<String, Offsets.Bounds>> out = new LinkedHashMap<>();
    node.properties()
        .forEach(
            t -> {
              Map<String, Offsets.Bounds> parts = new LinkedHashMap<>();
              t.getValue()
                  .properties()
                  .forEach(
                      p ->
                          parts.put(
                              p.getKey(),
                              new Offsets.Bounds(
                                  p.getValue().get(0).asLong(), p.getValue().get(1).asLong())));
              out.put(t.getKey(), parts);
            });
    return out;
  }

  /** {topic: {partition: index or null}}. */
  private static Map<String, Map<String, Long>> offsets(JsonNode node) {
    Map<String, Map<String, Long>> out = new LinkedHashMap<>();
    node.properties()
        .forEach(
            t -> {
              Map<String, Long> parts = new LinkedHashMap<>();
              t.getValue()
                  .properties()
                  .forEach(
                      p ->
                          parts.put(
                              p.getKey(),
                              p.getValue().isNull() ? null : p.getValue().asLong()));
              out.put(t.getKey(), parts);
            });
    return out;
  }
}
