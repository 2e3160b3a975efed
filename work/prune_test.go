package work_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// Options.Retention starts background pruning on Open: a task finished an hour ago goes
// within a few intervals, one finished in the future (by the caller's clock) stays, and
// Close stops the pruner.
func TestBackgroundPruning(t *testing.T) {
	dir := t.TempDir()
	q, err := work.Open(dir, &work.Options{Retention: time.Minute, PruneInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := q.Session("s")
	past := time.Now().Add(-time.Hour)
	old, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k"}, past)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, past, time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v %v", ds, err)
	}
	if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), past); err != nil {
		t.Fatal(err)
	}
	recent, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ds, err = q.ClaimDueAt(ctx, time.Now(), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v %v", ds, err)
	}
	if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), time.Now()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, found, err := s.Task(ctx, old.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the task finished an hour ago is still there after 10 s of background pruning every 5 ms")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, found, err := s.Task(ctx, recent.ID); err != nil || !found {
		t.Fatalf("the task finished just now was pruned (found %v, %v): retention is a minute", found, err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestPruneOptionsValidation(t *testing.T) {
	for _, c := range []struct {
		o     work.Options
		field string
	}{
		{work.Options{Retention: -time.Second}, "Retention"},
		{work.Options{Retention: time.Hour, PruneInterval: -time.Second}, "PruneInterval"},
	} {
		_, err := work.Open(t.TempDir(), &c.o)
		wantOption(t, fmt.Sprintf("Open(%+v)", c.o), err, "work.Options", c.field)
	}
}

// A queue made by New over worklog's own backend (the in-memory harness's Reopen) prunes.
func TestPruneThroughNew(t *testing.T) {
	q := work.New(work.BackendOf(work.NewInMemory()))
	if _, err := q.Prune(context.Background(), time.Now()); err != nil {
		t.Fatalf("Prune over worklog's own backend through New: %v", err)
	}
}
