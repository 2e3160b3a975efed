package work_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestTaskPhases: a pending task is available when due, scheduled when its run time is
// later, retrying when a worker released it for later; Tasks filters by phase at the
// listing's time, on every page of a long session.
func TestTaskPhases(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	s := q.Session("s")
	now := time.Now()
	later := now.Add(time.Hour)

	submit := func(kind string, runAt time.Time) work.Task {
		t.Helper()
		task, err := s.SubmitAt(ctx, work.TaskRequest{Kind: kind, RunAt: runAt}, now)
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	var want = map[string]work.Phase{}
	// Forty of each, so that the phase filter reads more than one page of the session.
	for i := range 40 {
		want[submit("due", time.Time{}).ID] = work.PhaseAvailable
		want[submit("later", later).ID] = work.PhaseScheduled
		r := submit(fmt.Sprintf("retry-%d", i), time.Time{})
		ds, err := q.ClaimKindsAt(ctx, []string{r.Kind}, now, time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %v, %v", ds, err)
		}
		if _, err := q.ReleaseAt(ctx, ds[0], work.ReleaseRequest{RunAt: later, Reason: "backoff"}, now); err != nil {
			t.Fatal(err)
		}
		want[r.ID] = work.PhaseRetrying
	}
	running := submit("run", time.Time{})
	if _, err := q.ClaimKindsAt(ctx, []string{"run"}, now, time.Hour, 1); err != nil {
		t.Fatal(err)
	}

	all, err := s.Tasks(ctx, work.TaskFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range all {
		if got := task.PhaseAt(now); got != want[task.ID] {
			t.Errorf("%s (%s): phase %q, want %q", task.ID, task.Kind, got, want[task.ID])
		}
	}
	// Once its run time has come, a task released for a retry is available again.
	for _, task := range all {
		if want[task.ID] == work.PhaseRetrying && task.PhaseAt(later) != work.PhaseAvailable {
			t.Errorf("a retrying task at its run time: %q", task.PhaseAt(later))
		}
	}

	for _, p := range []work.Phase{work.PhaseAvailable, work.PhaseScheduled, work.PhaseRetrying} {
		got, err := s.Tasks(ctx, work.TaskFilter{States: []work.TaskState{work.TaskPending}, Phases: []work.Phase{p}, Limit: 25})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 25 {
			t.Errorf("phase %s, limit 25: %d tasks", p, len(got))
		}
		for _, task := range got {
			if want[task.ID] != p {
				t.Errorf("phase %s listed %s (%q)", p, task.ID, want[task.ID])
			}
		}
		rest, err := s.Tasks(ctx, work.TaskFilter{Phases: []work.Phase{p}, After: got[len(got)-1].ID, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		// Without States, the running task is listed too: only pending tasks have phases.
		if n := len(got) + len(rest); n != 41 {
			t.Errorf("phase %s: %d tasks over two pages", p, n)
		}
	}
	if _, err := s.Tasks(ctx, work.TaskFilter{Phases: []work.Phase{"queued"}, Limit: 1}); !errors.Is(err, work.ErrInvalidRequest) {
		t.Errorf("an unknown phase: %v", err)
	}
	if running.PhaseAt(now) != work.PhaseAvailable {
		t.Errorf("a pending task's snapshot: %q", running.PhaseAt(now))
	}
}
