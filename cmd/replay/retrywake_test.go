package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestTaskExplainsALateEarlierWake: `replay task` on a task retried before its completion
// wake was acknowledged, whose next run ended with a wake of its own before the first was
// acknowledged. The first wake's acknowledgment counts it off the task, so the explanation
// folds every completion wake's events, not only the last one's: the folded task equals the
// stored one, and the retry's line says the wake stayed deliverable.
func TestTaskExplainsALateEarlierWake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s := q.Session("alpha")
	task, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(0))
	must(err)
	run := func(sec int, o work.Outcome) {
		t.Helper()
		ds, err := q.ClaimDueAt(ctx, at(sec), time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim at %d: %v, %v", sec, ds, err)
		}
		_, err = q.FinishAt(ctx, ds[0], o, at(sec+1))
		must(err)
	}
	run(1, work.Failure("first"))
	_, err = s.RetryAt(ctx, task.ID, time.Time{}, at(3)) // the first wake not acknowledged
	must(err)
	run(4, work.Failure("second"))
	ws, err := q.ClaimWakesAt(ctx, at(6), time.Minute, 10)
	if err != nil || len(ws) != 2 {
		t.Fatalf("claimed %d wakes (%v), want both runs'", len(ws), err)
	}
	for _, w := range ws {
		must(q.AckWakeAt(ctx, w, at(7)))
	}
	must(q.Close())

	out := mustReplay(t, "task", dir, task.ID)
	if strings.Contains(out, "differs") {
		t.Errorf("replay task: the folded task differs from the stored one:\n%s", out)
	}
	if !strings.Contains(out, "stays deliverable with its outcome (failed)") {
		t.Errorf("replay task does not say the first wake stayed deliverable:\n%s", out)
	}
}
