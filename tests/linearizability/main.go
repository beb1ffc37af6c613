// Command linearizability checks a history of stockgate requests with
// porcupine (github.com/anishathalye/porcupine), against a sequential model
// of stockgate's contract: the codes, remain and stock each request must
// see, had the requests run one at a time in some order consistent with
// their real-time order.
//
// The history comes from the Rust tests (tests/support/history.rs), as
// JSON on the file named by the first argument:
//
//	{"initial_stock": 40,
//	 "ops": [{"client": 3, "kind": "deduct", "sku": "l-0", "id": "c3-7",
//	          "qty": 2, "call": 1200, "ret": 1900,
//	          "known": true, "code": 0, "remain": 38}, ...]}
//
// kind is deduct, revert, hold, confirm or get (STOCK.GET: "stock" is the
// answer, null when the sku has none).
//
// A history with "initial_locations" ([{"name": "w1", "units": 20,
// "floor": 2}, ...]) is one of SKUs kept by location (docs/locations.md),
// each starting with those locations, and is checked against the model of
// lua/allocate.lua instead (locatedModel): its kinds are deduct_at and
// hold_at ("policy" SPLIT or WHOLE, "locations" the names in the caller's
// order, comma separated; "detail" the allocation answered,
// "w1=2,w2=1"), revert, confirm, extend ("change" its change_id, "level"
// its ttl as 600 s + level minutes, a hold's levels rising) and shrink
// ("change", "qty" the units given back), and locations (STOCK.LOCATIONS:
// "remain" the total, "detail" each location's "w1:available/held"). A request that ended in an error or
// a timeout has "known": false: its outcome is unknown, so it may have
// taken effect at any point after its call, or never (it gets an infinite
// return time, and any reply). One that also has "applied": true is known
// to have taken effect before it returned, its answer still unknown (an
// error that says the write ran, on a primary that never failed after):
// it keeps its return time, and gets any reply. Every sku starts at
// initial_stock; holds last far longer than the history (no expiry is
// modelled).
//
// Exit status: 0 linearizable, 1 not (a visualization is written to the
// path of the second argument, if given), 2 the checker ran out of time
// (120 s, or the seconds of the third argument), 3 a bad history.
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type op struct {
	Client    int    `json:"client"`
	Kind      string `json:"kind"`
	Sku       string `json:"sku"`
	ID        string `json:"id"`
	Qty       int64  `json:"qty"`
	Policy    string `json:"policy"`
	Locations string `json:"locations"`
	Change    string `json:"change"`
	Level     int64  `json:"level"`
	Call      int64  `json:"call"`
	Ret       int64  `json:"ret"`
	Known     bool   `json:"known"`
	// Applied: an unknown outcome that took effect before Ret.
	Applied bool   `json:"applied"`
	Code    int64  `json:"code"`
	Remain  int64  `json:"remain"`
	Stock   *int64 `json:"stock"`
	Detail  string `json:"detail"`
}

type history struct {
	InitialStock     int64   `json:"initial_stock"`
	InitialLocations []place `json:"initial_locations"`
	Ops              []op    `json:"ops"`
}

// input is what a request asked.
type input struct {
	kind   string
	sku    string
	id     string
	qty    int64
	policy string
	locs   string
	change string
	level  int64
}

// output is what it was answered; known false for an unknown outcome.
type output struct {
	known  bool
	code   int64
	remain int64
	stock  *int64
	detail string
}

// record is one request_id's idempotency record (lua/revert.lua's state
// machine, without expiry): D deducted, R reverted, V revoked, H held, C
// confirmed.
type record struct {
	state byte
	qty   int64
}

// state is one sku's: its stock and its records. Never changed in place:
// a step copies what it changes.
type state struct {
	stock   int64
	records map[string]record
}

func (s state) with(stock int64, id string, r record) state {
	records := make(map[string]record, len(s.records)+1)
	for k, v := range s.records {
		records[k] = v
	}
	records[id] = r
	return state{stock: stock, records: records}
}

func (s state) describe() string {
	ids := make([]string, 0, len(s.records))
	for id := range s.records {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var b strings.Builder
	fmt.Fprintf(&b, "stock %d", s.stock)
	for _, id := range ids {
		r := s.records[id]
		fmt.Fprintf(&b, " %s:%c%d", id, r.state, r.qty)
	}
	return b.String()
}

// apply is the contract: the answer (code, remain) a request gets in
// state s, and the state after it.
func apply(s state, in input) (int64, int64, state) {
	r, seen := s.records[in.id]
	switch in.kind {
	case "deduct":
		switch {
		case !seen:
			if s.stock < in.qty {
				return 2, s.stock, s
			}
			after := s.stock - in.qty
			return 0, after, s.with(after, in.id, record{'D', in.qty})
		case r.state == 'D' && r.qty == in.qty:
			return 1, s.stock, s
		case r.state == 'R' || r.state == 'V':
			return 4, s.stock, s
		default:
			return 3, s.stock, s
		}
	case "revert":
		switch {
		case !seen:
			return 4, s.stock, s.with(s.stock, in.id, record{'V', 0})
		case r.state == 'D' || r.state == 'H' || r.state == 'C':
			after := s.stock + r.qty
			return 0, after, s.with(after, in.id, record{'R', r.qty})
		default:
			return 1, s.stock, s
		}
	case "hold":
		switch {
		case !seen:
			if s.stock < in.qty {
				return 2, s.stock, s
			}
			after := s.stock - in.qty
			return 0, after, s.with(after, in.id, record{'H', in.qty})
		case (r.state == 'H' || r.state == 'C') && r.qty == in.qty:
			return 1, s.stock, s
		case r.state == 'R' || r.state == 'V':
			return 4, s.stock, s
		default:
			return 3, s.stock, s
		}
	case "confirm":
		switch {
		case !seen:
			return 4, s.stock, s.with(s.stock, in.id, record{'V', 0})
		case r.state == 'H':
			return 0, s.stock, s.with(s.stock, in.id, record{'C', r.qty})
		case r.state == 'C':
			return 1, s.stock, s
		case r.state == 'R' || r.state == 'V':
			return 4, s.stock, s
		default:
			return 3, s.stock, s
		}
	}
	// get
	return 0, s.stock, s
}

func model(initial int64) porcupine.Model {
	return porcupine.Model{
		Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
			bySku := map[string][]porcupine.Operation{}
			var order []string
			for _, o := range ops {
				sku := o.Input.(input).sku
				if _, ok := bySku[sku]; !ok {
					order = append(order, sku)
				}
				bySku[sku] = append(bySku[sku], o)
			}
			parts := make([][]porcupine.Operation, 0, len(order))
			for _, sku := range order {
				parts = append(parts, bySku[sku])
			}
			return parts
		},
		Init: func() interface{} {
			return state{stock: initial, records: map[string]record{}}
		},
		Step: func(st, in, out interface{}) (bool, interface{}) {
			s, i, o := st.(state), in.(input), out.(output)
			code, remain, next := apply(s, i)
			if !o.known {
				return true, next
			}
			if i.kind == "get" {
				return o.stock != nil && *o.stock == s.stock, s
			}
			return o.code == code && o.remain == remain, next
		},
		Equal: func(a, b interface{}) bool {
			return a.(state).describe() == b.(state).describe()
		},
		DescribeOperation: func(in, out interface{}) string {
			i, o := in.(input), out.(output)
			var answer string
			switch {
			case !o.known:
				answer = "unknown"
			case i.kind == "get" && o.stock != nil:
				answer = fmt.Sprintf("%d", *o.stock)
			case i.kind == "get":
				answer = "nil"
			default:
				answer = fmt.Sprintf("%d, %d", o.code, o.remain)
			}
			if i.kind == "get" {
				return fmt.Sprintf("STOCK.GET %s -> %s", i.sku, answer)
			}
			return fmt.Sprintf("%s %s %s %d -> %s", strings.ToUpper(i.kind), i.sku, i.id, i.qty, answer)
		},
		DescribeState: func(st interface{}) string {
			return st.(state).describe()
		},
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: linearizability <history.json> [visualization.html [timeout-seconds]]")
		os.Exit(3)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	var h history
	if err := json.Unmarshal(raw, &h); err != nil {
		fmt.Fprintln(os.Stderr, "bad history:", err)
		os.Exit(3)
	}
	ops := make([]porcupine.Operation, 0, len(h.Ops))
	unknown, applied, redundant := 0, 0, 0
	// Unknown outcomes cost porcupine's search dearly (each may be placed
	// anywhere after its call, or nowhere), so those that cannot change
	// the verdict are left out, which is exact, not a weaker check:
	//   - a STOCK.GET (or STOCK.LOCATIONS) with an unknown outcome: it
	//     changes nothing and tells nothing;
	//   - a request with the same kind, sku, id and qty as an earlier one
	//     whose outcome is unknown too (a retry, sent again after its
	//     error): of requests with one input, at most one changes the
	//     state (a request_id's record, once written, makes every later
	//     request of that input a no-op; a 2 writes none and changes
	//     nothing), and the earlier one, placeable anywhere after its
	//     earlier call, can stand in for whichever of the two did. (Of
	//     HOLD.EXTENDs and HOLD.SHRINKs, one change_id's record does the
	//     same.)
	// Not an "applied" one (it is bounded by its return), and not a known
	// one (its answer is checked).
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Call < h.Ops[j].Call })
	located := len(h.InitialLocations) > 0
	kinds := map[string]bool{"deduct": true, "revert": true, "hold": true, "confirm": true, "get": true}
	read := "get"
	if located {
		kinds = map[string]bool{"deduct_at": true, "hold_at": true, "revert": true, "confirm": true,
			"extend": true, "shrink": true, "locations": true}
		read = "locations"
	}
	pending := map[input]bool{}
	for _, o := range h.Ops {
		if !kinds[o.Kind] {
			fmt.Fprintln(os.Stderr, "bad history: unknown kind", o.Kind)
			os.Exit(3)
		}
		in := input{kind: o.Kind, sku: o.Sku, id: o.ID, qty: o.Qty, policy: o.Policy,
			locs: o.Locations, change: o.Change, level: o.Level}
		if !o.Known && !o.Applied {
			if o.Kind == read || pending[in] {
				redundant++
				continue
			}
			pending[in] = true
		}
		ret := o.Ret
		switch {
		case !o.Known && o.Applied:
			// It took effect between its call and its return.
			unknown++
			applied++
		case !o.Known:
			// It may take effect any time after its call, or never.
			ret = math.MaxInt64
			unknown++
		}
		ops = append(ops, porcupine.Operation{
			ClientId: o.Client,
			Input:    in,
			Call:     o.Call,
			Output:   output{known: o.Known, code: o.Code, remain: o.Remain, stock: o.Stock, detail: o.Detail},
			Return:   ret,
		})
	}
	timeout := 120 * time.Second
	if len(os.Args) > 3 {
		seconds, err := strconv.Atoi(os.Args[3])
		if err != nil || seconds <= 0 {
			fmt.Fprintln(os.Stderr, "bad timeout:", os.Args[3])
			os.Exit(3)
		}
		timeout = time.Duration(seconds) * time.Second
	}
	m := model(h.InitialStock)
	if located {
		m = locatedModel(h.InitialLocations)
	}
	result, info := porcupine.CheckOperationsVerbose(m, ops, timeout)
	fmt.Printf("%s: %d operations (%d with an unknown outcome, %d of them applied by their return; %d more unknown outcomes left out as redundant)\n", result, len(ops), unknown, applied, redundant)
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		if len(os.Args) > 2 {
			if err := porcupine.VisualizePath(m, info, os.Args[2]); err != nil {
				fmt.Fprintln(os.Stderr, "visualization:", err)
			} else {
				fmt.Println("visualization:", os.Args[2])
			}
		}
		os.Exit(1)
	default:
		os.Exit(2)
	}
}
