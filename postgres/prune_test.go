package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

var pruneBase = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// openQueue is postgres.Open of dsn with the default options, closed when tb ends.
func openQueue(tb testing.TB, dsn string) *work.Queue {
	tb.Helper()
	q, err := postgres.Open(context.Background(), dsn, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { q.Close() })
	return q
}

// finishOld submits n tasks in session s (keys prefix+i) at pruneBase, claims and finishes
// them a second and two later, and returns their deliveries.
func finishOld(t testing.TB, q *work.Queue, s, prefix string, n int) []work.TaskDelivery {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		r := work.TaskRequest{Kind: "old", IdempotencyKey: fmt.Sprintf("%s%d", prefix, i)}
		if _, err := q.Session(s).SubmitAt(ctx, r, pruneBase); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := q.ClaimKindsAt(ctx, []string{"old"}, pruneBase.Add(time.Second), time.Hour, n)
	if err != nil || len(ds) != n {
		t.Fatalf("claimed %d of %d old tasks: %v", len(ds), n, err)
	}
	for _, d := range ds {
		if _, err := q.FinishAt(ctx, d, work.Success(nil), pruneBase.Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	return ds
}

// TestPruneBesideConcurrentSubmits prunes on one queue while two queues on the same schema
// (as two processes would) submit: the prune removes exactly the old finished tasks and
// their events, every submit of the load is kept, the unprunable tasks read as before, both
// queues see the pruned tasks gone, and Verify is clean on both.
func TestPruneBesideConcurrentSubmits(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q1 := openQueue(t, dsn)
	q2 := openQueue(t, dsn)

	const old = 300 // more than one prune group (256)
	deliveries := finishOld(t, q1, "old", "k", old)
	// Unprunable: pending far in the future, running on a long lease, finished with an
	// unacknowledged completion wake.
	var keep []work.Task
	for i := range 5 {
		task, err := q1.Session("keep").SubmitAt(ctx, work.TaskRequest{Kind: "later", RunAt: pruneBase.AddDate(100, 0, i)}, pruneBase)
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, task)
	}
	for _, kind := range []string{"running", "woken"} {
		r := work.TaskRequest{Kind: kind}
		if kind == "woken" {
			r.Wake = work.WakeOnCompletion
		}
		task, err := q2.Session("keep").SubmitAt(ctx, r, pruneBase)
		if err != nil {
			t.Fatal(err)
		}
		ds, err := q2.ClaimKindsAt(ctx, []string{kind}, pruneBase.Add(time.Second), 1000*time.Hour, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim of %s: %d, %v", kind, len(ds), err)
		}
		if kind == "woken" {
			if _, err := q2.FinishAt(ctx, ds[0], work.Success(nil), pruneBase.Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		keep = append(keep, task)
	}
	for i, k := range keep {
		got, found, err := q1.Session("keep").Task(ctx, k.ID)
		if err != nil || !found {
			t.Fatalf("kept task %s: %v, %v", k.ID, found, err)
		}
		keep[i] = got
	}
	var head uint64
	if err := q1.ReadLog(ctx, 1, func(ev events.Event) error { head = ev.Head().Seq; return nil }); err != nil {
		t.Fatal(err)
	}

	// The load: both queues submit while q2 prunes.
	const perQueue = 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	submitted := map[string]string{} // id -> session
	var loadErr error
	for qi, q := range []*work.Queue{q1, q2} {
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := fmt.Sprintf("live%d-%d", qi, g)
				for i := range perQueue / 2 {
					task, err := q.Session(s).Submit(ctx, work.TaskRequest{Kind: "live", IdempotencyKey: fmt.Sprint(i)})
					mu.Lock()
					if err != nil {
						loadErr = errors.Join(loadErr, err)
					} else {
						submitted[task.ID] = s
					}
					mu.Unlock()
				}
			}()
		}
	}
	res, perr := q2.Prune(ctx, pruneBase.Add(time.Hour))
	wg.Wait()
	if perr != nil || loadErr != nil {
		t.Fatalf("Prune: %v; submits: %v", perr, loadErr)
	}
	if res.Tasks != old || res.Wakes != 0 || res.Events != 3*old {
		t.Fatalf("Prune removed %+v, want %d tasks, no wake, %d events", res, old, 3*old)
	}
	if len(submitted) != 2*perQueue {
		t.Fatalf("%d tasks submitted, want %d", len(submitted), 2*perQueue)
	}

	ro, err := postgres.OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if rs, err := ro.PrunedRanges(ctx); err != nil || rs.Count() != 3*old || rs[0].From != 1 {
		t.Fatalf("PrunedRanges: %v (%d sequences), %v; want %d from 1", rs, rs.Count(), err, 3*old)
	}
	if p, err := ro.Verify(ctx, postgres.VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("Verify of the read-only store: %v, %v", p, err)
	}
	for _, q := range []*work.Queue{q1, q2} {
		for id, s := range submitted {
			if _, found, err := q.Session(s).Task(ctx, id); err != nil || !found {
				t.Fatalf("submitted task %s: found %v, %v", id, found, err)
			}
		}
		for _, k := range keep {
			got, found, err := q.Session("keep").Task(ctx, k.ID)
			if err != nil || !found || !reflect.DeepEqual(got, k) {
				t.Fatalf("kept task %s changed:\n got %+v (%v, %v)\nwant %+v", k.ID, got, found, err, k)
			}
		}
		for _, d := range deliveries {
			if _, found, err := q.Session("old").Task(ctx, d.Task.ID); err != nil || found {
				t.Fatalf("pruned task %s: found %v, %v", d.Task.ID, found, err)
			}
		}
		// The log: the events of the kept tasks and the load, with the pruned ones gone.
		var n int
		if err := q.ReadLog(ctx, 1, func(ev events.Event) error { n++; return nil }); err != nil {
			t.Fatalf("ReadLog after Prune: %v", err)
		}
		if want := int(head) - 3*old + 2*perQueue; n != want {
			t.Fatalf("the log holds %d events, want %d", n, want)
		}
		if err := q.Verify(ctx); err != nil {
			t.Fatalf("Verify after Prune beside submits: %v", err)
		}
	}
}

// TestPruneForgetsOtherQueuesCaches: a queue that finished a task holds it (and its key) in
// its writer's cache; another queue prunes it, which does not move the log head. The first
// queue must see it gone: its key is free for a new task, and a late Finish of it is
// ErrTaskNotFound (log_head.prunes tells its writer that its cache is stale).
func TestPruneForgetsOtherQueuesCaches(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q1 := openQueue(t, dsn)
	q2 := openQueue(t, dsn)

	ds := finishOld(t, q1, "s", "K", 1)
	if res, err := q2.Prune(ctx, pruneBase.Add(time.Hour)); err != nil || res.Tasks != 1 {
		t.Fatalf("Prune: %+v, %v", res, err)
	}
	if _, err := q1.FinishAt(ctx, ds[0], work.Success(nil), pruneBase.Add(3*time.Second)); !errors.Is(err, work.ErrTaskNotFound) {
		t.Fatalf("a late Finish of the pruned task on the other queue: %v, want ErrTaskNotFound", err)
	}
	again, err := q1.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "old", IdempotencyKey: "K0"}, pruneBase.Add(4*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if again.ID == ds[0].Task.ID {
		t.Fatalf("a Submit with the pruned task's key on the other queue returned the pruned task %s", again.ID)
	}
	for _, q := range []*work.Queue{q1, q2} {
		if err := q.Verify(ctx); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	}
}

// Options.Retention prunes in the background: a task finished long ago goes within a few
// intervals, a pending one stays; Close stops the pruner; negative values are refused.
func TestBackgroundPruning(t *testing.T) {
	ctx := context.Background()
	for _, o := range []postgres.Options{{Retention: -time.Second}, {Retention: time.Hour, PruneInterval: -time.Second}} {
		if _, err := postgres.Open(ctx, "postgres://invalid", &o); !errors.Is(err, work.ErrInvalidOptions) {
			t.Errorf("Open with %+v: %v, want ErrInvalidOptions", o, err)
		}
	}
	dsn := pgtest.Schema(t)
	q, err := postgres.Open(ctx, dsn, &postgres.Options{Retention: time.Hour, PruneInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ds := finishOld(t, q, "s", "k", 3)
	pending, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "later", RunAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		gone := 0
		for _, d := range ds {
			if _, found, err := q.Session("s").Task(ctx, d.Task.ID); err != nil {
				t.Fatal(err)
			} else if !found {
				gone++
			}
		}
		if gone == len(ds) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s of background pruning %d of %d old tasks are gone", gone, len(ds))
		}
	}
	if _, found, err := q.Session("s").Task(ctx, pending.ID); err != nil || !found {
		t.Fatalf("the pending task: found %v, %v", found, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q2 := openQueue(t, dsn)
	if err := q2.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
