// DEDUCT and REVERT from Go with go-redis v9, handling every outcome.
//
// go.mod and go.sum pin go-redis (Go 1.26+). tests/clients.rs builds this
// program and runs it in CI for every outcome below.
//
// Run it against deploy/dev.sh (which seeds demo-1 with 100 units):
//
//	cd examples/go
//	go run . demo-1 2 order-4004 ORD-4004
//	go run . -revert demo-1 order-4004
//
// The first takes 2 units for order line order-4004; run it twice and the
// second run is a retry of the same request_id: "already deducted", nothing
// taken again. The second gives them back, as the order service does when
// the payment fails or the order is cancelled; it is safe to repeat, and
// safe even when the DEDUCT's outcome is unknown.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

const attempts = 3

// retry means the outcome is unknown: try again with the SAME request_id.
const retry = "retry"

// fault says what an error means for DEDUCT and REVERT alike: retry,
// "fix the request" or "alert", and why.
func fault(err error) (string, string) {
	var serverErr redis.Error
	if !errors.As(err, &serverErr) {
		// A timeout or a broken connection: the request may or may not
		// have reached stockgate and Redis. Retrying with the SAME
		// request_id is safe: if the first attempt was applied, the retry
		// answers code 1 and changes nothing.
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			return retry, "timed out"
		}
		return retry, err.Error()
	}
	// Server error replies start with their class.
	msg := serverErr.Error()
	switch kind, _, _ := strings.Cut(msg, " "); kind {
	case "UPSTREAM", "BADREPLY":
		// stockgate could not get a clear answer from Redis; same as a timeout.
		return retry, msg
	case "UNKNOWNSKU", "BADSTOCK", "BADRECORD", "WRONGTYPE":
		// The stock was never loaded, or the data is corrupt: nothing
		// changed, retrying won't help, a human must look.
		return "alert", msg
	default:
		// ERR ...: wrong arity or the like, a bug in this caller.
		return "fix the request", msg
	}
}

// fields reads the four fixed elements of a reply; later versions may
// append more.
func fields(reply []interface{}) (code, remain int64, order string) {
	code, _ = reply[0].(int64)
	remain, _ = reply[1].(int64)
	order, _ = reply[2].(string)
	return code, remain, order
}

// deductOnce sends one DEDUCT, taking stock for an order line, and says
// what to do next, and why.
func deductOnce(ctx context.Context, rdb *redis.Client, sku, qty, requestID, orderNo string) (string, string) {
	reply, err := rdb.Do(ctx, "DEDUCT", sku, qty, requestID, orderNo).Slice()
	if err != nil {
		action, why := fault(err)
		if action == "alert" {
			action = "fail the order and alert"
		}
		return action, why
	}
	code, remain, order := fields(reply)
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
	case 4:
		// A REVERT of this request_id came first: the order was cancelled.
		// Nothing was deducted, and this id never will be.
		return "stop", fmt.Sprintf("this request_id was reverted or revoked (%d left); nothing was deducted. "+
			"If the order must go ahead after all, use a new request_id", remain)
	default:
		return "fail the order and alert", fmt.Sprintf("unknown code %d: upgrade this client", code)
	}
}

// revertOnce sends one REVERT, giving back what requestID deducted because
// the payment failed or the order was cancelled, and says what to do next,
// and why. On "alert" the compensation is not done: keep it pending.
func revertOnce(ctx context.Context, rdb *redis.Client, sku, requestID string) (string, string) {
	reply, err := rdb.Do(ctx, "REVERT", sku, requestID).Slice()
	if err != nil {
		return fault(err)
	}
	code, remain, order := fields(reply)
	switch code {
	case 0:
		// The qty came from stockgate's record of the DEDUCT, not from us.
		return "compensated", fmt.Sprintf("given back, %d in stock, order_no %q", remain, order)
	case 1:
		// An earlier REVERT of this id (a retried or timed-out call) did it.
		return "compensated", fmt.Sprintf("already done by an earlier attempt, %d in stock, order_no %q", remain, order)
	case 4:
		// The DEDUCT never happened (it failed, or never arrived). The id
		// is now revoked, so if that DEDUCT arrives late it takes nothing.
		return "compensated", "nothing had been deducted; the request_id is revoked, so a late DEDUCT of it takes nothing"
	case 3:
		reason, _ := reply[4].(string)
		return "fix the request", reason
	default:
		return "alert", fmt.Sprintf("unknown code %d: upgrade this client", code)
	}
}

func main() {
	host := flag.String("host", "127.0.0.1", "stockgate host")
	port := flag.Int("port", 6390, "stockgate port")
	timeout := flag.Duration("timeout", 2*time.Second, "how long to wait for one reply")
	revert := flag.Bool("revert", false, "give back what REQUEST_ID deducted: -revert SKU REQUEST_ID")
	flag.Parse()
	args := flag.Args()
	if (*revert && len(args) != 2) || (!*revert && (len(args) < 3 || len(args) > 4)) {
		fmt.Fprintln(os.Stderr, "usage: go run . [-host H] [-port P] [-timeout 2s] SKU QTY REQUEST_ID [ORDER_NO]")
		fmt.Fprintln(os.Stderr, "       go run . [-host H] [-port P] [-timeout 2s] -revert SKU REQUEST_ID")
		os.Exit(2)
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
	var once func() (string, string)
	done, later := "proceed", "park the order and retry later with the same request_id"
	if *revert {
		once = func() (string, string) { return revertOnce(ctx, rdb, args[0], args[1]) }
		done, later = "compensated", "keep the compensation pending and retry REVERT later with the same request_id"
	} else {
		orderNo := ""
		if len(args) > 3 {
			orderNo = args[3]
		}
		once = func() (string, string) { return deductOnce(ctx, rdb, args[0], args[1], args[2], orderNo) }
	}

	for attempt := 1; attempt <= attempts; attempt++ {
		action, why := once()
		if action != retry {
			fmt.Printf("%s: %s\n", action, why)
			if action != done {
				rdb.Close()
				os.Exit(1)
			}
			return
		}
		fmt.Printf("attempt %d of %d: %s; retrying with the same request_id\n", attempt, attempts, why)
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
	}
	// Still unknown. Keep it and retry later with the same request_id (within
	// stockgate's --retry-window, 24h by default). To cancel an order whose
	// DEDUCT stays unknown, REVERT it: that settles it either way.
	fmt.Printf("unknown: no answer after %d attempts; %s\n", attempts, later)
	rdb.Close()
	os.Exit(1)
}
