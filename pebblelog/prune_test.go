package pebblelog

import (
	"context"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
)

// countKeys counts the keys with prefix p.
func countKeys(t *testing.T, db pebble.Reader, p byte) int {
	t.Helper()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n
}

// settledStore writes a store in dir of settled tasks in two sessions (each task's submit,
// claim and settlement), with no completion wakes: every task is prunable.
func settledStore(t *testing.T, dir string) {
	t.Helper()
	s := openT(t, dir, &Options{})
	for i := range 6 {
		session, task := fmt.Sprintf("s%d", i%2), fmt.Sprintf("t%d", i)
		appendEvents(t, s, submitted(session, task, sec(3*i+1), false))
		appendEvents(t, s, claimed(session, task, sec(3*i+2), 1, "tok"))
		appendEvents(t, s, settled(session, task, sec(3*i+3), 1, "tok"))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// A store of settled tasks holds one retention index entry per task and one subject index
// entry per event; Verify agrees; and a prune of everything prunable leaves it verifiable,
// with the pruned ranges explaining the gaps, and nothing prunable left.
func TestPruneEverything(t *testing.T) {
	dir := t.TempDir()
	settledStore(t, dir)
	s := openT(t, dir, &Options{})
	defer s.Close()
	last, err := s.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, s.db, prefixSubject); uint64(n) != last {
		t.Errorf("the subject index has %d entries, the log %d events", n, last)
	}
	prunable := countKeys(t, s.db, prefixPrunable)
	if prunable == 0 {
		t.Fatal("no retention index entry; the store has settled tasks")
	}
	mustVerify(t, s)
	var res PruneResult
	err = s.Update(context.Background(), func(tx *Txn) error {
		var err error
		res, err = tx.Prune(1<<62, 1000)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Tasks+res.Wakes < prunable || res.Events == 0 || res.More {
		t.Errorf("Prune removed %+v; the retention index had %d entries", res, prunable)
	}
	if n := countKeys(t, s.db, prefixPrunable); n != 0 {
		t.Errorf("%d retention entries left after pruning everything", n)
	}
	ranges, err := s.PrunedRanges(context.Background())
	if err != nil || ranges.Count() != res.Events {
		t.Errorf("pruned ranges %v (%v) hold %d sequences, Prune removed %d events", ranges, err, ranges.Count(), res.Events)
	}
	var kept uint64
	if err := s.ReadLog(context.Background(), 0, func(ev events.Event) error {
		if ranges.Contains(ev.Head().Seq) {
			t.Errorf("event %d is in a pruned range but still in the log", ev.Head().Seq)
		}
		kept++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if kept+res.Events != last {
		t.Errorf("the log keeps %d events and lost %d, of %d", kept, res.Events, last)
	}
	mustVerify(t, s)
	s.Close()
	s = openT(t, dir, &Options{})
	mustVerify(t, s)
}

// Verify tells a pruned gap from damage: a deleted event, a pruned range that holds a
// retained event, and a range without a gap are each a problem.
func TestVerifyPrunedRanges(t *testing.T) {
	dir := t.TempDir()
	settledStore(t, dir)
	s := openT(t, dir, &Options{})
	defer s.Close()
	err := s.Update(context.Background(), func(tx *Txn) error {
		_, err := tx.Prune(1<<62, 1000)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, s)
	ranges, err := s.PrunedRanges(context.Background())
	if err != nil || len(ranges) == 0 {
		t.Fatalf("ranges %v, %v", ranges, err)
	}
	r := ranges[0]
	damage := func(name string, f func(b *pebble.Batch) error) {
		t.Run(name, func(t *testing.T) {
			snap := s.db.NewBatch()
			if err := f(snap); err != nil {
				t.Fatal(err)
			}
			if err := snap.Commit(pebble.Sync); err != nil {
				t.Fatal(err)
			}
			problems, err := s.Verify(context.Background(), VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(problems) == 0 {
				t.Fatalf("Verify found nothing after %s", name)
			}
			t.Logf("%s: %s", name, problems[0])
		})
	}
	// Shrink the first range by one: its last sequence becomes an unexplained gap.
	damage("an unexplained gap", func(b *pebble.Batch) error {
		if r.To == r.From {
			return b.Delete(prunedKey(r.From), nil)
		}
		return b.Set(prunedKey(r.From), encodeCount(int64(r.To-1)), nil)
	})
}
