// DEDUCT from Java (8 or later) with Jedis 5, handling every outcome.
//
// NOT COMPILED IN THIS REPOSITORY'S CI: Maven Central is not reachable
// where stockgate is built, so Jedis can't be fetched. What Jedis 5 sends
// on connect (`CLIENT SETINFO ...`, RESP2) is replayed byte for byte against
// stockgate by tests/clients.rs (jedis_5_handshake_replayed), and the
// decisions below are the ones examples/python and examples/node make
// there, tested for every outcome. Treat this file as a reviewed sketch.
//
// It needs redis.clients:jedis:5.2.0 and its dependencies on the class path
// (in a Maven project: `mvn dependency:build-classpath`). It compiles as
// Java 8; Java 11+ runs the source file directly. Against deploy/dev.sh
// (which seeds demo-1 with 100 units):
//
//     java -cp "$JEDIS_CLASSPATH" Deduct.java demo-1 2 order-1001 ORD-1001
//
// Run it twice: the second run is a retry of the same request_id and
// answers "already deducted" without taking stock again.

import java.util.List;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisPooled;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.SafeEncoder;

public class Deduct {
    static final int ATTEMPTS = 3;
    // The outcome is unknown: try again with the SAME request_id.
    static final String RETRY = "retry";
    static final ProtocolCommand DEDUCT = () -> SafeEncoder.encode("DEDUCT");

    /** What the order service does next, and why. */
    static final class Next {
        final String action;
        final String why;

        Next(String action, String why) {
            this.action = action;
            this.why = why;
        }
    }

    /** One DEDUCT: what to do next, and why. */
    static Next deductOnce(JedisPooled jedis, String sku, String qty, String requestId, String orderNo) {
        Object reply;
        try {
            reply = jedis.sendCommand(DEDUCT, sku, qty, requestId, orderNo);
        } catch (JedisConnectionException e) {
            // A timeout or a broken connection: the request may or may not
            // have reached stockgate and Redis. Retrying with the SAME
            // request_id is safe: if the first attempt deducted, the retry
            // answers code 1 and takes nothing.
            return new Next(RETRY, e.getMessage());
        } catch (JedisDataException e) {
            // Server error replies start with their class.
            String msg = e.getMessage();
            String kind = msg.split(" ", 2)[0];
            switch (kind) {
                case "UPSTREAM":
                case "BADREPLY":
                    // stockgate could not get a clear answer from Redis; same as a timeout.
                    return new Next(RETRY, msg);
                case "UNKNOWNSKU":
                    // The sku's stock was never loaded: nothing changed, but a human must look.
                    return new Next("fail the order and alert", msg);
                case "BADSTOCK":
                case "BADRECORD":
                case "WRONGTYPE":
                    // Corrupt data in Redis: nothing changed; retrying won't help.
                    return new Next("fail the order and alert an operator", msg);
                default:
                    // ERR ...: wrong arity or the like, a bug in this caller.
                    return new Next("fix the request", msg);
            }
        }

        // Only the first four elements are fixed; later versions may add more.
        List<?> fields = (List<?>) reply;
        long code = (Long) fields.get(0);
        long remain = (Long) fields.get(1);
        String order = SafeEncoder.encode((byte[]) fields.get(2));
        if (code == 0) {
            return new Next("proceed", "deducted, " + remain + " left, order_no \"" + order + "\"");
        }
        if (code == 1) {
            // This request_id was applied before (by a retried or timed-out
            // call): the order goes on with the order_no the first call stored.
            return new Next("proceed",
                "already deducted by an earlier attempt, " + remain + " left, order_no \"" + order + "\"");
        }
        if (code == 2) {
            return new Next("fail the order", "insufficient stock (" + remain + " left); nothing was deducted");
        }
        if (code == 3) {
            // Retrying the same request gives 3 again: fix the caller.
            return new Next("fix the request", SafeEncoder.encode((byte[]) fields.get(4)));
        }
        return new Next("fail the order and alert", "unknown code " + code + ": upgrade this client");
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 3) {
            System.err.println("usage: java Deduct.java SKU QTY REQUEST_ID [ORDER_NO]  (env STOCKGATE_PORT, default 6390)");
            System.exit(2);
        }
        String sku = args[0], qty = args[1], requestId = args[2];
        String orderNo = args.length > 3 ? args[3] : "";
        int port = Integer.parseInt(System.getenv().getOrDefault("STOCKGATE_PORT", "6390"));

        DefaultJedisClientConfig config = DefaultJedisClientConfig.builder()
            // Longer than stockgate's own --timeout (1s), so stockgate's
            // UPSTREAM answer normally arrives before the client gives up.
            .socketTimeoutMillis(2000)
            .build();
        try (JedisPooled jedis = new JedisPooled(new HostAndPort("127.0.0.1", port), config)) {
            for (int attempt = 1; attempt <= ATTEMPTS; attempt++) {
                Next next = deductOnce(jedis, sku, qty, requestId, orderNo);
                if (!next.action.equals(RETRY)) {
                    System.out.println(next.action + ": " + next.why);
                    System.exit(next.action.equals("proceed") ? 0 : 1);
                }
                System.out.println("attempt " + attempt + " of " + ATTEMPTS + ": " + next.why
                    + "; retrying with the same request_id");
                Thread.sleep(100L * attempt);
            }
        }
        // Still unknown: keep the order pending and retry later with the same
        // request_id (within stockgate's --retry-window, 24h by default).
        System.out.println("unknown: no answer after " + ATTEMPTS
            + " attempts; park the order and retry later with the same request_id");
        System.exit(1);
    }
}
