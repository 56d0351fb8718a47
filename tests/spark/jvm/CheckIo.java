import com.fasterxml.jackson.core.json.JsonWriteFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.Function;

/**
 * The loop of the test drivers in tests/spark/jvm (OptionsCheck, OffsetsCheck, PlanCheck): one
 * JSON request per stdin line, one JSON answer per stdout line, {"result": ...} or
 * {"error": message, "type": exception class}. Output is ASCII (non-ASCII escaped), so a lone
 * surrogate in a string comes back as it went.
 */
final class CheckIo {
  static final ObjectMapper JSON =
      JsonMapper.builder().enable(JsonWriteFeature.ESCAPE_NON_ASCII).build();

  private CheckIo() {}

  static void serve(Function<JsonNode, Object> answer) throws IOException {
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintWriter out =
        new PrintWriter(new OutputStreamWriter(System.out, StandardCharsets.US_ASCII));
    String line;
    while ((line = in.readLine()) != null) {
      Map<String, Object> reply = new LinkedHashMap<>();
      try {
        reply.put("result", answer.apply(JSON.readTree(line)));
      } catch (RuntimeException e) {
        reply.put("error", e.getMessage());
        reply.put("type", e.getClass().getSimpleName());
      }
      out.println(JSON.writeValueAsString(reply));
    }
    out.flush();
  }

  /** A JSON object of strings as a Map (the options Spark passes). */
  static Map<String, String> strings(JsonNode node) {
    Map<String, String> out = new LinkedHashMap<>();
    node.properties().forEach(e -> out.put(e.getKey(), e.getValue().asText()));
    return out;
  }
}
