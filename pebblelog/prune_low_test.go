package pebblelog

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// settleT submits, claims and settles task id of session s, settled at at.
func settleT(t *testing.T, s *Store, id string, at int64) {
	t.Helper()
	appendEvents(t, s, submitted("s1", id, at-2e9, false))
	appendEvents(t, s, claimed("s1", id, at-1e9, 1, "tok-"+id))
	appendEvents(t, s, settled("s1", id, at, 1, "tok-"+id))
}

func pruneT(t *testing.T, s *Store, before int64, limit int) PruneResult {
	t.Helper()
	var res PruneResult
	if err := s.Update(context.Background(), func(tx *Txn) error {
		var err error
		res, err = tx.Prune(before, limit)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return res
}

// The groups of one large prune scan the retention index from its low, not from its first
// key: the entries earlier groups removed are tombstones there, and stepping over all of them
// made each group dearer than the one before (BenchmarkPruneLatency). A scan raises the low to
// the first live entry it meets: the next group starts at the first entry of the one before,
// so it steps over one group's tombstones at most.
func TestPruneScansRetentionIndexFromItsLow(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	for i := range 12 {
		settleT(t, s, fmt.Sprintf("t%02d", i), sec(100+i))
	}
	low := func() []byte {
		var low []byte
		if err := s.Update(context.Background(), func(tx *Txn) error {
			low = bytes.Clone(tx.w.lows.prunable)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return low
	}
	// A task's entry is keyed by its settlement time and its first event (three a task).
	for g, want := range [][]byte{pruneKey(sec(100), 1), pruneKey(sec(104), 13), pruneKey(sec(108), 25)} {
		if res := pruneT(t, s, sec(1000), 4); res.Tasks != 4 {
			t.Fatalf("group %d removed %+v, want 4 tasks", g, res)
		}
		if got := low(); !bytes.Equal(got, want) {
			t.Errorf("after group %d the retention index's low is %x, want %x", g, got, want)
		}
	}
	if n := countKeys(t, s.db, prefixPrunable); n != 0 {
		t.Errorf("%d retention index entries left after pruning everything", n)
	}
	mustVerify(t, s)
}

// A subject may become prunable at a time before the retention index's low (a settlement
// whose now is earlier than others'): the put lowers the low, and the next prune finds it.
func TestPruneFindsEntryBelowTheLow(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	for i := range 10 {
		settleT(t, s, fmt.Sprintf("t%02d", i+10), sec(100+i))
	}
	if res := pruneT(t, s, sec(1000), 5); res.Tasks != 5 {
		t.Fatalf("the first group removed %+v, want 5 tasks", res)
	}
	// Nothing before sec(90): the scan finds nothing and raises the low to its bound.
	if res := pruneT(t, s, sec(90), 5); res.Tasks != 0 {
		t.Fatalf("a prune before sec(90) removed %+v", res)
	}
	settleT(t, s, "t00", sec(50))
	if res := pruneT(t, s, sec(90), 100); res.Tasks != 1 {
		t.Errorf("the prune before sec(90) after t00 settled at sec(50) removed %+v, want t00", res)
	}
	if res := pruneT(t, s, sec(1000), 100); res.Tasks != 5 || res.More {
		t.Errorf("the last prune removed %+v, want the 5 tasks left", res)
	}
	if n := countKeys(t, s.db, prefixPrunable); n != 0 {
		t.Errorf("%d retention index entries left after pruning everything", n)
	}
	mustVerify(t, s)
}
