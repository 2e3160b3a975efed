package pebblelog

import (
	"context"
	"fmt"
	"testing"
)

func logBytes(t *testing.T, s *Store) uint64 {
	t.Helper()
	n, err := s.db.EstimateDiskUsage([]byte{prefixEvent}, []byte{prefixEvent + 1})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// After a prune, CompactPruned compacts the log span it emptied: the pruned events leave the
// sstables now, not whenever Pebble's own picker gets to them (with a store this small, never).
// A second call with nothing pruned since compacts nothing; a later prune's call starts where
// the first ended.
func TestCompactPrunedReclaimsTheLog(t *testing.T) {
	ctx := context.Background()
	s := openT(t, t.TempDir(), &Options{})
	for i := range 200 {
		settleT(t, s, fmt.Sprintf("t%03d", i), sec(100+i))
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	full := logBytes(t, s)
	if full == 0 {
		t.Fatal("the log takes no space in sstables after a flush")
	}
	if res := pruneT(t, s, sec(200), 1000); res.Tasks != 100 {
		t.Fatalf("prune removed %+v, want 100 tasks", res)
	}
	if err := s.CompactPruned(ctx); err != nil {
		t.Fatal(err)
	}
	if half := logBytes(t, s); half > full*3/5 {
		t.Errorf("after pruning half the log and compacting it, the log takes %d bytes of %d", half, full)
	}
	from := s.comp.from
	if want := uint64(301); from != want { // 100 tasks of 3 events
		t.Errorf("compacted the log up to seq %d, want %d", from, want)
	}
	if err := s.CompactPruned(ctx); err != nil || s.comp.from != from {
		t.Errorf("a second compaction with nothing pruned since: %v, compacted up to %d (was %d)", err, s.comp.from, from)
	}
	if res := pruneT(t, s, sec(1000), 1000); res.Tasks != 100 {
		t.Fatalf("prune removed %+v, want the other 100 tasks", res)
	}
	if err := s.CompactPruned(ctx); err != nil {
		t.Fatal(err)
	}
	if left := logBytes(t, s); left > full/10 {
		t.Errorf("after pruning the whole log and compacting it, the log takes %d bytes of %d", left, full)
	}
	mustVerify(t, s)
}

// CompactPrunedLater runs in the background; Close stops it and waits, and a request after
// Close does nothing (Pebble panics on a closed database).
func TestCompactPrunedLaterAndClose(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	for i := range 50 {
		settleT(t, s, fmt.Sprintf("t%03d", i), sec(100+i))
	}
	pruneT(t, s, sec(1000), 1000)
	s.CompactPrunedLater()
	s.CompactPrunedLater() // while the first runs: one more after it
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.CompactPrunedLater()
	if s.comp.running {
		t.Error("a compaction was started after Close")
	}
}
