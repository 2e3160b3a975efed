package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// settledEvents counts the task_settled and task_released events of each task in q's log.
func settledEvents(t *testing.T, q *work.Queue) (settled, released map[string]int) {
	t.Helper()
	settled, released = map[string]int{}, map[string]int{}
	err := q.ReadLog(context.Background(), 1, func(ev events.Event) error {
		switch e := ev.(type) {
		case *events.TaskSettled:
			settled[e.TaskID]++
		case *events.TaskReleased:
			released[e.TaskID]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return settled, released
}

// TestSharedWriterLostAnswerResolved: a follower's round whose answer is lost with its
// connection to the elected process (cut after the round committed there, or before it ran)
// is resolved by the follower, as a lost COMMIT is in plain mode: a Finish that committed
// there is reported committed (it was ErrBackend "outcome unknown", issue 43 item 6b), one
// that did not run there is committed here, each settled once; in a round, a release that
// committed there is reported done, and the claims are made here with working leases.
func TestSharedWriterLostAnswerResolved(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	leader := openShared(t, dsn)
	defer leader.Close()
	waitElected(t, leader, true)
	follower := openShared(t, dsn)
	defer follower.Close()
	waitElected(t, follower, false)

	s := follower.Session("lost")
	for i := range 8 {
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // distinct submission times: the claims take them in order
	}
	wctx := work.WithWorker(ctx, "follower")
	ds, err := follower.ClaimDue(wctx, time.Minute, 5)
	if err != nil || len(ds) != 5 {
		t.Fatalf("claimed %d, %v; want 5", len(ds), err)
	}

	// cut makes the elected process cut the connection once, at the given point of the next
	// round it serves; it reports the rounds the elected process ran meanwhile.
	cut := func(afterRun bool, do func()) (ranThere int64) {
		t.Helper()
		waitElected(t, follower, false) // a connection to the elected process, to lose
		var done atomic.Bool
		postgres.CutSharedWriterAnswers(leader, func(ran bool) bool {
			return ran == afterRun && done.CompareAndSwap(false, true)
		})
		defer postgres.CutSharedWriterAnswers(leader, nil)
		_, _, _, served0 := postgres.SharedWriterState(leader)
		do()
		_, _, _, served1 := postgres.SharedWriterState(leader)
		if !done.Load() {
			t.Fatal("the round did not go to the elected process")
		}
		return served1 - served0
	}

	// 1. A Finish committed by the elected process, its answer lost.
	var task work.Task
	ranThere := cut(true, func() {
		task, err = follower.Finish(wctx, ds[0], work.Success(json.RawMessage(`{"n":0}`)))
	})
	if err != nil || task.State != work.TaskSucceeded || string(task.Outcome.Output) != `{"n":0}` {
		t.Fatalf("a Finish committed by the elected process, its answer lost: %+v, %v; want it reported succeeded", task, err)
	}
	if ranThere != 1 {
		t.Fatalf("the elected process ran %d rounds, want the Finish", ranThere)
	}

	// 2. A Finish the elected process never ran: committed here.
	ranThere = cut(false, func() {
		task, err = follower.Finish(wctx, ds[1], work.Failure("boom"))
	})
	if err != nil || task.State != work.TaskFailed || task.Outcome.Error != "boom" {
		t.Fatalf("a Finish cut before it ran there: %+v, %v; want it committed here", task, err)
	}
	if ranThere != 0 {
		t.Fatalf("the elected process ran %d rounds, want none", ranThere)
	}

	// 3. A round (a finish, a release, a claim of one) committed there, its answer lost: the
	// finish and the release are reported done, the claim is made here (the one made there
	// is lost with the answer: its lease runs out, as after a crash).
	var res []work.SettleResult
	var more []work.TaskDelivery
	ranThere = cut(true, func() {
		res, more, err = follower.SettleAndClaim(wctx, []work.Settle{
			{Delivery: ds[2], Outcome: &work.Outcome{State: work.TaskSucceeded}},
			{Delivery: ds[3], Release: &work.ReleaseRequest{Reason: "later"}},
		}, nil, time.Minute, 1)
	})
	if err != nil || len(res) != 2 || len(more) != 1 || ranThere != 1 {
		t.Fatalf("a round committed there, its answer lost: %d results, %d claims, %v (ran there: %d)", len(res), len(more), err, ranThere)
	}
	if res[0].Err != nil || res[0].Task.State != work.TaskSucceeded {
		t.Fatalf("the round's finish: %+v %v", res[0].Task, res[0].Err)
	}
	if res[1].Err != nil || res[1].Task.State != work.TaskPending {
		t.Fatalf("the round's release: %+v %v; want it reported done", res[1].Task, res[1].Err)
	}
	if got, err := follower.Finish(wctx, more[0], work.Success(nil)); err != nil || got.State != work.TaskSucceeded {
		t.Fatalf("the claim made when the round was resolved: %+v %v", got, err)
	}

	// 4. A Finish whose delivery lost its task before (another attempt holds it): the
	// elected process refuses it, and so does the resolution here.
	stale := ds[4]
	stale.Attempt = 9
	ranThere = cut(true, func() { _, err = follower.Finish(wctx, stale, work.Success(nil)) })
	if !errors.Is(err, work.ErrStaleDelivery) || ranThere != 1 {
		t.Fatalf("a stale Finish, its answer lost: %v (ran there %d); want ErrStaleDelivery", err, ranThere)
	}

	settled, released := settledEvents(t, follower)
	for i, d := range ds[:3] {
		if settled[d.Task.ID] != 1 {
			t.Errorf("task %d settled %d times, want once", i, settled[d.Task.ID])
		}
	}
	if released[ds[3].Task.ID] != 1 || settled[ds[3].Task.ID] != 0 {
		t.Errorf("the released task: %d releases, %d settles; want one release", released[ds[3].Task.ID], settled[ds[3].Task.ID])
	}
	if err := follower.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
