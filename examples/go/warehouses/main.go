// A shop with two warehouses, from Go with go-redis v9: stock kept by
// location (docs/locations.md), a cart line taken across both in the
// shop's own priority order in one atomic call, a hold confirmed, an
// order cancelled, each unit given back where it came from.
//
// Run it against deploy/dev.sh started with --admin-commands (the example
// stocks the warehouses itself, with STOCK.SET, an operator's command):
//
//	cd examples/go
//	go run ./warehouses
//
// Each run stocks boot-77 afresh (east: 3 units, 1 of them kept back as
// its floor; west: 5) and uses request ids of its own (-run, default the
// time), so it can be run again. tests/clients.rs builds it and checks
// what it prints, and the warehouses after it.
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

// shop is a connection to stockgate and the SKU the shop sells.
type shop struct {
	ctx context.Context
	rdb *redis.Client
	sku string
}

// call sends one command, retrying with the same ids while the outcome is
// unknown (a timeout, UPSTREAM, BADREPLY): every id below is the call's
// own, so a retry of an applied call answers code 1 and changes nothing.
func (s *shop) call(args ...interface{}) []interface{} {
	for attempt := 1; ; attempt++ {
		reply, err := s.rdb.Do(s.ctx, args...).Slice()
		if err == nil {
			return reply
		}
		var serverErr redis.Error
		unknown := !errors.As(err, &serverErr) ||
			strings.HasPrefix(err.Error(), "UPSTREAM") || strings.HasPrefix(err.Error(), "BADREPLY")
		if !unknown || attempt == attempts {
			// NOPERM: stockgate runs without --admin-commands; anything
			// else here needs a human.
			fail("%v: %v", args[0], err)
		}
		fmt.Printf("attempt %d of %d: %v; retrying with the same ids\n", attempt, attempts, err)
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
	}
}

func fail(format string, args ...interface{}) {
	fmt.Printf("stop: "+format+"\n", args...)
	os.Exit(1)
}

// outcome checks a reply's code: 0 (done now) and 1 (done by an earlier
// call of the same id) both mean done.
func outcome(what string, reply []interface{}) (remain int64) {
	code, _ := reply[0].(int64)
	remain, _ = reply[1].(int64)
	reason := ""
	if len(reply) > 4 {
		reason, _ = reply[4].(string)
	}
	switch code {
	case 0, 1:
		return remain
	case 2:
		fail("%s: not enough stock where the shop may take it (%d left in all); nothing taken", what, remain)
	case 3:
		fail("%s: fix the request: %s", what, reason)
	case 4:
		fail("%s: this id was reverted or revoked earlier; use new ids (-run)", what)
	case 5:
		fail("%s: the hold ran out; its units are back in stock", what)
	}
	fail("%s: unknown code %d: upgrade this client", what, code)
	return 0
}

// allocation reads DEDUCT.AT's and HOLD.AT's seventh element: what each
// location gave, in the order taken.
func allocation(reply []interface{}) string {
	flat, _ := reply[6].([]interface{})
	var parts []string
	for i := 0; i+1 < len(flat); i += 2 {
		parts = append(parts, fmt.Sprintf("%v %v", flat[i], flat[i+1]))
	}
	return strings.Join(parts, " + ")
}

func (s *shop) stock(location string, units, floor int, opID string) {
	reply := s.call("STOCK.SET", s.sku, units, opID, "AT", location, "FLOOR", floor)
	outcome("stocking "+location, reply)
	fmt.Printf("stocked %s: %d units, floor %d\n", location, units, floor)
}

func main() {
	host := flag.String("host", "127.0.0.1", "stockgate host")
	port := flag.Int("port", 6390, "stockgate port")
	sku := flag.String("sku", "boot-77", "the SKU the shop sells")
	run := flag.String("run", fmt.Sprint(time.Now().UnixNano()), "makes this run's op and request ids")
	flag.Parse()

	rdb := redis.NewClient(&redis.Options{
		Addr: fmt.Sprintf("%s:%d", *host, *port),
		// Longer than stockgate's own --timeout (1s).
		ReadTimeout: 3 * time.Second,
		// call() owns retries, so each one is visible and bounded.
		MaxRetries: -1,
	})
	defer rdb.Close()
	s := &shop{ctx: context.Background(), rdb: rdb, sku: *sku}
	line, cart := *run+"-line-1", *run+"-cart-2"

	s.stock("east", 3, 1, *run+"-restock-east")
	s.stock("west", 5, 0, *run+"-restock-west")

	// The shop's priority: east first (nearer), then west; the line may
	// be split across them.
	for _, try := range []string{"", " again (a retry)"} {
		reply := s.call("DEDUCT.AT", *sku, 4, line, "SPLIT", "east", "west")
		remain := outcome("line 1", reply)
		done := "deducted"
		if reply[0].(int64) == 1 {
			done = "already deducted"
		}
		fmt.Printf("line 1%s, 4 units, SPLIT east,west: %s, %s; %d left in all\n", try, done, allocation(reply), remain)
	}

	// A cart held while the customer pays, whole from one warehouse.
	reply := s.call("HOLD.AT", *sku, 2, cart, 900000, "WHOLE", "east", "west")
	remain := outcome("cart 2", reply)
	fmt.Printf("cart 2, 2 units, WHOLE east,west: held, %s; %d left in all\n", allocation(reply), remain)
	remain = outcome("cart 2 paid", s.call("CONFIRM", *sku, cart))
	fmt.Printf("cart 2 paid: confirmed; %d left in all\n", remain)

	// Line 1's order is cancelled: stockgate's record says where its
	// units came from.
	remain = outcome("line 1 cancelled", s.call("REVERT", *sku, line))
	fmt.Printf("line 1 cancelled: given back where it came from; %d left in all\n", remain)

	// [total, [location, available, held, floor], ...]
	for _, item := range s.call("STOCK.LOCATIONS", *sku)[1:] {
		l := item.([]interface{})
		fmt.Printf("%v: %v available, %v held, floor %v\n", l[0], l[1], l[2], l[3])
	}
}
