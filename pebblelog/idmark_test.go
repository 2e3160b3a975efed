package pebblelog

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// TestIDMarkNeverMissesAPutID: an idMark must never call an id absent once it was put, through
// any number of prunes, whatever the order of the puts (a duplicate id would pass the fold's
// check unseen); and it must call absent the new ids above its floor, in and out of order, so
// that they need no Pebble Get.
func TestIDMarkNeverMissesAPutID(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	m := newIDMark(idKey(prefixTask, "id-000100000"))
	n := 3*recentMax + 17
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("id-%09d", 100000+i*2) // even numbers: the odd ones are never put
	}
	// Reordered within a sliding window, as ids drawn by concurrent callers reach the writer.
	for i := range ids {
		j := min(n-1, i+r.IntN(64))
		ids[i], ids[j] = ids[j], ids[i]
	}
	var put []string
	for i, id := range ids {
		m.put(id)
		put = append(put, id)
		if i%50 == 49 { // a batch committed
			m.settle()
			if len(m.recent) > recentMax {
				t.Fatalf("after %d puts recent holds %d ids, more than %d", i+1, len(m.recent), recentMax)
			}
		}
		if i%97 == 0 || i == n-1 {
			for _, p := range put {
				if m.absent(p) {
					t.Fatalf("after %d puts (floor %q) id %q, put before, is called absent", i+1, m.floor, p)
				}
			}
		}
	}
	if m.absent("id-000100000") || m.absent("id-000000001") {
		t.Error("ids at or below the floor set at Open are called absent")
	}
	// Odd ids were never put: those above the floor are absent without a Get, out of order too.
	misses := 0
	for i := range n {
		id := fmt.Sprintf("id-%09d", 100000+i*2+1)
		if id > m.floor && !m.absent(id) {
			t.Errorf("id %q, above the floor %q and never put, is not called absent", id, m.floor)
		}
		if !m.absent(id) {
			misses++
		}
	}
	if above := n - misses; above < recentKeep {
		t.Errorf("only %d of the ids never put are known absent, want at least the newest %d", above, recentKeep)
	}
	// With no record at Open, every id is judged by recent alone.
	e := newIDMark(nil)
	if !e.absent("a") {
		t.Error("an empty store's mark calls a new id present")
	}
	e.put("a")
	if e.absent("a") {
		t.Error("an empty store's mark calls a put id absent")
	}
}

// TestIDMarkKnowsABatchsIDs: the ids of one batch share their millisecond (SubmitMany's
// 10,000 all do), so they reach the writer in random order; every new id of such a batch is
// known absent, with no Get, however many came before it in the batch. A floor raised during
// the batch left most of the later ones below it. Once the batch committed, recent is bounded.
func TestIDMarkKnowsABatchsIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	id := func() string { return fmt.Sprintf("task_0192%028x", r.Uint64()>>8) }
	m := newIDMark(idKey(prefixTask, "task_0191"))
	known := 0
	const n = 10000
	for range n {
		x := id()
		if m.absent(x) {
			known++
		}
		m.put(x)
	}
	if known != n {
		t.Errorf("%d of a batch's %d new ids were known absent, want all", known, n)
	}
	m.settle()
	if len(m.recent) > recentMax {
		t.Errorf("after the batch recent holds %d ids, more than %d", len(m.recent), recentMax)
	}
	if x := id(); x > m.floor && !m.absent(x) {
		t.Errorf("a new id above the floor is not known absent")
	}
}

// TestDuplicateIDsRefusedOutOfOrder: ids put below the greatest one (as concurrent callers'
// ids arrive), in more batches than the writer's set of recent ids holds, stay refused as
// duplicates, with the record cache off so that only the store's own check stands between a
// duplicate and the fold; and ids never put, out of order too, are still accepted.
func TestDuplicateIDsRefusedOutOfOrder(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{RecordCacheSize: -1, NoSync: true})
	r := rand.New(rand.NewPCG(3, 4))
	n := 2*recentMax + 300
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("t%07d", i*2)
	}
	for i := range ids {
		j := min(n-1, i+r.IntN(200))
		ids[i], ids[j] = ids[j], ids[i]
	}
	for i := 0; i < n; i += 100 {
		var evs []events.Event
		for _, id := range ids[i:min(n, i+100)] {
			evs = append(evs, submitted("s1", id, sec(1), false))
		}
		appendEvents(t, s, evs...)
	}
	check := func(s *Store) {
		t.Helper()
		for i := 0; i < n; i += 7 {
			if err := update(s, submitted("s1", ids[i], sec(2), false)); !errors.Is(err, projection.ErrInconsistent) {
				t.Fatalf("duplicate of %s (put %d of %d): err = %v, want ErrInconsistent", ids[i], i+1, n, err)
			}
		}
	}
	check(s)
	appendEvents(t, s, submitted("s1", fmt.Sprintf("t%07d", 2*n-3), sec(3), false)) // below the max, never put
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, &Options{RecordCacheSize: -1, NoSync: true})
	check(s)
	mustVerify(t, s)
}
