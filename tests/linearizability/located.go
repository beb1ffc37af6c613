package main

// The sequential model of a SKU kept by location (docs/locations.md,
// lua/allocate.lua): each location's available and held units and its
// floor, each request's record with its allocation, and each change_id's
// change. Holds last far longer than the history (no expiry is modelled).

import (
	"fmt"
	"github.com/anishathalye/porcupine"
	"sort"
	"strconv"
	"strings"
)

// place is one location: as the history gives it first, and as the model
// keeps it.
type place struct {
	Name  string `json:"name"`
	Units int64  `json:"units"`
	Floor int64  `json:"floor"`
	held  int64
}

// part is what one location gave a request.
type part struct {
	name  string
	units int64
}

// located is one request's record: D deducted, H held, C confirmed, R
// reverted, V revoked; asked the qty it was made with, qty what it keeps
// (less a shrink), taken where its units came from, level its last
// extension.
type located struct {
	state byte
	asked int64
	qty   int64
	taken []part
	level int64
}

// change is a HOLD.EXTEND's or HOLD.SHRINK's record, by change_id.
type change struct {
	extend bool
	amount int64
	id     string
}

// lstate is one SKU's. Never changed in place: a step copies what it
// changes (clone).
type lstate struct {
	places  []place // by name
	records map[string]located
	changes map[string]change
}

func (s lstate) clone() lstate {
	next := lstate{
		places:  append([]place(nil), s.places...),
		records: make(map[string]located, len(s.records)+1),
		changes: make(map[string]change, len(s.changes)+1),
	}
	for k, v := range s.records {
		next.records[k] = v
	}
	for k, v := range s.changes {
		next.changes[k] = v
	}
	return next
}

func (s lstate) total() int64 {
	total := int64(0)
	for _, p := range s.places {
		total += p.Units
	}
	return total
}

func (s lstate) at(name string) int {
	for i, p := range s.places {
		if p.Name == name {
			return i
		}
	}
	return -1
}

// move gives `units` of each part back to available (sign 1) or takes
// them (-1), and adds `held` times the units to the held ones.
func (s *lstate) move(taken []part, sign, held int64) {
	for _, t := range taken {
		i := s.at(t.name)
		s.places[i].Units += sign * t.units
		s.places[i].held += held * t.units
	}
}

func allocation(taken []part) string {
	parts := make([]string, len(taken))
	for i, t := range taken {
		parts[i] = fmt.Sprintf("%s=%d", t.name, t.units)
	}
	return strings.Join(parts, ",")
}

func (s lstate) describe() string {
	var b strings.Builder
	for _, p := range s.places {
		fmt.Fprintf(&b, "%s:%d/%d ", p.Name, p.Units, p.held)
	}
	ids := make([]string, 0, len(s.records))
	for id := range s.records {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := s.records[id]
		fmt.Fprintf(&b, " %s:%c%d/%d@%s^%d", id, r.state, r.qty, r.asked, allocation(r.taken), r.level)
	}
	changes := make([]string, 0, len(s.changes))
	for c := range s.changes {
		changes = append(changes, c)
	}
	sort.Strings(changes)
	for _, c := range changes {
		ch := s.changes[c]
		fmt.Fprintf(&b, " %s:%v/%d/%s", c, ch.extend, ch.amount, ch.id)
	}
	return b.String()
}

// allocate is lua/allocate.lua's choice: over `names` in order, SPLIT
// takes from each as much as it has above its floor, WHOLE all from the
// first that can give it; nil when they can't give qty.
func (s lstate) allocate(qty int64, policy string, names []string) []part {
	var taken []part
	left := qty
	for _, name := range names {
		p := s.places[s.at(name)]
		free := p.Units - p.Floor
		if left == 0 || free <= 0 {
			continue
		}
		if policy == "SPLIT" {
			n := min(free, left)
			taken = append(taken, part{name, n})
			left -= n
		} else if free >= qty {
			taken, left = []part{{name, qty}}, 0
		}
	}
	if left > 0 {
		return nil
	}
	return taken
}

// applyLocated is the contract of a SKU kept by location: the answer
// (code, remain, detail) a request gets in state s, and the state after.
func applyLocated(s lstate, in input) (int64, int64, string, lstate) {
	r, seen := s.records[in.id]
	gone := seen && (r.state == 'R' || r.state == 'V')
	switch in.kind {
	case "deduct_at", "hold_at":
		hold := in.kind == "hold_at"
		switch {
		case !seen:
			taken := s.allocate(in.qty, in.policy, strings.Split(in.locs, ","))
			if taken == nil {
				return 2, s.total(), "", s
			}
			next := s.clone()
			state, held := byte('D'), int64(0)
			if hold {
				state, held = 'H', 1
			}
			next.move(taken, -1, held)
			next.records[in.id] = located{state: state, asked: in.qty, qty: in.qty, taken: taken}
			return 0, next.total(), allocation(taken), next
		case gone:
			return 4, s.total(), "", s
		case hold == (r.state == 'D') || r.asked != in.qty:
			return 3, s.total(), "", s
		default:
			return 1, s.total(), allocation(r.taken), s
		}
	case "revert":
		switch {
		case !seen:
			next := s.clone()
			next.records[in.id] = located{state: 'V'}
			return 4, s.total(), "", next
		case gone:
			return 1, s.total(), "", s
		}
		next := s.clone()
		held := int64(0)
		if r.state == 'H' {
			held = -1
		}
		next.move(r.taken, 1, held)
		r.state = 'R'
		next.records[in.id] = r
		return 0, next.total(), "", next
	case "confirm":
		switch {
		case !seen:
			next := s.clone()
			next.records[in.id] = located{state: 'V'}
			return 4, s.total(), "", next
		case gone:
			return 4, s.total(), "", s
		case r.state == 'D':
			return 3, s.total(), "", s
		case r.state == 'C':
			return 1, s.total(), "", s
		}
		next := s.clone()
		next.move(r.taken, 0, -1)
		r.state = 'C'
		next.records[in.id] = r
		return 0, s.total(), "", next
	case "extend", "shrink":
		extend := in.kind == "extend"
		amount := in.qty
		if extend {
			amount = in.level
		}
		if c, done := s.changes[in.change]; done {
			if c == (change{extend, amount, in.id}) {
				return 1, s.total(), "", s
			}
			return 3, s.total(), "", s
		}
		switch {
		case !seen || r.state == 'D':
			return 3, s.total(), "", s
		case gone:
			return 4, s.total(), "", s
		case r.state == 'C' && extend:
			return 1, s.total(), "", s
		case r.state == 'C':
			return 3, s.total(), "", s
		case extend && in.level <= r.level, !extend && in.qty >= r.qty:
			return 3, s.total(), "", s
		}
		next := s.clone()
		if extend {
			r.level = in.level
		} else {
			// From the last location taken first.
			left := in.qty
			taken := append([]part(nil), r.taken...)
			for i := len(taken) - 1; i >= 0 && left > 0; i-- {
				n := min(taken[i].units, left)
				next.move([]part{{taken[i].name, n}}, 1, -1)
				taken[i].units -= n
				left -= n
			}
			r.taken = r.taken[:0:0]
			for _, t := range taken {
				if t.units > 0 {
					r.taken = append(r.taken, t)
				}
			}
			r.qty -= in.qty
		}
		next.records[in.id] = r
		next.changes[in.change] = change{extend, amount, in.id}
		return 0, next.total(), "", next
	}
	// locations
	parts := make([]string, len(s.places))
	for i, p := range s.places {
		parts[i] = p.Name + ":" + strconv.FormatInt(p.Units, 10) + "/" + strconv.FormatInt(p.held, 10)
	}
	return 0, s.total(), strings.Join(parts, ","), s
}

func locatedModel(initial []place) porcupine.Model {
	places := append([]place(nil), initial...)
	sort.Slice(places, func(i, j int) bool { return places[i].Name < places[j].Name })
	m := model(0)
	m.Init = func() interface{} {
		return lstate{places: places, records: map[string]located{}, changes: map[string]change{}}
	}
	m.Step = func(st, in, out interface{}) (bool, interface{}) {
		s, i, o := st.(lstate), in.(input), out.(output)
		code, remain, detail, next := applyLocated(s, i)
		if !o.known {
			return true, next
		}
		return o.code == code && o.remain == remain && o.detail == detail, next
	}
	m.Equal = func(a, b interface{}) bool {
		return a.(lstate).describe() == b.(lstate).describe()
	}
	m.DescribeOperation = func(in, out interface{}) string {
		i, o := in.(input), out.(output)
		answer := "unknown"
		if o.known {
			answer = fmt.Sprintf("%d, %d %s", o.code, o.remain, o.detail)
		}
		switch i.kind {
		case "locations":
			return fmt.Sprintf("STOCK.LOCATIONS %s -> %s", i.sku, answer)
		case "deduct_at", "hold_at":
			return fmt.Sprintf("%s %s %s %d %s %s -> %s", strings.ToUpper(i.kind), i.sku, i.id, i.qty, i.policy, i.locs, answer)
		case "extend", "shrink":
			return fmt.Sprintf("HOLD.%s %s %s %s %d/%d -> %s", strings.ToUpper(i.kind), i.sku, i.id, i.change, i.qty, i.level, answer)
		}
		return fmt.Sprintf("%s %s %s -> %s", strings.ToUpper(i.kind), i.sku, i.id, answer)
	}
	m.DescribeState = func(st interface{}) string {
		return st.(lstate).describe()
	}
	return m
}
