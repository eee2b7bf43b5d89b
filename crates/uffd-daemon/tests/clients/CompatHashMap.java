// A JVM workload for tests/compat.rs: a HashMap of a million strings, then a digest of all of
// them in key order. The output is the same on every run.
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.HashMap;
import java.util.HexFormat;

public class CompatHashMap {
    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(args[0]);
        HashMap<Integer, String> map = new HashMap<>();
        for (int i = 0; i < n; i++) {
            map.put(i, "value-" + i + "-" + (i * 2654435761L % 1000003) + "-padding-padding");
        }
        MessageDigest md = MessageDigest.getInstance("SHA-256");
        long bytes = 0;
        for (int i = 0; i < n; i++) {
            byte[] b = map.get(i).getBytes(StandardCharsets.UTF_8);
            bytes += b.length;
            md.update(b);
        }
        System.out.println("java: " + map.size() + " entries, " + bytes + " bytes, sha256 "
                + HexFormat.of().formatHex(md.digest()));
    }
}
