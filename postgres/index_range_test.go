package postgres

import (
	"context"
	"math/rand/v2"
	"testing"

	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/indextest"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
)

// TestScanIndexRange: a scan reads the entries with At in [from, to] (the keyset pager
// starting after (from-1, max)), through a View and through the writer's txn, in the due
// index (priorities, joined to tasks) and in the lease index (bare); rows of another kind are
// not read.
func TestScanIndexRange(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	e, _ := openEngine(t, dsn, nil)
	admin := connect(t, dsn)
	r := rand.New(rand.NewPCG(7, 8))
	due := indextest.Entries(r, 60, true)
	for _, x := range due {
		if _, err := admin.Exec(ctx, `INSERT INTO due (at, seq, task_id, priority) VALUES ($1, $2, $3, $4)`,
			x.At, int64(x.Seq), []byte(x.ID), x.Pri); err != nil {
			t.Fatal(err)
		}
	}
	var leases []projection.IndexEntry
	for i, x := range indextest.Entries(r, 60, false) {
		kind := "b"
		if i%2 == 0 {
			kind, leases = "a", append(leases, x)
		}
		if _, err := admin.Exec(ctx, `INSERT INTO kind_leases (kind, at, seq, task_id) VALUES ($1, $2, $3, $4)`,
			[]byte(kind), x.At, int64(x.Seq), []byte(x.ID)); err != nil {
			t.Fatal(err)
		}
	}
	check := func(through string, r projection.Reader) {
		indextest.Check(t, through+": due index", func(from, to int64, fn func(projection.IndexEntry) bool) error {
			return r.ScanIndex(projection.IndexDue, "", from, to, fn)
		}, due)
		indextest.Check(t, through+": lease index", func(from, to int64, fn func(projection.IndexEntry) bool) error {
			return r.ScanIndex(projection.IndexKindLeases, "a", from, to, fn)
		}, leases)
	}
	if err := e.View(ctx, func(r projection.Reader) error { check("view", r); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := e.Update(ctx, func(tx engineapi.Txn) error { check("writer", tx); return nil }); err != nil {
		t.Fatal(err)
	}
}
