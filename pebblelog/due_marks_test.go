package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// claimOne is a claim's walk through the writer: the first due entry at now, deleted, and
// the index points the walk stepped over (Pebble's count: live keys and tombstones).
func claimOne(t *testing.T, s *Store, ix projection.Index, part string, now int64) (claimed projection.IndexEntry, steps uint64) {
	t.Helper()
	if err := s.Update(context.Background(), func(tx *Txn) error {
		found := false
		before := tx.w.dueSteps
		if err := tx.w.ScanIndex(ix, part, math.MinInt64, now, func(e projection.IndexEntry) bool {
			claimed, found = e, true
			return false
		}); err != nil {
			return err
		}
		steps = tx.w.dueSteps - before
		if !found {
			return errors.New("nothing due")
		}
		return tx.w.DeleteIndex(ix, part, claimed)
	}); err != nil {
		t.Fatal(err)
	}
	return claimed, steps
}

// A claim's walk of a due index with tasks at 8 priorities and a future run of a higher one
// steps over a bounded number of index points however many claims came before it: each run
// is entered at its own mark, not at its start over the deleted entries of the claims made
// from it (issue 23: the claim cost grew with the claims made so far). The claims take the
// priorities in order, each run's entries in time order.
func TestDueWalkStepsBounded(t *testing.T) {
	const perPri, pris, future = 150, 8, 64
	forEachDueIndex(t, func(t *testing.T, s *Store, c dueIndex) {
		seq := uint64(0)
		put := func(tx *Txn, pri, at int64) error {
			seq++
			return tx.w.PutIndex(c.ix, c.part, projection.IndexEntry{Pri: pri, At: at, Seq: seq, ID: fmt.Sprint("t", seq)})
		}
		if err := s.Update(context.Background(), func(tx *Txn) error {
			for i := range future {
				if err := put(tx, pris+1, 1_000_000+int64(i)); err != nil {
					return err
				}
			}
			for i := range perPri * pris {
				if err := put(tx, int64(i%pris), int64(i)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var worst uint64
		for n := range perPri * pris {
			e, steps := claimOne(t, s, c.ix, c.part, 10_000)
			if want := int64(pris - 1 - n/perPri); e.Pri != want {
				t.Fatalf("claim %d took priority %d, want %d", n, e.Pri, want)
			}
			if n >= perPri { // past the first run: the old walk stepped over its tombstones
				worst = max(worst, steps)
			}
		}
		// A walk steps over the future run's first entry, at most one tombstone (the
		// previous claim's) per run it enters, the run's claimed entry, and Pebble's
		// second look at a key it seeks past: a few points. The walk from each run's
		// start stepped over every claimed entry of the runs above, up to perPri·pris.
		if worst > 16 {
			t.Errorf("a claim's walk stepped over up to %d index points; want at most 16", worst)
		}
	})
}

// dueIndex is a due index with priorities and the partition the tests walk.
type dueIndex struct {
	ix   projection.Index
	part string
}

// forEachDueIndex runs fn as a subtest on a fresh store for each due index with priorities:
// the due index and a partition of the per-kind one.
func forEachDueIndex(t *testing.T, fn func(t *testing.T, s *Store, c dueIndex)) {
	for _, c := range []dueIndex{{projection.IndexDue, ""}, {projection.IndexKindDue, "k"}} {
		t.Run(c.ix.Describe(c.part), func(t *testing.T) {
			fn(t, openT(t, t.TempDir(), &Options{}), c)
		})
	}
}

// The writer's walk with its marks reads what the reader's walk reads, through random puts,
// deletes and partial scans of a partition with several priorities, in batches of several
// commands, some discarded: a mark is raised only to what its batch saw, lowered by every put
// below it, and a discarded batch's marks are dropped.
func TestDueWalkMarksMatchReader(t *testing.T) {
	forEachDueIndex(t, func(t *testing.T, s *Store, c dueIndex) {
		r := rand.New(rand.NewPCG(23, 1))
		pris := []int64{events.MaxPriority, 5, 3, 2, 0, -1, events.MinPriority}
		model := map[uint64]projection.IndexEntry{} // committed
		seq := uint64(0)
		errDiscard := errors.New("discard")
		for batch := range 300 {
			// The batch's operations, drawn before it runs: a failed command runs again.
			type op struct {
				put, del bool
				e        projection.IndexEntry
				to       int64
				limit    int
			}
			var ops []op
			live := slices.SortedFunc(maps.Values(model), compareEntries) // sorted: the draws repeat
			for range 1 + r.IntN(6) {
				switch k := r.IntN(10); {
				case k < 4:
					seq++
					ops = append(ops, op{put: true, e: projection.IndexEntry{Pri: pris[r.IntN(len(pris))], At: int64(r.IntN(40)), Seq: seq, ID: fmt.Sprint("e", seq)}})
				case k < 6 && len(live) > 0:
					ops = append(ops, op{del: true, e: live[r.IntN(len(live))]})
				default:
					ops = append(ops, op{to: int64(r.IntN(50)) - 5, limit: 1 + r.IntN(4)})
				}
			}
			discard := r.IntN(5) == 0
			var view map[uint64]projection.IndexEntry
			err := s.Update(context.Background(), func(tx *Txn) error {
				view = maps.Clone(model)
				for i, o := range ops {
					switch {
					case o.put:
						view[o.e.Seq] = o.e
						if err := tx.w.PutIndex(c.ix, c.part, o.e); err != nil {
							return err
						}
					case o.del:
						delete(view, o.e.Seq)
						if err := tx.w.DeleteIndex(c.ix, c.part, o.e); err != nil {
							return err
						}
					default:
						var got, want []projection.IndexEntry
						if err := tx.w.ScanIndex(c.ix, c.part, math.MinInt64, o.to, func(e projection.IndexEntry) bool {
							got = append(got, e)
							return len(got) < o.limit
						}); err != nil {
							return err
						}
						for _, e := range view {
							if e.At <= o.to {
								want = append(want, e)
							}
						}
						slices.SortFunc(want, compareEntries)
						want = want[:min(len(want), o.limit)]
						if !slices.Equal(got, want) {
							return fmt.Errorf("batch %d, op %d: scan to %d, limit %d:\n got  %v\n want %v", batch, i, o.to, o.limit, got, want)
						}
					}
				}
				if discard {
					return errDiscard
				}
				return nil
			})
			switch {
			case err != nil && !errors.Is(err, errDiscard):
				t.Fatal(err)
			case !discard:
				model = view
			}
		}
	})
}

func compareEntries(x, y projection.IndexEntry) int {
	switch {
	case x.Less(y):
		return -1
	case y.Less(x):
		return 1
	}
	return 0
}
