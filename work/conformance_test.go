package work_test

import (
	"context"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestConformanceInMemory runs the suite every backend must pass against NewInMemory. A
// reopened queue is the seed's WorkQueue::with_backend over the retained backend.
func TestConformanceInMemory(t *testing.T) {
	worktest.Run(t, worktest.Harness{
		New:    func(t *testing.T) *work.Queue { return work.NewInMemory() },
		Reopen: func(t *testing.T, q *work.Queue) *work.Queue { return work.New(work.BackendOf(q)) },
	})
}

// TestConformanceRerun runs the suite against an in-memory queue whose every command runs its
// closure twice, the first time against the state before the previous command and for
// nothing (work's rerunEngine): what pebblelog's writer does to the commands of a failed
// group. Every answer must come from the last run alone.
func TestConformanceRerun(t *testing.T) {
	worktest.Run(t, worktest.Harness{
		New:    func(t *testing.T) *work.Queue { return work.NewRerunQueue() },
		Reopen: func(t *testing.T, q *work.Queue) *work.Queue { return work.New(work.BackendOf(q)) },
	})
}

// A second NewInMemory shares nothing with the first (seed:
// replacing_the_in_memory_backend_drops_process_local_state).
func TestNewInMemoryHasNoState(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(100, 0)
	first := work.NewInMemory()
	defer first.Close()
	task, err := first.Session("session_example").SubmitAt(ctx, work.TaskRequest{Kind: "ephemeral"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Session("session_example").WakeAt(ctx, work.WakeRequest{}, now); err != nil {
		t.Fatal(err)
	}

	replacement := work.NewInMemory()
	defer replacement.Close()
	got, found, err := replacement.Session("session_example").Task(ctx, task.ID)
	if err != nil || found || got.ID != "" {
		t.Errorf("Task on a new queue = %+v, %v, %v; want nothing", got, found, err)
	}
	if ds, err := replacement.ClaimDueAt(ctx, now, time.Minute, 10); err != nil || len(ds) != 0 {
		t.Errorf("ClaimDueAt on a new queue = %d deliveries, %v", len(ds), err)
	}
	if ws, err := replacement.ClaimWakesAt(ctx, now, time.Minute, 10); err != nil || len(ws) != 0 {
		t.Errorf("ClaimWakesAt on a new queue = %d deliveries, %v", len(ws), err)
	}
	var n int
	if err := replacement.ReadLog(ctx, 0, func(events.Event) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("ReadLog on a new queue read %d events, %v", n, err)
	}
	if err := replacement.Verify(ctx); err != nil {
		t.Error(err)
	}
}
