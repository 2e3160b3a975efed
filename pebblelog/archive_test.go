package pebblelog

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// PlanPrune names the group Txn.Prune would remove, with the log's bytes; PruneArchived
// removes it only when every event of it was archived, else nothing.
func TestPlanPruneAndPruneArchived(t *testing.T) {
	dir := t.TempDir()
	settledStore(t, dir)
	s := openT(t, dir, &Options{})
	defer s.Close()
	ctx := context.Background()
	const before, limit = 1 << 62, 2
	var planned []uint64
	seqs, more, err := s.PlanPrune(ctx, before, limit, func(seq uint64, raw []byte) error {
		want, ok, err := s.RawEvent(context.Background(), seq)
		if err != nil || !ok || !bytes.Equal(raw, want) {
			t.Fatalf("seq %d: planned bytes differ from the log's (%v, %v)", seq, ok, err)
		}
		planned = append(planned, seq)
		return nil
	})
	if err != nil || len(seqs) == 0 {
		t.Fatalf("plan: %v more=%v %v", seqs, more, err)
	}
	if !slicesEqual(planned, seqs) {
		t.Fatalf("fn saw %v, PlanPrune returned %v", planned, seqs)
	}
	err = s.Update(ctx, func(tx *Txn) error {
		_, err := tx.PruneArchived(before, limit, seqs[:len(seqs)-1])
		return err
	})
	if !errors.Is(err, ErrNotArchived) {
		t.Fatalf("a group with an unarchived event: %v", err)
	}
	if r, err := s.PrunedRanges(context.Background()); err != nil || len(r) != 0 {
		t.Fatalf("a refused group pruned %v (%v)", r, err)
	}
	var res PruneResult
	if err := s.Update(ctx, func(tx *Txn) error {
		var err error
		res, err = tx.PruneArchived(before, limit, seqs)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r, err := s.PrunedRanges(context.Background())
	if err != nil || res.Events != uint64(len(seqs)) || r.Count() != uint64(len(seqs)) {
		t.Fatalf("pruned %+v, ranges %v (%v), planned %d", res, r, err, len(seqs))
	}
	for _, seq := range seqs {
		if !r.Contains(seq) {
			t.Fatalf("planned seq %d was not pruned (%v)", seq, r)
		}
	}
	mustVerify(t, s)
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
