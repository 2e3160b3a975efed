package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// ended is a TaskEnd the hooks saw.
type ended struct {
	d work.TaskDelivery
	r runner.TaskResult
}

// recordingHooks sends every TaskEnd and WakeEnd to channels, and counts TaskStarts.
type recordingHooks struct {
	runner.NoHooks
	tasks chan ended
	wakes chan error
	mu    sync.Mutex
	start map[string]int
}

func newHooks() *recordingHooks {
	return &recordingHooks{tasks: make(chan ended, 1000), wakes: make(chan error, 100), start: map[string]int{}}
}

func (h *recordingHooks) TaskStart(ctx context.Context, d work.TaskDelivery) context.Context {
	h.mu.Lock()
	h.start[d.Task.ID]++
	h.mu.Unlock()
	return ctx
}

func (h *recordingHooks) TaskEnd(_ context.Context, d work.TaskDelivery, r runner.TaskResult) {
	h.tasks <- ended{d, r}
}

func (h *recordingHooks) WakeEnd(_ context.Context, _ work.WakeDelivery, err error) { h.wakes <- err }

// next is the next TaskEnd, within 10 s.
func (h *recordingHooks) next(t *testing.T) ended {
	t.Helper()
	select {
	case e := <-h.tasks:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no task ended within 10 s")
		return ended{}
	}
}

func openQueue(t *testing.T) *work.Queue {
	t.Helper()
	q, err := work.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// start makes and starts a runner, stopped (within 10 s) when the test ends.
func start(t *testing.T, q *work.Queue, cfg runner.Config) *runner.Runner {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	r, err := runner.New(q, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.Stop(ctx)
	})
	return r
}

func submit(t *testing.T, q *work.Queue, kind string, input string) work.Task {
	t.Helper()
	task, err := q.Session("s").Submit(context.Background(), work.TaskRequest{Kind: kind, Input: json.RawMessage(input)})
	if err != nil {
		t.Fatal(err)
	}
	return task
}

func read(t *testing.T, q *work.Queue, id string) work.Task {
	t.Helper()
	task, ok, err := q.Session("s").Task(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("task %s: found %v, %v", id, ok, err)
	}
	return task
}

func TestConfigErrors(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	h := map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }}
	good := runner.Config{Handlers: h, Concurrency: 1, LeaseFor: time.Second}
	cases := []struct {
		field string
		edit  func(c *runner.Config)
	}{
		{"Handlers", func(c *runner.Config) { c.Handlers = nil }},
		{"Handlers", func(c *runner.Config) { c.Handlers = map[string]runner.Handler{" ": h["k"]} }},
		{"Handlers", func(c *runner.Config) { c.Handlers = map[string]runner.Handler{"k": nil} }},
		{"Concurrency", func(c *runner.Config) { c.Concurrency = 0 }},
		{"Concurrency", func(c *runner.Config) { c.Concurrency = -1 }},
		{"LeaseFor", func(c *runner.Config) { c.LeaseFor = 0 }},
		{"Prefetch", func(c *runner.Config) { c.Prefetch = -1 }},
		{"Heartbeat", func(c *runner.Config) { c.Heartbeat = time.Second }},
		{"Heartbeat", func(c *runner.Config) { c.Heartbeat = 2 * time.Second }},
		{"Heartbeat", func(c *runner.Config) { c.Heartbeat = -1 }},
		{"MaxAttempts", func(c *runner.Config) { c.MaxAttempts = -1 }},
		{"WakeConcurrency", func(c *runner.Config) { c.WakeConcurrency = -1 }},
		{"WakeLeaseFor", func(c *runner.Config) { c.WakeLeaseFor = -1 }},
		{"WorkerID", func(c *runner.Config) { c.WorkerID = strings.Repeat("w", 257) }},
		{"LeaseMargin", func(c *runner.Config) { c.LeaseMargin = -1 }},
		// LeaseFor 1 s, Heartbeat 333 ms: a margin of 667 ms would end the context before
		// the first heartbeat could extend the lease.
		{"LeaseMargin", func(c *runner.Config) { c.LeaseMargin = time.Second - time.Second/3 }},
		{"LeaseMargin", func(c *runner.Config) { c.LeaseMargin = time.Second }},
		{"Timeout", func(c *runner.Config) { c.Timeout = -1 }},
		{"KindTimeouts", func(c *runner.Config) { c.KindTimeouts = map[string]time.Duration{"k": 0} }},
		{"KindTimeouts", func(c *runner.Config) { c.KindTimeouts = map[string]time.Duration{"k": -time.Second} }},
		{"KindTimeouts", func(c *runner.Config) { c.KindTimeouts = map[string]time.Duration{"other": time.Second} }},
	}
	for _, c := range cases {
		cfg := good
		c.edit(&cfg)
		_, err := runner.New(q, cfg)
		var ce *runner.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, runner.ErrInvalidConfig) || ce.Options != "runner.Config" || ce.Field != c.field {
			t.Errorf("%s: got %v, want a ConfigError naming %s", c.field, err, c.field)
		}
	}
	if _, err := runner.New(nil, good); !errors.Is(err, runner.ErrInvalidConfig) {
		t.Errorf("nil queue: %v", err)
	}
	if _, err := runner.New(q, good); err != nil {
		t.Errorf("good config: %v", err)
	}
	// The limits' bounds: the largest margin, any positive limit.
	edge := good
	edge.LeaseMargin = time.Second - time.Second/3 - 1
	edge.Timeout, edge.KindTimeouts = 1, map[string]time.Duration{"k": 1}
	if _, err := runner.New(q, edge); err != nil {
		t.Errorf("edge config: %v", err)
	}
	// The message names the kind.
	bad := good
	bad.KindTimeouts = map[string]time.Duration{"k": 0}
	if _, err := runner.New(q, bad); err == nil || !strings.Contains(err.Error(), `"k"`) {
		t.Errorf("KindTimeouts 0: %v, want an error naming kind \"k\"", err)
	}
}

// TestRunsItsKindsOnly: every task of the runner's kinds succeeds with its handler's output,
// in one attempt; a task of another kind is never claimed.
func TestRunsItsKindsOnly(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	echo := func(_ context.Context, task work.Task) (json.RawMessage, error) { return task.Input, nil }
	var ids []string
	for i := range 20 {
		ids = append(ids, submit(t, q, []string{"a", "b"}[i%2], fmt.Sprint(i)).ID)
	}
	other := submit(t, q, "c", "0")
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{"a": echo, "b": echo},
		Concurrency: 4, LeaseFor: time.Minute, Hooks: hooks})
	for range ids {
		if e := hooks.next(t); e.r.Result != runner.Succeeded || e.r.SettleErr != nil {
			t.Fatalf("task %s: %v (settle error %v)", e.d.Task.ID, e.r.Result, e.r.SettleErr)
		}
	}
	for i, id := range ids {
		task := read(t, q, id)
		if task.State != work.TaskSucceeded || string(task.Outcome.Output) != fmt.Sprint(i) || task.Attempts != 1 {
			t.Errorf("task %d: %s, output %s, attempts %d", i, task.State, task.Outcome.Output, task.Attempts)
		}
	}
	if task := read(t, q, other.ID); task.State != work.TaskPending || task.Attempts != 0 {
		t.Errorf("the other kind's task: %s, attempts %d: claimed by a runner without its handler", task.State, task.Attempts)
	}
}

// TestNewTaskWakesIdleRunner: a runner that found nothing starts a task submitted later at
// once (WaitTasks), and one scheduled later at its time.
func TestNewTaskWakesIdleRunner(t *testing.T) {
	q := openQueue(t)
	started := make(chan time.Time, 10)
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) {
		started <- time.Now()
		return nil, nil
	}}, Concurrency: 2, LeaseFor: time.Minute})
	time.Sleep(20 * time.Millisecond) // let the runner find nothing and wait
	at := time.Now()
	submit(t, q, "k", "1")
	select {
	case s := <-started:
		if d := s.Sub(at); d > 2*time.Second {
			t.Fatalf("started %v after the submit", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle runner did not start a new task")
	}
	runAt := time.Now().Add(200 * time.Millisecond)
	if _, err := q.Session("s").Submit(context.Background(), work.TaskRequest{Kind: "k", RunAt: runAt}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-started:
		if s.Before(runAt) {
			t.Fatalf("a scheduled task started %v before its time", runAt.Sub(s))
		}
		if d := s.Sub(runAt); d > 2*time.Second {
			t.Fatalf("a scheduled task started %v after its time", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a scheduled task never started")
	}
}

// TestCancelMidHandler: a cancel requested while the handler runs reaches it through its
// context (cause ErrCancelRequested) at the next heartbeat, and the task settles canceled.
func TestCancelMidHandler(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	running := make(chan struct{})
	cause := make(chan error, 1)
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(ctx context.Context, _ work.Task) (json.RawMessage, error) {
		close(running)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	}}, Concurrency: 1, LeaseFor: 3 * time.Second, Heartbeat: 20 * time.Millisecond, Hooks: hooks})
	task := submit(t, q, "k", "1")
	<-running
	if _, err := q.Session("s").Cancel(context.Background(), task.ID); err != nil {
		t.Fatal(err)
	}
	if e := hooks.next(t); e.r.Result != runner.Canceled {
		t.Fatalf("result %v, want canceled", e.r.Result)
	}
	if c := <-cause; !errors.Is(c, runner.ErrCancelRequested) {
		t.Fatalf("the handler's context cause: %v", c)
	}
	if got := read(t, q, task.ID); got.State != work.TaskCanceled {
		t.Fatalf("task %s, want canceled", got.State)
	}
}

// TestLeaseLoss: when another worker claims the task (its lease expired), the runner's next
// heartbeat is stale: the handler's context is canceled with ErrLeaseLost and the runner
// records nothing; the other worker's settlement stands.
func TestLeaseLoss(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	running := make(chan struct{})
	cause := make(chan error, 1)
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(ctx context.Context, _ work.Task) (json.RawMessage, error) {
		close(running)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return json.RawMessage(`"late"`), nil // must not be recorded
	}}, Concurrency: 1, LeaseFor: 2 * time.Second, Heartbeat: 30 * time.Millisecond, Hooks: hooks})
	task := submit(t, q, "k", "1")
	<-running
	// Another worker, whose clock is past the lease: it claims the task again.
	ds, err := q.ClaimDueAt(context.Background(), time.Now().Add(time.Hour), time.Hour, 1)
	if err != nil || len(ds) != 1 || ds[0].Attempt != 2 {
		t.Fatalf("the other worker's claim: %d deliveries, %v", len(ds), err)
	}
	if e := hooks.next(t); e.r.Result != runner.LeaseLost {
		t.Fatalf("result %v, want lease lost", e.r.Result)
	}
	if c := <-cause; !errors.Is(c, runner.ErrLeaseLost) {
		t.Fatalf("the handler's context cause: %v", c)
	}
	if _, err := q.Finish(context.Background(), ds[0], work.Success(json.RawMessage(`"other"`))); err != nil {
		t.Fatal(err)
	}
	got := read(t, q, task.ID)
	if got.State != work.TaskSucceeded || string(got.Outcome.Output) != `"other"` {
		t.Fatalf("task %s %s, want the other worker's result", got.State, got.Outcome.Output)
	}
	// The runner settled nothing, not even a rejected attempt.
	countEvents(t, q, task.ID, func(n map[events.Type]int) {
		if n[events.TypeTaskSettled] != 1 || n[events.TypeTaskSettleRejected] != 0 {
			t.Fatalf("events of the task: %v", n)
		}
	})
}

// countEvents counts the events of task id by type.
func countEvents(t *testing.T, q *work.Queue, id string, check func(map[events.Type]int)) {
	t.Helper()
	n := map[events.Type]int{}
	err := q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		if task, _ := ev.Subject(); task == id {
			n[ev.Type()]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check(n)
}

// TestRetriesToTheLimit: an error releases the task for a retry after the backoff, until
// MaxAttempts, when it fails; a panic counts as an error and its stack is in the failure.
func TestRetriesToTheLimit(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	var mu sync.Mutex
	backoffs := map[uint32]int{}
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{
		"fail":  func(context.Context, work.Task) (json.RawMessage, error) { return nil, errors.New("boom") },
		"panic": func(context.Context, work.Task) (json.RawMessage, error) { panic("kaboom") },
		"flaky": func(_ context.Context, task work.Task) (json.RawMessage, error) {
			if task.Attempts < 3 {
				return nil, errors.New("not yet")
			}
			return json.RawMessage(`"third time"`), nil
		},
		"permanent": func(context.Context, work.Task) (json.RawMessage, error) {
			return nil, fmt.Errorf("wrapped: %w", runner.Permanent(errors.New("never")))
		},
	}, Concurrency: 4, LeaseFor: time.Minute, MaxAttempts: 3, Hooks: hooks,
		Backoff: func(attempt uint32, err error) time.Duration {
			mu.Lock()
			backoffs[attempt]++
			mu.Unlock()
			return 10 * time.Millisecond
		}})
	fail, pnc, flaky, perm := submit(t, q, "fail", "1"), submit(t, q, "panic", "1"), submit(t, q, "flaky", "1"), submit(t, q, "permanent", "1")
	results := map[string][]runner.Result{}
	for range 3 + 3 + 3 + 1 { // fail, panic, flaky: two retries and an end; permanent: one
		e := hooks.next(t)
		results[e.d.Task.ID] = append(results[e.d.Task.ID], e.r.Result)
	}
	want := map[string]string{
		fail.ID:  "[retried retried failed]",
		pnc.ID:   "[retried retried failed]",
		flaky.ID: "[retried retried succeeded]",
		perm.ID:  "[failed]",
	}
	for id, w := range want {
		if got := fmt.Sprint(results[id]); got != w {
			t.Errorf("task %s: %s, want %s", id, got, w)
		}
	}
	for id, attempts := range map[string]uint32{fail.ID: 3, pnc.ID: 3, flaky.ID: 3, perm.ID: 1} {
		if got := read(t, q, id); got.Attempts != attempts {
			t.Errorf("task %s: %d attempts, want %d", id, got.Attempts, attempts)
		}
	}
	if got := read(t, q, fail.ID); got.State != work.TaskFailed || got.Outcome.Error != "boom" {
		t.Errorf("failing task: %s %q", got.State, got.Outcome.Error)
	}
	if got := read(t, q, pnc.ID); got.State != work.TaskFailed ||
		!strings.Contains(got.Outcome.Error, "panic: kaboom") || !strings.Contains(got.Outcome.Error, "runner_test.go") {
		t.Errorf("panicking task: %s %q, want the panic and its stack", got.State, got.Outcome.Error)
	}
	if got := read(t, q, perm.ID); got.State != work.TaskFailed || got.Outcome.Error != "wrapped: never" {
		t.Errorf("permanent: %s %q", got.State, got.Outcome.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if backoffs[1] != 3 || backoffs[2] != 3 || backoffs[3] != 0 {
		t.Errorf("backoff calls by attempt: %v, want 3 after attempts 1 and 2, none after the last", backoffs)
	}
}

// TestGracefulStop: Stop lets a handler that finishes in time record its result, then
// releases the task of one that does not, which a new runner gets at once (attempt 2).
func TestGracefulStop(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	quick := make(chan struct{})
	slowRunning, quickRunning := make(chan struct{}), make(chan struct{})
	r, err := runner.New(q, runner.Config{Handlers: map[string]runner.Handler{
		"quick": func(context.Context, work.Task) (json.RawMessage, error) {
			close(quickRunning)
			<-quick
			return json.RawMessage(`1`), nil
		},
		"slow": func(ctx context.Context, _ work.Task) (json.RawMessage, error) {
			close(slowRunning)
			<-ctx.Done()
			return nil, context.Cause(ctx)
		},
	}, Concurrency: 2, LeaseFor: time.Hour, Hooks: hooks, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	qt, st := submit(t, q, "quick", "1"), submit(t, q, "slow", "1")
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	<-quickRunning
	<-slowRunning
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(ctx) }()
	time.Sleep(20 * time.Millisecond) // Stop is waiting for the handlers
	close(quick)
	err = <-stopped
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want the deadline (one task released)", err)
	}
	if err := r.Start(); !errors.Is(err, runner.ErrStopped) {
		t.Fatalf("Start after Stop: %v", err)
	}
	res := map[string]runner.Result{}
	for range 2 {
		e := hooks.next(t)
		res[e.d.Task.ID] = e.r.Result
	}
	if res[qt.ID] != runner.Succeeded || res[st.ID] != runner.Released {
		t.Fatalf("results %v", res)
	}
	if got := read(t, q, qt.ID); got.State != work.TaskSucceeded {
		t.Fatalf("quick task %s", got.State)
	}
	got := read(t, q, st.ID)
	if got.State != work.TaskPending || got.Attempts != 1 || got.ScheduledAt.After(time.Now()) {
		t.Fatalf("slow task %s, attempts %d, scheduled %v: want pending, due now", got.State, got.Attempts, got.ScheduledAt)
	}
	ds, err := q.ClaimKinds(context.Background(), []string{"slow"}, time.Minute, 1)
	if err != nil || len(ds) != 1 || ds[0].Attempt != 2 {
		t.Fatalf("redelivery after the stop: %d, %v", len(ds), err)
	}
}

// TestStopWithoutHandlersRunning returns nil at once; a runner never started stops too.
func TestStopWithoutHandlersRunning(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	h := map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }}
	r := start(t, q, runner.Config{Handlers: h, Concurrency: 1, LeaseFor: time.Minute})
	if err := r.Start(); !errors.Is(err, runner.ErrStarted) {
		t.Fatalf("second Start: %v", err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	never, err := runner.New(q, runner.Config{Handlers: h, Concurrency: 1, LeaseFor: time.Minute, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := never.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestWakeHandler: a wake is acknowledged when its handler returns nil, and not when it
// fails.
func TestWakeHandler(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	h := map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }}
	start(t, q, runner.Config{Handlers: h, Concurrency: 1, LeaseFor: time.Hour, Hooks: hooks,
		WakeHandler: func(_ context.Context, w work.Wake) error {
			if string(w.Reason.Payload) == `"bad"` {
				return errors.New("cannot")
			}
			return nil
		}})
	s := q.Session("s")
	for _, p := range []string{`"good"`, `"bad"`} {
		if _, err := s.Wake(context.Background(), work.WakeRequest{Payload: json.RawMessage(p)}); err != nil {
			t.Fatal(err)
		}
	}
	var errs []error
	for range 2 {
		select {
		case err := <-hooks.wakes:
			errs = append(errs, err)
		case <-time.After(10 * time.Second):
			t.Fatal("a wake was not handled")
		}
	}
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("wake results %v: want one acknowledged and one failed", errs)
	}
	// Neither is claimable now: one is acknowledged, the other held until its lease expires.
	ws, err := q.ClaimWakes(context.Background(), time.Minute, 10)
	if err != nil || len(ws) != 0 {
		t.Fatalf("claim after handling: %d, %v", len(ws), err)
	}
	acked := 0
	err = q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		if ev.Type() == events.TypeWakeAcked {
			acked++
		}
		return nil
	})
	if err != nil || acked != 1 {
		t.Fatalf("%d wakes acknowledged (%v), want 1", acked, err)
	}
}

// TestWorkerID: every claim of a runner, of tasks and of wakes, records its Config.WorkerID
// in the log (spec part 3: the runner's claims carry its worker identity).
func TestWorkerID(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	h := map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }}
	start(t, q, runner.Config{Handlers: h, Concurrency: 1, LeaseFor: time.Hour, Hooks: hooks, WorkerID: "billing-runner-7",
		WakeHandler: func(context.Context, work.Wake) error { return nil }})
	tk := submit(t, q, "k", `1`)
	if _, err := q.Session("s").Wake(context.Background(), work.WakeRequest{}); err != nil {
		t.Fatal(err)
	}
	hooks.next(t)
	select {
	case <-hooks.wakes:
	case <-time.After(10 * time.Second):
		t.Fatal("the wake was not handled")
	}
	claims := map[events.Type]string{}
	err := q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		switch c := ev.(type) {
		case *events.TaskClaimed:
			if c.TaskID == tk.ID {
				claims[ev.Type()] = c.Worker
			}
		case *events.WakeClaimed:
			claims[ev.Type()] = c.Worker
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []events.Type{events.TypeTaskClaimed, events.TypeWakeClaimed} {
		if got, ok := claims[typ]; !ok || got != "billing-runner-7" {
			t.Errorf("%s records worker %q (found %v), want billing-runner-7", typ, got, ok)
		}
	}
}

// TestPrefetch: a runner holds at most Concurrency+Prefetch tasks, runs Concurrency of them,
// and at Stop releases the prefetched ones at once, before its context ends.
func TestPrefetch(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	running := make(chan string, 10)
	r, err := runner.New(q, runner.Config{Handlers: map[string]runner.Handler{"k": func(ctx context.Context, task work.Task) (json.RawMessage, error) {
		running <- task.ID
		<-ctx.Done()
		return nil, ctx.Err()
	}}, Concurrency: 1, Prefetch: 2, LeaseFor: time.Hour, Hooks: hooks, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 4 {
		ids = append(ids, submit(t, q, "k", fmt.Sprint(i)).ID)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	first := <-running
	states := func() (running, pending int) {
		for _, id := range ids {
			switch read(t, q, id).State {
			case work.TaskRunning:
				running++
			case work.TaskPending:
				pending++
			}
		}
		return
	}
	if run, pend := states(); run != 3 || pend != 1 {
		t.Fatalf("%d claimed, %d pending: want 3 held (1 running, 2 prefetched) and 1 pending", run, pend)
	}
	select {
	case id := <-running:
		t.Fatalf("a second handler (%s) runs with Concurrency 1", id)
	case <-time.After(50 * time.Millisecond):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(ctx) }()
	// The prefetched two are released before the stop's context ends.
	for range 2 {
		if e := hooks.next(t); e.r.Result != runner.Released || e.d.Task.ID == first || ctx.Err() != nil {
			t.Fatalf("%s: %v (context %v), want a prefetched task released at once", e.d.Task.ID, e.r.Result, ctx.Err())
		}
	}
	if err := <-stopped; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v", err)
	}
	if e := hooks.next(t); e.r.Result != runner.Released || e.d.Task.ID != first {
		t.Fatalf("%s: %v, want the running task released", e.d.Task.ID, e.r.Result)
	}
	if run, pend := states(); run != 0 || pend != 4 {
		t.Fatalf("after Stop: %d running, %d pending, want all 4 pending", run, pend)
	}
}

// endWaitsHooks is hooks whose first TaskEnd waits (at most 10 s) for the next handler to
// start, and that count the TaskEnds that returned.
type endWaitsHooks struct {
	runner.NoHooks
	started  chan string
	first    sync.Once
	timedOut atomic.Bool
	returned atomic.Int32
}

func (h *endWaitsHooks) TaskEnd(context.Context, work.TaskDelivery, runner.TaskResult) {
	h.first.Do(func() {
		select {
		case <-h.started:
		case <-time.After(10 * time.Second):
			h.timedOut.Store(true)
		}
	})
	time.Sleep(20 * time.Millisecond) // a slow hook: Stop must still wait for it
	h.returned.Add(1)
}

// TestTaskEndOffTheRoundPath: Hooks.TaskEnd runs after the round that recorded the result
// has started the tasks it claimed, not before (the hooks' time is not added to every
// round: issue 22's W2 cost), and Stop still returns only once every TaskEnd has returned.
func TestTaskEndOffTheRoundPath(t *testing.T) {
	q := openQueue(t)
	h := &endWaitsHooks{started: make(chan string, 10)}
	r, err := runner.New(q, runner.Config{Handlers: map[string]runner.Handler{"k": func(_ context.Context, task work.Task) (json.RawMessage, error) {
		h.started <- task.ID
		return nil, nil
	}}, Concurrency: 1, LeaseFor: time.Hour, Hooks: h, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	submit(t, q, "k", "1")
	submit(t, q, "k", "2")
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	<-h.started // the first; its result's round claims the second
	deadline := time.Now().Add(20 * time.Second)
	for h.returned.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if h.timedOut.Load() {
		t.Fatal("the second task's handler did not start while the first's TaskEnd ran: the round waited for the hook")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.returned.Load(); n != 2 {
		t.Fatalf("Stop returned with %d TaskEnds returned, want 2", n)
	}
}
