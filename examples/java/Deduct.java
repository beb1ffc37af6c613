// DEDUCT and REVERT from Java (8 or later) with Jedis, handling every
// outcome.
//
// pom.xml pins Jedis; build and run it against deploy/dev.sh (which seeds
// demo-1 with 100 units):
//
//     cd examples/java && mvn -q compile
//     java -cp "target/classes:$(cat target/classpath.txt)" Deduct demo-1 2 order-4005 ORD-4005
//     java -cp "target/classes:$(cat target/classpath.txt)" Deduct --revert demo-1 order-4005
//
// (Java 11+ also runs the source directly: java -cp "$(cat
// target/classpath.txt)" Deduct.java ...). Options: --host (127.0.0.1),
// --port (6390), --timeout in seconds (2).
//
// The first takes 2 units for order line order-4005; run it twice and the
// second run is a retry of the same request_id: "already deducted", nothing
// taken again. The second gives them back, as the order service does when
// the payment fails or the order is cancelled; it is safe to repeat, and
// safe even when the DEDUCT's outcome is unknown. tests/clients.rs builds
// this file with pom.xml and runs it in CI for every outcome below.

import java.net.SocketTimeoutException;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Supplier;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.SafeEncoder;

public class Deduct {
    static final int ATTEMPTS = 3;
    // The outcome is unknown: try again with the SAME request_id.
    static final String RETRY = "retry";
    static final ProtocolCommand DEDUCT = () -> SafeEncoder.encode("DEDUCT");
    static final ProtocolCommand REVERT = () -> SafeEncoder.encode("REVERT");

    /** What the order service does next, and why. */
    static final class Next {
        final String action;
        final String why;

        Next(String action, String why) {
            this.action = action;
            this.why = why;
        }
    }

    /** What a Jedis exception means for DEDUCT and REVERT alike. */
    static Next fault(RuntimeException e) {
        if (e instanceof JedisConnectionException) {
            // A timeout or a broken connection: the request may or may not
            // have reached stockgate and Redis. Retrying with the SAME
            // request_id is safe: if the first attempt was applied, the
            // retry answers code 1 and changes nothing.
            return new Next(RETRY, e.getCause() instanceof SocketTimeoutException ? "timed out" : e.getMessage());
        }
        // Server error replies start with their class.
        String msg = e.getMessage();
        switch (msg.split(" ", 2)[0]) {
            case "UPSTREAM":
            case "BADREPLY":
                // stockgate could not get a clear answer from Redis; same as a timeout.
                return new Next(RETRY, msg);
            case "UNKNOWNSKU":
            case "BADSTOCK":
            case "BADRECORD":
            case "WRONGTYPE":
                // The stock was never loaded, or the data is corrupt: nothing
                // changed, retrying won't help, a human must look.
                return new Next("alert", msg);
            default:
                // ERR ...: wrong arity or the like, a bug in this caller.
                return new Next("fix the request", msg);
        }
    }

    /** One DEDUCT: take stock for an order line. */
    static Next deductOnce(RedisClient jedis, String sku, String qty, String requestId, String orderNo) {
        List<?> fields;
        try {
            fields = (List<?>) jedis.sendCommand(DEDUCT, sku, qty, requestId, orderNo);
        } catch (JedisConnectionException | JedisDataException e) {
            Next next = fault(e);
            return next.action.equals("alert") ? new Next("fail the order and alert", next.why) : next;
        }

        // Only the first four elements are fixed; later versions may add more.
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
        if (code == 4) {
            // A REVERT of this request_id came first: the order was cancelled.
            // Nothing was deducted, and this id never will be.
            return new Next("stop", "this request_id was reverted or revoked (" + remain
                + " left); nothing was deducted. If the order must go ahead after all, use a new request_id");
        }
        return new Next("fail the order and alert", "unknown code " + code + ": upgrade this client");
    }

    /**
     * One REVERT: give back what requestId deducted, because the payment
     * failed or the order was cancelled. On "alert" the compensation is not
     * done: keep it pending.
     */
    static Next revertOnce(RedisClient jedis, String sku, String requestId) {
        List<?> fields;
        try {
            fields = (List<?>) jedis.sendCommand(REVERT, sku, requestId);
        } catch (JedisConnectionException | JedisDataException e) {
            return fault(e);
        }

        long code = (Long) fields.get(0);
        long remain = (Long) fields.get(1);
        String order = SafeEncoder.encode((byte[]) fields.get(2));
        if (code == 0) {
            // The qty came from stockgate's record of the DEDUCT, not from us.
            return new Next("compensated", "given back, " + remain + " in stock, order_no \"" + order + "\"");
        }
        if (code == 1) {
            // An earlier REVERT of this id (a retried or timed-out call) did it.
            return new Next("compensated",
                "already done by an earlier attempt, " + remain + " in stock, order_no \"" + order + "\"");
        }
        if (code == 4) {
            // The DEDUCT never happened (it failed, or never arrived). The id
            // is now revoked, so if that DEDUCT arrives late it takes nothing.
            return new Next("compensated",
                "nothing had been deducted; the request_id is revoked, so a late DEDUCT of it takes nothing");
        }
        if (code == 3) {
            return new Next("fix the request", SafeEncoder.encode((byte[]) fields.get(4)));
        }
        return new Next("alert", "unknown code " + code + ": upgrade this client");
    }

    public static void main(String[] argv) throws InterruptedException {
        String host = "127.0.0.1";
        int port = 6390;
        double timeout = 2.0;
        boolean revert = false;
        List<String> words = new ArrayList<>();
        for (int i = 0; i < argv.length; i++) {
            switch (argv[i]) {
                case "--host": host = argv[++i]; break;
                case "--port": port = Integer.parseInt(argv[++i]); break;
                case "--timeout": timeout = Double.parseDouble(argv[++i]); break;
                case "--revert": revert = true; break;
                default: words.add(argv[i]);
            }
        }
        if (revert ? words.size() != 2 : words.size() < 3 || words.size() > 4) {
            System.err.println("usage: Deduct [--host H] [--port P] [--timeout S] SKU QTY REQUEST_ID [ORDER_NO]");
            System.err.println("       Deduct [--host H] [--port P] [--timeout S] --revert SKU REQUEST_ID");
            System.exit(2);
        }
        final List<String> args = words;

        DefaultJedisClientConfig config = DefaultJedisClientConfig.builder()
            // Longer than stockgate's own --timeout (1s), so stockgate's
            // UPSTREAM answer normally arrives before the client gives up.
            .socketTimeoutMillis((int) (timeout * 1000))
            .build();
        try (RedisClient jedis = RedisClient.builder().hostAndPort(host, port).clientConfig(config).build()) {
            Supplier<Next> once;
            String done;
            String later;
            if (revert) {
                once = () -> revertOnce(jedis, args.get(0), args.get(1));
                done = "compensated";
                later = "keep the compensation pending and retry REVERT later with the same request_id";
            } else {
                String orderNo = args.size() > 3 ? args.get(3) : "";
                once = () -> deductOnce(jedis, args.get(0), args.get(1), args.get(2), orderNo);
                done = "proceed";
                later = "park the order and retry later with the same request_id";
            }
            for (int attempt = 1; attempt <= ATTEMPTS; attempt++) {
                Next next = once.get();
                if (!next.action.equals(RETRY)) {
                    System.out.println(next.action + ": " + next.why);
                    System.exit(next.action.equals(done) ? 0 : 1);
                }
                System.out.println("attempt " + attempt + " of " + ATTEMPTS + ": " + next.why
                    + "; retrying with the same request_id");
                Thread.sleep(100L * attempt);
            }
            // Still unknown. Keep it and retry later with the same request_id
            // (within stockgate's --retry-window, 24h by default). To cancel an
            // order whose DEDUCT stays unknown, REVERT it: that settles it
            // either way.
            System.out.println("unknown: no answer after " + ATTEMPTS + " attempts; " + later);
        }
        System.exit(1);
    }
}
