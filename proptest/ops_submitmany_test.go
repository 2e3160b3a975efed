package proptest

import (
	"fmt"
	"math/rand"
	"strings"

	"github.com/worklog/worklog/work"
)

// --- batch submit (work-api-3.md, "Batch submit") -------------------------------------------------

// SubmitManyOp submits Items, all of session S, as one SubmitManyAt: each item's result must
// be what its SubmitOp would have answered, applied one after another.
type SubmitManyOp struct {
	S     int
	Items []SubmitOp
}

func (o SubmitManyOp) String() string {
	parts := make([]string, len(o.Items))
	for i, it := range o.Items {
		parts[i] = it.String()
	}
	return fmt.Sprintf("submitMany %s [%s]", sessionNames[o.S], strings.Join(parts, "; "))
}

func (o SubmitManyOp) valid(m *model) bool {
	for _, it := range o.Items {
		if it.S != o.S || !it.valid(m) {
			return false
		}
	}
	return len(o.Items) > 0
}

// apply applies each item as its SubmitOp, in order; the items' expectations go to
// exp.settles (one per item), their events add up.
func (o SubmitManyOp) apply(m *model) {
	var items []expect
	events := 0
	for _, it := range o.Items {
		m.exp = expect{task: -1, wake: -1}
		it.apply(m)
		items = append(items, m.exp)
		events += m.exp.events
	}
	m.exp = expect{task: -1, wake: -1, settles: items, events: events}
}

func (o SubmitManyOp) exec(s *system, r *result) {
	rs := make([]work.TaskRequest, len(o.Items))
	for i, it := range o.Items {
		rs[i] = it.request()
	}
	var res []work.SubmitResult
	res, r.err = s.q().Session(sessionNames[o.S]).SubmitManyAt(s.ctx, rs, s.at())
	for _, x := range res {
		r.results = append(r.results, work.SettleResult{Task: x.Task, Err: x.Err})
	}
}

func (o SubmitManyOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] submitMany failed as a whole: %v", r.err)}
	}
	if len(r.results) != len(o.Items) {
		return []string{fmt.Sprintf("[model] submitMany returned %d results for %d requests", len(r.results), len(o.Items))}
	}
	var fails []string
	for i, it := range o.Items {
		mi := *m
		mi.exp = m.exp.settles[i]
		ri := &result{sys: r.sys, task: r.results[i].Task, err: r.results[i].Err}
		for _, f := range it.check(&mi, ri) {
			fails = append(fails, fmt.Sprintf("item %d: %s", i, f))
		}
	}
	return fails
}

// genSubmitMany draws 1 to 6 submits of one session, often reusing a key within the batch.
func genSubmitMany(r *rand.Rand, m *model) op {
	s := r.Intn(m.nSess)
	n := 1 + r.Intn(6)
	o := SubmitManyOp{S: s}
	for range n {
		it, ok := genSubmit(r, m).(SubmitOp)
		if !ok {
			continue
		}
		it.S = s
		if len(o.Items) > 0 && r.Intn(3) == 0 { // a key of the batch again, same or changed
			prev := o.Items[r.Intn(len(o.Items))]
			if prev.Key >= 0 {
				it.Key = prev.Key
				if r.Intn(2) == 0 {
					it = prev
				}
			}
		}
		o.Items = append(o.Items, it)
	}
	if len(o.Items) == 0 {
		o.Items = []SubmitOp{{S: s, Key: -1}}
	}
	return o
}

// classifySubmitMany names the cases of a batch.
func classifySubmitMany(add func(...string), o SubmitManyOp, e expect) {
	add("submit many")
	keys := map[int]bool{}
	for i, it := range o.Items {
		if it.Key >= 0 && keys[it.Key] {
			add("submit many with a key repeated in the batch")
		}
		if it.Key >= 0 {
			keys[it.Key] = true
		}
		if e.settles[i].err == errConflict {
			add("submit many with a conflict")
		}
	}
}
