import com.fasterxml.jackson.databind.JsonNode;
import dev.laminar.spark.Options;
import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Test driver for tests/spark/jvm/test_jvm_options.py: each stdin line is
 * {"options": {name: value}, "credentials": bool}; each answer is the parsed options' fields,
 * named as the Python dataclass's (laminar.spark.options.Options) plus "subscribed", after
 * withCredentials() (this process's environment) when "credentials" is true.
 */
public final class OptionsCheck {
  private OptionsCheck() {}

  public static void main(String[] args) throws IOException {
    CheckIo.serve(OptionsCheck::answer);
  }

  private static Object answer(JsonNode request) {
    Options options = Options.parse(CheckIo.strings(request.path("options")));
    if (request.path("credentials").asBoolean(false)) {
      options = options.withCredentials();
    }
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("brokers", options.brokers);
    out.put("topics", options.topics);
    out.put("starting", options.starting);
    out.put("ending", options.ending);
    out.put("max_records_per_trigger", options.maxRecordsPerTrigger);
    out.put("min_partitions", options.minPartitions);
    out.put("fail_on_data_loss", options.failOnDataLoss);
    out.put("include_headers", options.includeHeaders);
    out.put("token", options.token);
    out.put("ca_file", options.caFile);
    out.put("token_file", options.tokenFile);
    out.put("context", options.context);
    out.put("transaction_timeout_ms", options.transactionTimeoutMs);
    out.put("pattern", options.pattern);
    List<Object> assigned = null;
    if (options.assigned != null) {
      assigned = new ArrayList<>();
      for (Map.Entry<String, ?> entry : options.assigned.entrySet()) {
        assigned.add(List.of(entry.getKey(), entry.getValue()));
      }
    }
    out.put("assigned", assigned);
    out.put("starting_timestamp_ms", options.startingTimestampMs);
    out.put("ending_timestamp_ms", options.endingTimestampMs);
    out.put("starting_by_timestamp", options.startingByTimestamp);
    out.put("ending_by_timestamp", options.endingByTimestamp);
    out.put("timestamp_strategy", options.timestampStrategy);
    out.put("min_records_per_trigger", options.minRecordsPerTrigger);
    out.put("max_trigger_delay_ms", options.maxTriggerDelayMs);
    out.put("subscribed", options.subscribed());
    return out;
  }
}
