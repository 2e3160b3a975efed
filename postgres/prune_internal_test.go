package postgres

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// A prune in the same transaction as the commands that made its subjects prunable: the
// subjects' events are still the group's pending ones (dropped, their sequences recorded as
// pruned), their records were put or changed by the group, and a Submit after the prune in
// the same group takes the freed key again (the key's deletion is sent before its insert).
func TestPruneInTheGroupThatMadeItPrunable(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	at := func(sec int64) time.Time { return time.Unix(sec, 0) }
	task, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "K"}, at(1000))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, at(1000), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	if _, err := s.WakeAt(ctx, work.WakeRequest{IdempotencyKey: "W"}, at(1000)); err != nil {
		t.Fatal(err)
	}
	wds, err := q.ClaimWakesAt(ctx, at(1000), time.Minute, 1)
	if err != nil || len(wds) != 1 {
		t.Fatalf("claim of the wake: %d, %v", len(wds), err)
	}

	// Hold the writer in a group of its own until the next commands are queued, in order.
	var fired atomic.Int32
	release := make(chan struct{})
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(*pgx.Conn) {
		if fired.Add(1) == 1 {
			<-release
		}
	}
	errs := make(chan error, 5)
	go func() { _, err := q.Session("other").SubmitAt(ctx, work.TaskRequest{Kind: "x"}, at(1000)); errs <- err }()
	for fired.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	queued := func(n int) {
		t.Helper()
		waitFor(t, time.Minute, fmt.Sprintf("%d commands queued", n), func() bool { return len(e.cmds) >= n })
	}
	go func() { _, err := q.FinishAt(ctx, ds[0], work.Success(nil), at(1001)); errs <- err }()
	queued(1)
	go func() { errs <- q.AckWakeAt(ctx, wds[0], at(1001)) }()
	queued(2)
	pruned := make(chan work.PruneResult, 1)
	go func() { r, err := q.Prune(ctx, at(1500)); pruned <- r; errs <- err }()
	queued(3)
	again := make(chan work.Task, 1)
	go func() {
		// SubmitMany: a Submit of key K would be answered by read-first from the committed
		// task (TestRepeatIsARead), before the prune, and never reach the writer's queue.
		rs, err := s.SubmitManyAt(ctx, []work.TaskRequest{{Kind: "k", IdempotencyKey: "K"}}, at(1002))
		if err == nil {
			again <- rs[0].Task
			err = rs[0].Err
		} else {
			again <- work.Task{}
		}
		errs <- err
	}()
	queued(4)
	close(release)
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	tracing(e).beforeCommit = nil
	e.ordinaryCommits = false
	if n := fired.Load(); n != 2 {
		t.Fatalf("%d commits, want 2: the held group, then the four commands in one", n)
	}
	if r := <-pruned; r.Tasks != 1 || r.Wakes != 1 || r.Events != 6 {
		t.Fatalf("Prune removed %+v, want the task, the wake and their 6 events", r)
	}
	if tk := <-again; tk.ID == task.ID {
		t.Fatalf("the Submit after the prune returned the pruned task %s", tk.ID)
	}
	if got := logLen(t, q); got != 2 {
		t.Errorf("the log holds %d events, want 2 (the other submit and the new one)", got)
	}
	mustVerify(t, q)
}
