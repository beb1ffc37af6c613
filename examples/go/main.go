// DEDUCT from Go with go-redis v9, handling every outcome.
//
// NOT COMPILED IN THIS REPOSITORY'S CI: no Go toolchain or module proxy is
// available where stockgate is built. What go-redis v9 sends on connect
// (`hello 3`, `client setinfo ...`) is replayed byte for byte against
// stockgate by tests/clients.rs (go_redis_9_handshake_replayed), and the
// decisions below are the ones examples/python and examples/node make
// there, tested for every outcome. Treat this file as a reviewed sketch.
//
// Run it against deploy/dev.sh (which seeds demo-1 with 100 units):
//
//	cd examples/go && go mod tidy
//	go run . demo-1 2 order-1001 ORD-1001
//
// Run it twice: the second run is a retry of the same request_id and
// answers "already deducted" without taking stock again.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

const attempts = 3

// retry means the outcome is unknown: try again with the SAME request_id.
const retry = "retry"

// deductOnce sends one DEDUCT and says what to do next, and why.
func deductOnce(ctx context.Context, rdb *redis.Client, sku, qty, requestID, orderNo string) (string, string) {
	reply, err := rdb.Do(ctx, "DEDUCT", sku, qty, requestID, orderNo).Slice()
	if err != nil {
		var serverErr redis.Error
		if !errors.As(err, &serverErr) {
			// A timeout or a broken connection: the request may or may not
			// have reached stockgate and Redis. Retrying with the SAME
			// request_id is safe: if the first attempt deducted, the retry
			// answers code 1 and takes nothing.
			return retry, err.Error()
		}
		// Server error replies start with their class.
		msg := serverErr.Error()
		switch kind, _, _ := strings.Cut(msg, " "); kind {
		case "UPSTREAM", "BADREPLY":
			// stockgate could not get a clear answer from Redis; same as a timeout.
			return retry, msg
		case "UNKNOWNSKU":
			// The sku's stock was never loaded: nothing changed, but a human must look.
			return "fail the order and alert", msg
		case "BADSTOCK", "BADRECORD", "WRONGTYPE":
			// Corrupt data in Redis: nothing changed; retrying won't help.
			return "fail the order and alert an operator", msg
		default:
			// ERR ...: wrong arity or the like, a bug in this caller.
			return "fix the request", msg
		}
	}

	// Only the first four elements are fixed; later versions may add more.
	code, _ := reply[0].(int64)
	remain, _ := reply[1].(int64)
	order, _ := reply[2].(string)
	switch code {
	case 0:
		return "proceed", fmt.Sprintf("deducted, %d left, order_no %q", remain, order)
	case 1:
		// This request_id was applied before (by a retried or timed-out
		// call): the order goes on with the order_no the first call stored.
		return "proceed", fmt.Sprintf("already deducted by an earlier attempt, %d left, order_no %q", remain, order)
	case 2:
		return "fail the order", fmt.Sprintf("insufficient stock (%d left); nothing was deducted", remain)
	case 3:
		// Retrying the same request gives 3 again: fix the caller.
		reason, _ := reply[4].(string)
		return "fix the request", reason
	default:
		return "fail the order and alert", fmt.Sprintf("unknown code %d: upgrade this client", code)
	}
}

func main() {
	host := flag.String("host", "127.0.0.1", "stockgate host")
	port := flag.Int("port", 6390, "stockgate port")
	timeout := flag.Duration("timeout", 2*time.Second, "how long to wait for one reply")
	flag.Parse()
	args := flag.Args()
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go run . [-host H] [-port P] [-timeout 2s] SKU QTY REQUEST_ID [ORDER_NO]")
		os.Exit(2)
	}
	sku, qty, requestID, orderNo := args[0], args[1], args[2], ""
	if len(args) > 3 {
		orderNo = args[3]
	}

	rdb := redis.NewClient(&redis.Options{
		Addr: fmt.Sprintf("%s:%d", *host, *port),
		// Longer than stockgate's own --timeout (1s), so stockgate's
		// UPSTREAM answer normally arrives before the client gives up.
		ReadTimeout: *timeout,
		// The loop below owns retries, so each one is visible and bounded.
		// go-redis's own retries (3 by default) would be safe too: they
		// resend the same request_id.
		MaxRetries: -1,
	})
	defer rdb.Close()

	ctx := context.Background()
	for attempt := 1; attempt <= attempts; attempt++ {
		action, why := deductOnce(ctx, rdb, sku, qty, requestID, orderNo)
		if action != retry {
			fmt.Printf("%s: %s\n", action, why)
			if action != "proceed" {
				os.Exit(1)
			}
			return
		}
		fmt.Printf("attempt %d of %d: %s; retrying with the same request_id\n", attempt, attempts, why)
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
	}
	// Still unknown: keep the order pending and retry later with the same
	// request_id (within stockgate's --retry-window, 24h by default).
	fmt.Printf("unknown: no answer after %d attempts; park the order and retry later with the same request_id\n", attempts)
	os.Exit(1)
}
