package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// TestImportPrunedPebbleStore (issue 24 §5): a Pebble store opened by work.Open with
// retention, whose settled tasks were pruned in two rounds (the log's start and a run in its
// middle) while others stayed pending or running, moves to PostgreSQL through replay's export
// and import: the import's Verify is clean, every replay command reads the same on both, and
// the PostgreSQL queue goes on from there (claims the surviving tasks, prunes, verifies
// clean). Importing a pruned store used to fail with ErrNotNext at the first gap.
func TestImportPrunedPebbleStore(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	q, err := work.Open(dir, &work.Options{Retention: time.Hour, PruneInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	submit := func(from, to int, when time.Duration) {
		t.Helper()
		for i := from; i < to; i++ {
			req := work.TaskRequest{Kind: fmt.Sprintf("k%d", i%2), IdempotencyKey: fmt.Sprint(i), Input: []byte(fmt.Sprintf(`{"n":%d}`, i))}
			if _, err := q.Session(fmt.Sprintf("s%d", i%3)).SubmitAt(ctx, req, at(when)); err != nil {
				t.Fatal(err)
			}
		}
	}
	settle := func(n int, when time.Duration) {
		t.Helper()
		ds, err := q.ClaimDueAt(ctx, at(when), time.Minute, n)
		if err != nil || len(ds) != n {
			t.Fatalf("claim %d: %d, %v", n, len(ds), err)
		}
		for i, d := range ds {
			o := work.Success([]byte(`"ok"`))
			if i%4 == 3 {
				o = work.Failure("no")
			}
			if _, err := q.FinishAt(ctx, d, o, at(when+time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	}
	submit(0, 20, 0)
	settle(12, time.Minute)
	if r, err := q.Prune(ctx, at(time.Hour)); err != nil || r.Tasks != 12 {
		t.Fatalf("first prune: %+v, %v", r, err)
	}
	submit(20, 40, 2*time.Hour)
	settle(10, 2*time.Hour+time.Minute)
	submit(40, 45, 3*time.Hour)
	if r, err := q.Prune(ctx, at(2*time.Hour+30*time.Minute)); err != nil || r.Tasks != 10 {
		t.Fatalf("second prune: %+v, %v", r, err)
	}
	if _, err := q.ClaimDueAt(ctx, at(3*time.Hour), 10*time.Minute, 3); err != nil { // left running
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if got := prunedRangesOf(t, dir); len(got) < 2 || got[0].From != 1 {
		t.Fatalf("pruned ranges of the source: %v, want the start and a middle run", got)
	}

	dsn := pgtest.Schema(t)
	out := mustReplay(t, "import", writeFile(t, "pruned.wlog", exportWire(t, dir)), dsn)
	if !strings.Contains(out, "verify: the stored projection equals a rebuild from the log") {
		t.Fatalf("import of the pruned store says:\n%s", out)
	}
	compareStores(t, dir, dsn, [][]string{{"state", "--no-cache", "--json", "--show-tokens"}, {"stats", "--json"},
		{"log", "--json", "--show-tokens"}, {"verify"}})

	pq, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	ds, err := pq.ClaimDueAt(ctx, at(4*time.Hour), time.Minute, 100)
	if err != nil || len(ds) != 23 { // the 20 pending and the 3 whose leases expired
		t.Fatalf("claims on the imported queue: %d, %v", len(ds), err)
	}
	for _, d := range ds {
		if _, err := pq.FinishAt(ctx, d, work.Success(nil), at(4*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := pq.Prune(ctx, at(5*time.Hour)); err != nil || r.Tasks != len(ds) {
		t.Fatalf("prune of the imported queue: %+v, %v", r, err)
	}
	if err := pq.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
