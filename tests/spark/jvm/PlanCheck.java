import com.fasterxml.jackson.databind.JsonNode;
import dev.laminar.spark.Options;
import dev.laminar.spark.Planner;
import java.io.IOException;
import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.List;

/**
 * Test driver for tests/spark/jvm/test_jvm_planning.py: each stdin line is a batch read's
 * options; each answer is its plan (Planner, after withCredentials()), one
 * [topic, partition, low, high, [replica URL, ...]] per range. (RangePartition is package-private:
 * its fields are read reflectively, as Spark only ever sees them through the reader.)
 */
public final class PlanCheck {
  private PlanCheck() {}

  public static void main(String[] args) throws IOException {
    CheckIo.serve(PlanCheck::answer);
  }

  private static Object answer(JsonNode request) {
    Options options = Options.parse(CheckIo.strings(request)).withCredentials();
    List<Object> out = new ArrayList<>();
    for (Object range : new Planner(options).plan()) {
      out.add(
          List.of(
              field(range, "topic"), field(range, "partition"), field(range, "low"),
              field(range, "high"), List.of((String[]) field(range, "replicaUrls"))));
    }
    return out;
  }

  private static Object field(Object range, String name) {
    try {
      Field field = range.getClass().getDeclaredField(name);
      field.setAccessible(true);
      return field.get(range);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("RangePartition has no field " + name, e);
    }
  }
}
