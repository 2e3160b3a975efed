package work

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
)

// TestEventSignalKnowsEveryType: a new event type must be classified for the waiters (design
// §8): does it make work claimable, or move an index's earliest entry earlier?
func TestEventSignalKnowsEveryType(t *testing.T) {
	for _, ty := range events.AllTypes() {
		if _, ok := eventSignal(ty); !ok {
			t.Errorf("event type %s: eventSignal (work/wait.go) does not say whether it wakes waiters", ty)
		}
	}
}

// waitBackends runs fn on the in-memory queue and on a durable one.
func waitBackends(t *testing.T, fn func(t *testing.T, q *Queue)) {
	t.Run("mem", func(t *testing.T) {
		q := NewInMemory()
		defer q.Close()
		fn(t, q)
	})
	t.Run("durable", func(t *testing.T) {
		q, err := Open(t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		fn(t, q)
	})
}

// waitAsync starts wait in a goroutine and returns the channel its result arrives on.
func waitAsync(wait func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- wait() }()
	return ch
}

// mustBlock fails when the waiter returned within d.
func mustBlock(t *testing.T, ch <-chan error, d time.Duration) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("the waiter returned (%v) with nothing to claim", err)
	case <-time.After(d):
	}
}

// mustReturn fails unless the waiter returns nil within d.
func mustReturn(t *testing.T, ch <-chan error, d time.Duration) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("the waiter returned %v, want nil", err)
		}
	case <-time.After(d):
		t.Fatalf("the waiter did not return within %v", d)
	}
}

func TestWaitTasksReturnsAtOnceWhenDue(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		if _, err := q.Session("s").Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		mustReturn(t, waitAsync(func() error { return q.WaitTasks(ctx, nil) }), 5*time.Second)
	})
}

func TestWaitTasksWokenBySubmit(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		ch := waitAsync(func() error { return q.WaitTasks(ctx, nil) })
		mustBlock(t, ch, 50*time.Millisecond)
		if _, err := q.Session("s").Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		mustReturn(t, ch, 5*time.Second)
	})
}

func TestWaitTasksTimerAtScheduledTime(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		runAt := time.Now().Add(150 * time.Millisecond)
		if _, err := q.Session("s").Submit(ctx, TaskRequest{Kind: "k", RunAt: runAt}); err != nil {
			t.Fatal(err)
		}
		// The submit's signal may wake a waiter that started before it; one that starts
		// after it sleeps until the task's time.
		if err := q.WaitTasks(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if now := time.Now(); now.Before(runAt) {
			t.Fatalf("returned %v before the task's time", runAt.Sub(now))
		}
		ds, err := q.ClaimDue(ctx, time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim after the wait: %d deliveries, %v", len(ds), err)
		}
	})
}

func TestWaitTasksTimerAtLeaseExpiry(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		if _, err := q.Session("s").Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		ds, err := q.ClaimDue(ctx, 100*time.Millisecond, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %d, %v", len(ds), err)
		}
		expiry := ds[0].LeaseExpiresAt
		if err := q.WaitTasks(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if now := time.Now(); now.Before(expiry) {
			t.Fatalf("returned %v before the lease expired", expiry.Sub(now))
		}
	})
}

func TestWaitTasksContextAndClose(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx, cancel := context.WithCancel(context.Background())
		ch := waitAsync(func() error { return q.WaitTasks(ctx, nil) })
		mustBlock(t, ch, 20*time.Millisecond)
		cancel()
		err := <-ch
		if !errors.Is(err, ErrBackend) || !errors.Is(err, context.Canceled) {
			t.Fatalf("after cancel: %v, want ErrBackend wrapping context.Canceled", err)
		}

		ch = waitAsync(func() error { return q.WaitWakes(context.Background()) })
		mustBlock(t, ch, 20*time.Millisecond)
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-ch:
			if !errors.Is(err, ErrBackend) || !errors.Is(err, ErrClosed) {
				t.Fatalf("after Close: %v, want ErrBackend wrapping ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not end the wait")
		}
	})
}

func TestWaitWakes(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		s := q.Session("s")
		// A task that is not due does not wake a wake waiter... (its submit is a task signal)
		ch := waitAsync(func() error { return q.WaitWakes(ctx) })
		mustBlock(t, ch, 30*time.Millisecond)
		task, err := s.Submit(ctx, TaskRequest{Kind: "k", RunAt: time.Now().Add(time.Hour), Wake: WakeOnCompletion})
		if err != nil {
			t.Fatal(err)
		}
		mustBlock(t, ch, 30*time.Millisecond)
		// ...its cancel records a completion wake, which does.
		if _, err := s.Cancel(ctx, task.ID); err != nil {
			t.Fatal(err)
		}
		mustReturn(t, ch, 5*time.Second)

		ws, err := q.ClaimWakes(ctx, time.Minute, 10)
		if err != nil || len(ws) != 1 {
			t.Fatalf("claim wakes: %d, %v", len(ws), err)
		}
		if err := q.AckWake(ctx, ws[0]); err != nil {
			t.Fatal(err)
		}
		ch = waitAsync(func() error { return q.WaitWakes(ctx) })
		mustBlock(t, ch, 30*time.Millisecond)
		if _, err := s.Wake(ctx, WakeRequest{Payload: []byte(`1`)}); err != nil {
			t.Fatal(err)
		}
		mustReturn(t, ch, 5*time.Second)
	})
}

// TestWaitNoLostWakeup races waiters against submits: each round a waiter starts while a
// submit commits, and every waiter must return (a signal that fell between its read of the
// state and its wait would leave it blocked until the test's deadline).
func TestWaitNoLostWakeup(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		s := q.Session("s")
		for i := range 200 {
			ch := waitAsync(func() error { return q.WaitTasks(ctx, nil) })
			if _, err := s.Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-ch:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: the waiter missed the submit", i)
			}
			ds, err := q.ClaimDue(ctx, time.Hour, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("claim: %d, %v", len(ds), err)
			}
			if _, err := q.Finish(ctx, ds[0], Success(nil)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestWaitIgnoresClaimsAndSettles: claims and settlements never make work claimable, so a
// waiter sleeps through them (under load they must cost waiters nothing).
func TestWaitIgnoresClaimsAndSettles(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		if _, err := q.Session("s").Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		ds, err := q.ClaimDue(ctx, time.Hour, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %d, %v", len(ds), err)
		}
		ch := waitAsync(func() error { return q.WaitTasks(ctx, nil) })
		mustBlock(t, ch, 30*time.Millisecond)
		if _, err := q.Finish(ctx, ds[0], Success(nil)); err != nil {
			t.Fatal(err)
		}
		mustBlock(t, ch, 30*time.Millisecond)
		if _, err := q.Session("s").Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		mustReturn(t, ch, 5*time.Second)
	})
}

func TestWaitCustomBackendRefused(t *testing.T) {
	q := New(&recordingCustom{})
	err := q.WaitTasks(context.Background(), nil)
	if !errors.Is(err, ErrBackend) || !errors.Is(err, errUnsupported) || !strings.Contains(err.Error(), "work.Waiter") {
		t.Fatalf("custom backend: %v, want ErrBackend naming work.Waiter", err)
	}
	if err := q.WaitTasks(context.Background(), []string{" "}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("blank kind: %v, want ErrInvalidRequest", err)
	}
}

// recordingCustom is a custom Backend: the Backend methods of a real queue, no signals.
type recordingCustom struct{ Backend }

// watcherEngine is an in-memory engine whose "other processes" are the test: a value sent on
// changed is a commit elsewhere.
type watcherEngine struct {
	*memEngine
	changed chan struct{}
}

func (e *watcherEngine) Changed() <-chan struct{} { return e.changed }

var _ engineapi.Watcher = (*watcherEngine)(nil)

func TestWaitWatcherWakesWaiters(t *testing.T) {
	e := &watcherEngine{memEngine: newMemEngine(), changed: make(chan struct{}, 1)}
	q := newEngineQueue(e, engineapi.Config{})
	defer q.Close()
	ctx := context.Background()
	// Two waiters, one signal: both wake (the forwarder broadcasts).
	a := waitAsync(func() error { return q.WaitTasks(ctx, nil) })
	b := waitAsync(func() error { return q.WaitWakes(ctx) })
	mustBlock(t, a, 30*time.Millisecond)
	mustBlock(t, b, time.Millisecond)
	e.changed <- struct{}{}
	mustReturn(t, a, 5*time.Second)
	mustReturn(t, b, 5*time.Second)
}

// The timer is at the earliest due task of any priority: a high-priority task scheduled later
// does not hide a lower-priority one due sooner (the due index's first entry is the high
// one's), for all tasks and for the kinds named.
func TestWaitTasksTimerAcrossPriorities(t *testing.T) {
	waitBackends(t, func(t *testing.T, q *Queue) {
		ctx := context.Background()
		now := time.Now()
		soon, late := now.Add(150*time.Millisecond), now.Add(time.Hour)
		s := q.Session("s")
		for _, r := range []TaskRequest{
			{Kind: "k", Priority: 9, RunAt: late},
			{Kind: "k", Priority: 5, RunAt: late.Add(time.Minute)},
			{Kind: "k", Priority: -3, RunAt: soon},
		} {
			if _, err := s.Submit(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		for _, kinds := range [][]string{nil, {"k"}} {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := q.WaitTasks(wctx, kinds)
			cancel()
			if err != nil {
				t.Fatalf("kinds %v: %v (the waiter slept past the low-priority task's time)", kinds, err)
			}
			if time.Now().Before(soon) {
				t.Fatalf("kinds %v: returned before the task's time", kinds)
			}
		}
	})
}

// TestWaitTasksTimerAtNextTick: a waiter for a schedule's kind, with no task due, wakes at the
// schedule's next tick (design §4.6), under a kind policy too (the wait of a queue with
// policies is its own path); a waiter for another kind does not.
func TestWaitTasksTimerAtNextTick(t *testing.T) {
	for _, withPolicy := range []bool{false, true} {
		waitBackends(t, func(t *testing.T, q *Queue) {
			ctx := context.Background()
			if withPolicy {
				if err := q.SetKindPolicy(ctx, "other", KindPolicy{MaxRunning: 1}); err != nil {
					t.Fatal(err)
				}
			}
			set := time.Now()
			if err := q.Session("s").SetScheduleAt(ctx, Schedule{Name: "tick", Cron: "@every 1s", Task: TaskRequest{Kind: "k"}}, set); err != nil {
				t.Fatal(err)
			}
			scs, err := q.Session("s").Schedules(ctx)
			if err != nil || len(scs) != 1 || scs[0].Next.IsZero() {
				t.Fatalf("Schedules: %v, %v", scs, err)
			}
			tick := scs[0].Next // @every rounds to the second (robfig/cron)
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			if err := q.WaitTasks(short, []string{"unrelated"}); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a waiter for another kind: %v, want its context's deadline", err)
			}
			long, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := q.WaitTasks(long, []string{"k"}); err != nil {
				t.Fatalf("a waiter for the schedule's kind: %v, want woken at the tick", err)
			}
			if now := time.Now(); now.Before(tick) {
				t.Fatalf("woke %v before the tick", tick.Sub(now))
			}
			ds, err := q.ClaimDue(ctx, time.Minute, 1)
			if err != nil || len(ds) != 1 || ds[0].Task.Kind != "k" {
				t.Fatalf("claim after the wait: %v, %v; want the tick's task", ds, err)
			}
		})
	}
}
