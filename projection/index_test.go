package projection

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/worklog/worklog/events"
)

// checkScan checks one scan of an index up to maxAt: entries in (At, Seq) order, none later
// than maxAt, and exactly the entries of want (the whole index) that are not.
func checkScan(t *testing.T, what string, fn func(int64, func(IndexEntry) bool) error, maxAt int64, want []IndexEntry) {
	t.Helper()
	got := scan(t, fn, maxAt)
	for i, e := range got {
		if e.At > maxAt {
			t.Errorf("%s up to %d: entry %v is later", what, maxAt, e)
		}
		if i > 0 && !got[i-1].Less(e) {
			t.Errorf("%s up to %d: %v before %v", what, maxAt, got[i-1], e)
		}
	}
	var exp []IndexEntry
	for _, e := range want {
		if e.At <= maxAt {
			exp = append(exp, e)
		}
	}
	slices.SortFunc(exp, compareEntries)
	if !slices.Equal(got, exp) {
		t.Errorf("%s up to %d:\n got  %v\n want %v", what, maxAt, got, exp)
	}
	// fn returning false stops the scan.
	if len(got) >= 2 {
		calls := 0
		if err := fn(maxAt, func(IndexEntry) bool { calls++; return calls < 2 }); err != nil {
			t.Fatal(err)
		}
		if calls != 2 {
			t.Errorf("%s: a scan stopped after 2 entries made %d calls", what, calls)
		}
	}
}

func TestDueIndexOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	var evs []events.Event
	due := map[string]int64{} // the expected key time of every task in the index
	seqOf := map[string]uint64{}
	for i := range 120 {
		id := fmt.Sprintf("t%03d", i)
		at := int64(r.IntN(10))
		var ev *events.TaskSubmitted
		if r.IntN(2) == 0 {
			ev = submitAt(id, at, int64(r.IntN(20))-5) // ties, and times before the submission
		} else {
			ev = submit(id, at)
		}
		evs = append(evs, ev)
		due[id] = ev.ScheduledAt()
		seqOf[id] = uint64(len(evs))
	}
	m := fold(t, number(slices.Clone(evs)))
	entries := func() []IndexEntry {
		var out []IndexEntry
		for id, at := range due {
			out = append(out, IndexEntry{At: at, Seq: seqOf[id], ID: id})
		}
		return out
	}
	for _, maxAt := range []int64{math.MinInt64, -6, -5, 0, 3, 7, 14, 15, math.MaxInt64} {
		checkScan(t, "due", scanner(m, IndexDue, ""), maxAt, entries())
	}

	// Claim everything due at 10: each claimed task re-enters at its lease expiry, 40.
	apply := func(ev events.Event) {
		t.Helper()
		ev.Head().Seq = uint64(len(evs) + 1)
		if err := Apply(m, ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	for _, e := range scan(t, scanner(m, IndexDue, ""), 10) {
		apply(claim(e.ID, 10, 1, "tok-"+e.ID))
		due[e.ID] = 10 + lease
	}
	for _, maxAt := range []int64{9, 10, 14, 39, 40, math.MaxInt64} {
		checkScan(t, "due after claims", scanner(m, IndexDue, ""), maxAt, entries())
	}
	// Settle some running tasks, cancel some pending and some running ones, reclaim others
	// at their expiry.
	n := 0
	for _, x := range m.Tasks() {
		n++
		switch {
		case x.State == events.StateRunning && n%4 == 0:
			apply(settle(x.ID, 20, 1, x.LeaseToken, events.StateSucceeded))
			delete(due, x.ID)
		case x.State == events.StateRunning && n%4 == 1:
			apply(cancel(x.ID, 21)) // stays running, stays due at its expiry
		case x.State == events.StateRunning && n%4 == 2:
			apply(claim(x.ID, 40, 2, "tok2-"+x.ID))
			due[x.ID] = 40 + lease
		case x.State == events.StatePending && n%3 == 0:
			apply(cancel(x.ID, 22))
			delete(due, x.ID)
		}
	}
	for _, maxAt := range []int64{14, 39, 40, 69, 70, math.MaxInt64} {
		checkScan(t, "due after settlements", scanner(m, IndexDue, ""), maxAt, entries())
	}
	checkInvariants(t, m)
	if d := m.Diff(fold(t, evs)); len(d) > 0 {
		t.Errorf("refold differs: %q", d)
	}
}

func TestWakeIndexOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	var evs []events.Event
	avail := map[string]int64{}
	seqOf := map[string]uint64{}
	for i := range 100 {
		id := fmt.Sprintf("w%03d", i)
		at := int64(r.IntN(12)) - 2
		evs = append(evs, wake(id, at))
		avail[id] = at
		seqOf[id] = uint64(len(evs))
	}
	m := fold(t, number(slices.Clone(evs)))
	entries := func() []IndexEntry {
		var out []IndexEntry
		for id, at := range avail {
			out = append(out, IndexEntry{At: at, Seq: seqOf[id], ID: id})
		}
		return out
	}
	for _, maxAt := range []int64{math.MinInt64, -3, -2, 0, 5, 9, math.MaxInt64} {
		checkScan(t, "wakes", scanner(m, IndexWakes, ""), maxAt, entries())
	}
	apply := func(ev events.Event) {
		t.Helper()
		ev.Head().Seq = uint64(len(evs) + 1)
		if err := Apply(m, ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	// Claim those available at 5: they re-enter at their lease expiry.
	for _, e := range scan(t, scanner(m, IndexWakes, ""), 5) {
		apply(wclaim(e.ID, 5, 1, "tok-"+e.ID))
		avail[e.ID] = 5 + lease
	}
	for _, maxAt := range []int64{4, 5, 9, 34, 35, math.MaxInt64} {
		checkScan(t, "wakes after claims", scanner(m, IndexWakes, ""), maxAt, entries())
	}
	n := 0
	for _, w := range m.Wakes() {
		n++
		switch {
		case w.Claimed() && n%3 == 0:
			apply(ack(w.ID, 10, 1, w.LeaseToken))
			delete(avail, w.ID)
		case w.Claimed() && n%3 == 1:
			apply(wclaim(w.ID, 35, 2, "tok2-"+w.ID))
			avail[w.ID] = 35 + lease
		case !w.Claimed() && n%2 == 0:
			apply(wclaim(w.ID, 12, 1, "tok-"+w.ID))
			apply(ack(w.ID, 13, 1, "tok-"+w.ID))
			delete(avail, w.ID)
		}
	}
	for _, maxAt := range []int64{9, 34, 35, 64, 65, math.MaxInt64} {
		checkScan(t, "wakes after acks", scanner(m, IndexWakes, ""), maxAt, entries())
	}
	checkInvariants(t, m)
	if d := m.Diff(fold(t, evs)); len(d) > 0 {
		t.Errorf("refold differs: %q", d)
	}
}

// TestIndexEntryLess: At first, then Seq; the id plays no part.
func TestIndexEntryLess(t *testing.T) {
	cases := []struct {
		a, b IndexEntry
		less bool
	}{
		{IndexEntry{At: 1, Seq: 9, ID: "z"}, IndexEntry{At: 2, Seq: 1, ID: "a"}, true},
		{IndexEntry{At: 2, Seq: 1, ID: "a"}, IndexEntry{At: 1, Seq: 9, ID: "z"}, false},
		{IndexEntry{At: 1, Seq: 1, ID: "z"}, IndexEntry{At: 1, Seq: 2, ID: "a"}, true},
		{IndexEntry{At: 1, Seq: 2, ID: "a"}, IndexEntry{At: 1, Seq: 1, ID: "z"}, false},
		{IndexEntry{At: 1, Seq: 1, ID: "a"}, IndexEntry{At: 1, Seq: 1, ID: "b"}, false},
		{IndexEntry{At: math.MinInt64, Seq: 1, ID: ""}, IndexEntry{At: math.MaxInt64, Seq: 0, ID: ""}, true},
	}
	for _, c := range cases {
		if got := c.a.Less(c.b); got != c.less {
			t.Errorf("%v.Less(%v) = %v", c.a, c.b, got)
		}
	}
}
