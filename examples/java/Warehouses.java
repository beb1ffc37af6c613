// A shop with two warehouses, from Java (8 or later) with Jedis: stock kept
// by location (docs/locations.md), a cart line taken across both in the
// shop's own priority order in one atomic call, a hold confirmed, an order
// cancelled, each unit given back where it came from.
//
// pom.xml pins Jedis; build and run it against deploy/dev.sh started with
// --admin-commands (the example stocks the warehouses itself, with
// STOCK.SET, an operator's command):
//
//     cd examples/java && mvn -q compile
//     java -cp "target/classes:$(cat target/classpath.txt)" Warehouses
//
// Options: --host (127.0.0.1), --port (6390), --sku (boot-77), --run (what
// this run's op and request ids start with; the time by default). Each run
// stocks the SKU afresh (east: 3 units, 1 of them kept back as its floor;
// west: 5), so it can be run again. tests/clients.rs builds it with
// pom.xml and checks what it prints, and the warehouses after it.

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.SafeEncoder;

public class Warehouses {
    static final int ATTEMPTS = 3;

    final RedisClient jedis;
    final String sku;

    Warehouses(RedisClient jedis, String sku) {
        this.jedis = jedis;
        this.sku = sku;
    }

    /**
     * Sends one command, retrying with the same ids while the outcome is
     * unknown (a timeout, UPSTREAM, BADREPLY): every id below is the
     * call's own, so a retry of an applied call answers code 1 and changes
     * nothing.
     */
    List<?> call(String command, Object... args) {
        String[] words = new String[args.length];
        for (int i = 0; i < args.length; i++) {
            words[i] = String.valueOf(args[i]);
        }
        for (int attempt = 1; ; attempt++) {
            RuntimeException error;
            try {
                return (List<?>) jedis.sendCommand(() -> SafeEncoder.encode(command), words);
            } catch (JedisConnectionException e) {
                error = e;
            } catch (JedisDataException e) {
                String message = String.valueOf(e.getMessage());
                if (!message.startsWith("UPSTREAM") && !message.startsWith("BADREPLY")) {
                    // NOPERM: stockgate runs without --admin-commands;
                    // anything else here needs a human.
                    throw fail(command + ": " + message);
                }
                error = e;
            }
            if (attempt == ATTEMPTS) {
                throw fail(command + ": " + error.getMessage());
            }
            System.out.println("attempt " + attempt + " of " + ATTEMPTS + ": " + error.getMessage()
                + "; retrying with the same ids");
            try {
                Thread.sleep(attempt * 100L);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    static RuntimeException fail(String why) {
        System.out.println("stop: " + why);
        System.exit(1);
        return new IllegalStateException(why);
    }

    static String text(Object value) {
        return value instanceof byte[] ? new String((byte[]) value, StandardCharsets.UTF_8) : String.valueOf(value);
    }

    /**
     * Checks a reply's code and returns its remain: 0 (done now) and 1
     * (done by an earlier call of the same id) both mean done.
     */
    static long outcome(String what, List<?> reply) {
        long code = (Long) reply.get(0);
        long remain = (Long) reply.get(1);
        String reason = reply.size() > 4 ? text(reply.get(4)) : "";
        if (code == 0 || code == 1) {
            return remain;
        } else if (code == 2) {
            throw fail(what + ": not enough stock where the shop may take it (" + remain
                + " left in all); nothing taken");
        } else if (code == 3) {
            throw fail(what + ": fix the request: " + reason);
        } else if (code == 4) {
            throw fail(what + ": this id was reverted or revoked earlier; use new ids (--run)");
        } else if (code == 5) {
            throw fail(what + ": the hold ran out; its units are back in stock");
        }
        throw fail(what + ": unknown code " + code + ": upgrade this client");
    }

    /** DEDUCT.AT's and HOLD.AT's seventh element: what each location gave, in the order taken. */
    static String allocation(List<?> reply) {
        List<?> flat = (List<?>) reply.get(6);
        List<String> parts = new ArrayList<>();
        for (int i = 0; i + 1 < flat.size(); i += 2) {
            parts.add(text(flat.get(i)) + " " + flat.get(i + 1));
        }
        return String.join(" + ", parts);
    }

    void stock(String location, int units, int floor, String opId) {
        outcome("stocking " + location, call("STOCK.SET", sku, units, opId, "AT", location, "FLOOR", floor));
        System.out.println("stocked " + location + ": " + units + " units, floor " + floor);
    }

    public static void main(String[] argv) {
        String host = "127.0.0.1";
        int port = 6390;
        String sku = "boot-77";
        String run = String.valueOf(System.nanoTime());
        for (int i = 0; i < argv.length; i++) {
            switch (argv[i]) {
                case "--host": host = argv[++i]; break;
                case "--port": port = Integer.parseInt(argv[++i]); break;
                case "--sku": sku = argv[++i]; break;
                case "--run": run = argv[++i]; break;
                default:
                    System.err.println("usage: Warehouses [--host H] [--port P] [--sku SKU] [--run ID]");
                    System.exit(2);
            }
        }
        DefaultJedisClientConfig config = DefaultJedisClientConfig.builder()
            // Longer than stockgate's own --timeout (1s).
            .socketTimeoutMillis(3000)
            .build();
        try (RedisClient jedis = RedisClient.builder().hostAndPort(host, port).clientConfig(config).build()) {
            Warehouses shop = new Warehouses(jedis, sku);
            String line = run + "-line-1";
            String cart = run + "-cart-2";

            shop.stock("east", 3, 1, run + "-restock-east");
            shop.stock("west", 5, 0, run + "-restock-west");

            // The shop's priority: east first (nearer), then west; the
            // line may be split across them.
            for (String again : new String[] {"", " again (a retry)"}) {
                List<?> reply = shop.call("DEDUCT.AT", sku, 4, line, "SPLIT", "east", "west");
                long remain = outcome("line 1", reply);
                String done = (Long) reply.get(0) == 1 ? "already deducted" : "deducted";
                System.out.println("line 1" + again + ", 4 units, SPLIT east,west: " + done + ", "
                    + allocation(reply) + "; " + remain + " left in all");
            }

            // A cart held while the customer pays, whole from one warehouse.
            List<?> reply = shop.call("HOLD.AT", sku, 2, cart, 900000, "WHOLE", "east", "west");
            long remain = outcome("cart 2", reply);
            System.out.println("cart 2, 2 units, WHOLE east,west: held, " + allocation(reply) + "; "
                + remain + " left in all");
            remain = outcome("cart 2 paid", shop.call("CONFIRM", sku, cart));
            System.out.println("cart 2 paid: confirmed; " + remain + " left in all");

            // Line 1's order is cancelled: stockgate's record says where
            // its units came from.
            remain = outcome("line 1 cancelled", shop.call("REVERT", sku, line));
            System.out.println("line 1 cancelled: given back where it came from; " + remain + " left in all");

            // [total, [location, available, held, floor], ...]
            List<?> locations = shop.call("STOCK.LOCATIONS", sku);
            for (Object item : locations.subList(1, locations.size())) {
                List<?> l = (List<?>) item;
                System.out.println(text(l.get(0)) + ": " + l.get(1) + " available, " + l.get(2) + " held, floor "
                    + l.get(3));
            }
        }
    }
}
