package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// settles counts the settle and release events of each task in q's log.
func settles(t *testing.T, q *work.Queue) (settled, released map[string]int, reasons map[string][]string) {
	t.Helper()
	settled, released, reasons = map[string]int{}, map[string]int{}, map[string][]string{}
	err := q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		switch e := ev.(type) {
		case *events.TaskSettled:
			settled[e.TaskID]++
		case *events.TaskReleased:
			released[e.TaskID]++
			reasons[e.TaskID] = append(reasons[e.TaskID], e.Reason)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return settled, released, reasons
}

// Issue 45.2 (spec part 4, "Time limits per attempt"): an attempt that runs past its limit has
// its handler's context canceled with a cause matching ErrTimeout; it ends as a failure that
// says "timeout after D", retried with backoff up to MaxAttempts, and failed on the last.
// KindTimeouts overrides Timeout for its kinds.
func TestTimeoutFailsTheAttempt(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	var mu sync.Mutex
	var causes []error
	wait := func(ctx context.Context, _ work.Task) (json.RawMessage, error) {
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			return nil, errors.New("the context did not end")
		}
		mu.Lock()
		causes = append(causes, context.Cause(ctx))
		mu.Unlock()
		return nil, ctx.Err()
	}
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{"slow": wait, "fast": wait},
		Concurrency: 2, LeaseFor: time.Minute, MaxAttempts: 2, Hooks: hooks,
		Timeout: 300 * time.Millisecond, KindTimeouts: map[string]time.Duration{"fast": 100 * time.Millisecond},
		Backoff: func(uint32, error) time.Duration { return 10 * time.Millisecond }})
	slow, fast := submit(t, q, "slow", "1"), submit(t, q, "fast", "1")
	want := map[string]string{slow.ID: "timeout after 300ms", fast.ID: "timeout after 100ms"}
	results := map[string][]runner.Result{}
	for range 4 {
		e := hooks.next(t)
		if !errors.Is(e.r.Err, runner.ErrTimeout) || !strings.Contains(e.r.Err.Error(), want[e.d.Task.ID]) || e.r.SettleErr != nil {
			t.Fatalf("%s attempt %d: %v %v (settle %v), want a failure saying %q", e.d.Task.Kind, e.d.Attempt, e.r.Result, e.r.Err, e.r.SettleErr, want[e.d.Task.ID])
		}
		if lim := map[string]time.Duration{slow.ID: 300 * time.Millisecond, fast.ID: 100 * time.Millisecond}[e.d.Task.ID]; e.r.Duration < lim {
			t.Errorf("%s attempt %d ran %v, less than its limit %v", e.d.Task.Kind, e.d.Attempt, e.r.Duration, lim)
		}
		results[e.d.Task.ID] = append(results[e.d.Task.ID], e.r.Result)
	}
	_, released, reasons := settles(t, q)
	for _, task := range []work.Task{slow, fast} {
		if r := results[task.ID]; len(r) != 2 || r[0] != runner.Retried || r[1] != runner.Failed {
			t.Errorf("%s: %v, want retried then failed", task.Kind, r)
		}
		got := read(t, q, task.ID)
		if got.State != work.TaskFailed || got.Attempts != 2 || !strings.Contains(got.Outcome.Error, want[task.ID]) {
			t.Errorf("%s: %s after %d attempts, %q; want failed after 2, %q", task.Kind, got.State, got.Attempts, got.Outcome.Error, want[task.ID])
		}
		if released[task.ID] != 1 || !strings.Contains(reasons[task.ID][0], want[task.ID]) {
			t.Errorf("%s: %d releases %q, want 1 saying %q", task.Kind, released[task.ID], reasons[task.ID], want[task.ID])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range causes {
		if !errors.Is(c, runner.ErrTimeout) {
			t.Errorf("a handler's context ended with cause %v, want ErrTimeout", c)
		}
	}
}

// Issue 45.2: a handler that ignores its context keeps its slot until it returns (a second
// task waits for it, Concurrency 1), and what it returns late is discarded: the attempt is
// recorded once, as the timeout's failure, not as the success the handler returned.
func TestTimeoutDiscardsALateResult(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	var mu sync.Mutex
	var deafEnd, nextStart time.Time
	running := make(chan struct{}, 2)
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(ctx context.Context, task work.Task) (json.RawMessage, error) {
		running <- struct{}{}
		if string(task.Input) == `"deaf"` {
			time.Sleep(600 * time.Millisecond) // ignores its context
			mu.Lock()
			deafEnd = time.Now()
			mu.Unlock()
		} else {
			mu.Lock()
			nextStart = time.Now()
			mu.Unlock()
		}
		return json.RawMessage(`"done"`), nil
	}}, Concurrency: 1, LeaseFor: 10 * time.Second, MaxAttempts: 1, Hooks: hooks, Timeout: 100 * time.Millisecond})
	deaf := submit(t, q, "k", `"deaf"`)
	<-running
	next := submit(t, q, "k", `"next"`)
	e := hooks.next(t)
	if e.d.Task.ID != deaf.ID || e.r.Result != runner.Failed || !errors.Is(e.r.Err, runner.ErrTimeout) || e.r.Duration < 600*time.Millisecond {
		t.Fatalf("first end: %s %v %v after %v, want the deaf task failed by its timeout once it returned", e.d.Task.ID, e.r.Result, e.r.Err, e.r.Duration)
	}
	if e := hooks.next(t); e.d.Task.ID != next.ID || e.r.Result != runner.Succeeded {
		t.Fatalf("second end: %s %v %v, want the next task succeeded", e.d.Task.ID, e.r.Result, e.r.Err)
	}
	mu.Lock()
	if !nextStart.After(deafEnd) {
		t.Errorf("the next task started at %v, before the deaf handler returned at %v: the slot was freed early", nextStart, deafEnd)
	}
	mu.Unlock()
	settled, _, _ := settles(t, q)
	got := read(t, q, deaf.ID)
	if got.State != work.TaskFailed || !strings.Contains(got.Outcome.Error, "timeout after 100ms") || settled[deaf.ID] != 1 {
		t.Fatalf("deaf task: %s %q, settled %d times; want failed by its timeout, once", got.State, got.Outcome.Error, settled[deaf.ID])
	}
}

// Issue 45.2 with 43.1: the time limit and the lease share one deadline. A handler that
// ignores its context past its limit and then past its lease deadline (no heartbeat extends
// the lease after the limit) has its attempt recorded nowhere (LeaseLost, ErrLeaseExpired):
// the task is delivered again once its lease expires, and its second attempt, within its
// limit, is the one settled, once.
func TestTimeoutThenLeaseDeadline(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(ctx context.Context, task work.Task) (json.RawMessage, error) {
		if task.Attempts == 1 {
			time.Sleep(2 * time.Second) // ignores its context, past the lease deadline
		}
		return json.RawMessage(`"done"`), nil
	}}, Concurrency: 1, LeaseFor: time.Second, LeaseMargin: 300 * time.Millisecond, Hooks: hooks, Timeout: 100 * time.Millisecond})
	task := submit(t, q, "k", "1")
	e := hooks.next(t)
	if e.r.Result != runner.LeaseLost || !errors.Is(e.r.Err, runner.ErrLeaseExpired) {
		t.Fatalf("first end: %v %v, want LeaseLost by ErrLeaseExpired", e.r.Result, e.r.Err)
	}
	if e := hooks.next(t); e.r.Result != runner.Succeeded || e.d.Attempt != 2 {
		t.Fatalf("second end: attempt %d %v %v, want attempt 2 succeeded", e.d.Attempt, e.r.Result, e.r.Err)
	}
	settled, released, _ := settles(t, q)
	if got := read(t, q, task.ID); got.State != work.TaskSucceeded || settled[task.ID] != 1 || released[task.ID] != 0 {
		t.Fatalf("task %s, settled %d, released %d: want succeeded, settled once, never released", got.State, settled[task.ID], released[task.ID])
	}
}
