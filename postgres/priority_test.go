package postgres

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// A queue made before the due indexes had a priority (an older build: no priority column,
// no priority indexes) gets them at the next Open, its waiting tasks at priority 0, and
// claims by priority from then on. A read-only open before that reads it as it is.
func TestOpenAddsPriorityToAnOlderQueue(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	s := schemaName(dsn)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	old, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "k"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	execSQL(t, "DROP INDEX "+s+".due_priority; DROP INDEX "+s+".kind_due_priority; "+
		"ALTER TABLE "+s+".due DROP COLUMN priority; ALTER TABLE "+s+".kind_due DROP COLUMN priority")

	// Read-only, before any Open of this build: the due rows read at priority 0, Verify agrees.
	ro, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var due []projection.IndexEntry
	err = ro.View(ctx, func(r projection.Reader) error {
		for _, scan := range []func(func(projection.IndexEntry) bool) error{
			func(fn func(projection.IndexEntry) bool) error {
				return r.ScanIndex(projection.IndexDue, "", math.MinInt64, t0.Add(time.Minute).UnixNano(), fn)
			},
			func(fn func(projection.IndexEntry) bool) error {
				return r.ScanIndex(projection.IndexKindDue, "k", math.MinInt64, t0.Add(time.Minute).UnixNano(), fn)
			},
		} {
			if err := scan(func(e projection.IndexEntry) bool { due = append(due, e); return true }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || len(due) != 2 || due[0].ID != old.ID || due[1].ID != old.ID || due[0].Pri != 0 {
		t.Fatalf("read-only scans of the older queue: %+v, %v", due, err)
	}
	if p, err := ro.Verify(ctx, VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("read-only Verify of the older queue: %v %v", p, err)
	}
	ro.Close()

	q, err = Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	hi, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "k", Priority: 9}, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lo, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "k", Priority: -9}, t0)
	if err != nil {
		t.Fatal(err)
	}
	for i, kinds := range [][]string{nil, {"k"}} {
		var ds []work.TaskDelivery
		now := t0.Add(time.Duration(i) * time.Hour)
		if kinds == nil {
			ds, err = q.ClaimDueAt(ctx, now.Add(time.Minute), time.Second, 10)
		} else {
			ds, err = q.ClaimKindsAt(ctx, kinds, now.Add(time.Minute), time.Second, 10)
		}
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range ds {
			got = append(got, d.Task.ID)
		}
		if want := []string{hi.ID, old.ID, lo.ID}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Fatalf("claim %d (kinds %v): %v, want %v", i, kinds, got, want)
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
