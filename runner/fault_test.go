package runner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// walFault is a filesystem for a Pebble store whose WAL can be made to stop answering (its
// syncs block until unblocked: a disk, or a server, that froze) or to fail (its writes
// return an error: the store fails for good).
type walFault struct {
	block   atomic.Bool
	fail    atomic.Bool
	gate    chan struct{} // closed: blocked syncs go on
	once    sync.Once
	blocked chan struct{} // closed when the first sync blocks
	seen    sync.Once
}

func newWALFault() *walFault {
	return &walFault{gate: make(chan struct{}), blocked: make(chan struct{})}
}

func (f *walFault) fs() vfs.FS {
	return errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !strings.HasSuffix(op.Path, ".log") {
			return nil
		}
		if f.fail.Load() && op.Kind == errorfs.OpFileWrite {
			return errorfs.ErrInjected
		}
		if f.block.Load() && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) {
			f.seen.Do(func() { close(f.blocked) })
			<-f.gate
		}
		return nil
	}))
}

func (f *walFault) unblock() { f.once.Do(func() { close(f.gate) }) }

// startHeld starts a runner of two kinds on q: "quick" succeeds at once, "held" runs until
// release is closed. It submits one of each and returns once the quick one's result is
// recorded and the held one is running: the freeze tests then stop the storage under it.
func startHeld(t *testing.T, q *work.Queue) (r *runner.Runner, hooks *recordingHooks, quick, held work.Task, release chan struct{}) {
	t.Helper()
	hooks = newHooks()
	release = make(chan struct{})
	running := make(chan struct{}, 1)
	r = start(t, q, runner.Config{Handlers: map[string]runner.Handler{
		"quick": func(context.Context, work.Task) (json.RawMessage, error) { return json.RawMessage(`1`), nil },
		"held": func(context.Context, work.Task) (json.RawMessage, error) {
			running <- struct{}{}
			<-release
			return json.RawMessage(`2`), nil
		},
	}, Concurrency: 2, LeaseFor: time.Hour, Hooks: hooks})
	quick, held = submit(t, q, "quick", "1"), submit(t, q, "held", "2")
	if e := hooks.next(t); e.d.Task.ID != quick.ID || e.r.Result != runner.Succeeded || e.r.SettleErr != nil {
		t.Fatalf("first end: %s %v %v, want the quick task recorded", e.d.Task.ID, e.r.Result, e.r.SettleErr)
	}
	<-running
	return r, hooks, quick, held, release
}

// stopWithin runs r.Stop(ctx) and fails the test when it has not returned within limit.
func stopWithin(t *testing.T, r *runner.Runner, ctx context.Context, limit time.Duration) (time.Duration, error) {
	t.Helper()
	began := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(ctx) }()
	select {
	case err := <-stopped:
		return time.Since(began), err
	case <-time.After(limit):
		t.Fatalf("Stop has not returned %v after it began", limit)
		return 0, nil
	}
}

// Issue 27.3: Stop returns within its context (plus runner.StopGrace) when the store stops
// answering, saying what it could not record, and nothing it reported recorded is lost: a
// Pebble store whose WAL syncs block (the disk froze; no stall timeout), a result waiting on
// it, Stop with 300 ms. Before the fix the settle ran under context.Background and Stop
// waited for the disk.
func TestStopReturnsWhenTheStoreFreezes(t *testing.T) {
	dir := t.TempDir()
	fault := newWALFault()
	q, err := work.Open(dir, &work.Options{FS: fault.fs(), StallTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer fault.unblock()
	r, hooks, quick, held, release := startHeld(t, q)
	fault.block.Store(true) // the disk stops answering
	close(release)          // the held task's result goes to a round that waits on it
	select {
	case <-fault.blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("no WAL sync blocked")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	took, err := stopWithin(t, r, ctx, 300*time.Millisecond+2*runner.StopGrace+20*time.Second)
	var se *runner.StopError
	if !errors.As(err, &se) || se.Unrecorded != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop after %v: %v, want a *StopError with 1 unrecorded result, wrapping the deadline", took, err)
	}
	t.Logf("Stop returned after %v: %v", took, err)
	e := hooks.next(t)
	if e.d.Task.ID != held.ID || e.r.Result != runner.Succeeded || e.r.SettleErr == nil {
		t.Fatalf("held task's end: %s %v %v, want succeeded with a settle error", e.d.Task.ID, e.r.Result, e.r.SettleErr)
	}

	fault.unblock()
	if err := q.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	q2, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	if got := read(t, q2, quick.ID); got.State != work.TaskSucceeded {
		t.Errorf("the quick task, reported recorded, is %s after the reopen", got.State)
	}
	// The held task's result was not reported recorded: it may have committed once the
	// disk answered, else its claim holds until the lease expires. Either way it exists.
	if got := read(t, q2, held.ID); got.State != work.TaskSucceeded && got.State != work.TaskRunning {
		t.Errorf("the held task is %s after the reopen, want succeeded or still claimed", got.State)
	}
}

// Issue 27.10: results dropped because the queue was closed under the runner make Stop say
// so (it returned nil before), with work.ErrClosed in errors.Is.
func TestStopReportsResultsDroppedOnAClosedQueue(t *testing.T) {
	q, err := work.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	hooks := newHooks()
	release, running := make(chan struct{}), make(chan struct{}, 1)
	r := start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) {
		running <- struct{}{}
		<-release
		return nil, nil
	}}, Concurrency: 1, LeaseFor: time.Hour, Hooks: hooks})
	submit(t, q, "k", "1")
	<-running
	q.Close()
	close(release)
	if e := hooks.next(t); !errors.Is(e.r.SettleErr, work.ErrClosed) {
		t.Fatalf("end: %v %v, want the settle error ErrClosed", e.r.Result, e.r.SettleErr)
	}
	_, err = stopWithin(t, r, context.Background(), 30*time.Second)
	var se *runner.StopError
	if !errors.As(err, &se) || se.Unrecorded != 1 || !errors.Is(err, work.ErrClosed) || !errors.Is(err, work.ErrBackend) {
		t.Fatalf("Stop: %v, want a *StopError with 1 unrecorded result wrapping work.ErrClosed", err)
	}
}

// Issue 27.10: a store that failed (a WAL write error: Pebble fails the store for good)
// during a stop makes Stop drop the results and return promptly, saying so, instead of
// retrying until its context ends (60 s here).
func TestStopReturnsPromptlyOnAFailedStore(t *testing.T) {
	fault := newWALFault()
	q, err := work.Open(t.TempDir(), &work.Options{FS: fault.fs()})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	release, running := make(chan struct{}), make(chan struct{}, 1)
	r := start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) {
		running <- struct{}{}
		<-release
		return nil, nil
	}}, Concurrency: 1, LeaseFor: time.Hour})
	submit(t, q, "k", "1")
	<-running
	fault.fail.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(ctx) }()
	close(release)
	select {
	case err := <-stopped:
		var se *runner.StopError
		if !errors.As(err, &se) || se.Unrecorded != 1 || !errors.Is(err, work.ErrBackend) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop after %v: %v, want a *StopError with 1 unrecorded result wrapping work.ErrBackend", time.Since(began), err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Stop waits on a failed store: not returned after 30 s (its context has 60 s)")
	}
}

// Issue 26.10: Stop of an idle runner with a context already ended is no error: nothing was
// running. Before the fix Stop picked the context's end half of the time ("0 task(s) still
// running were released"); 20 runners make that certain.
func TestStopIdleRunnerWithEndedContext(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 20 {
		r := start(t, q, runner.Config{Handlers: map[string]runner.Handler{
			"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil },
		}, Concurrency: 1, LeaseFor: time.Minute,
			WakeHandler: func(context.Context, work.Wake) error { return nil }})
		if _, err := stopWithin(t, r, ctx, 30*time.Second); err != nil {
			t.Fatalf("runner %d: Stop of an idle runner with an ended context: %v, want nil", i, err)
		}
	}
}

// Issue 26.8: a runner with a WakeHandler and no task handlers is allowed; it acknowledges
// wakes and claims no tasks.
func TestWakeOnlyRunner(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	r := start(t, q, runner.Config{LeaseFor: time.Minute, Hooks: hooks,
		WakeHandler: func(context.Context, work.Wake) error { return nil }})
	if k := r.Kinds(); len(k) != 0 {
		t.Fatalf("kinds %v, want none", k)
	}
	task := submit(t, q, "k", "1")
	if _, err := q.Session("s").Wake(context.Background(), work.WakeRequest{Payload: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-hooks.wakes:
		if err != nil {
			t.Fatalf("wake: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wake was not handled")
	}
	if _, err := stopWithin(t, r, context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := read(t, q, task.ID); got.State != work.TaskPending {
		t.Fatalf("task %s, want pending: a wake-only runner claims no tasks", got.State)
	}
	if _, err := runner.New(q, runner.Config{LeaseFor: time.Minute}); !errors.Is(err, runner.ErrInvalidConfig) {
		t.Fatalf("neither handlers nor a wake handler: %v, want ErrInvalidConfig", err)
	}
}

// panickyHooks panics in the one method named by which.
type panickyHooks struct {
	which string
	ends  chan runner.TaskResult
	wakes chan error
}

func (h *panickyHooks) TaskStart(ctx context.Context, _ work.TaskDelivery) context.Context {
	if h.which == "TaskStart" {
		panic("hook TaskStart")
	}
	return ctx
}

func (h *panickyHooks) TaskEnd(_ context.Context, _ work.TaskDelivery, r runner.TaskResult) {
	h.ends <- r
	if h.which == "TaskEnd" {
		panic("hook TaskEnd")
	}
}

func (h *panickyHooks) WakeStart(ctx context.Context, _ work.WakeDelivery) context.Context {
	if h.which == "WakeStart" {
		panic("hook WakeStart")
	}
	return ctx
}

func (h *panickyHooks) WakeEnd(_ context.Context, _ work.WakeDelivery, err error) {
	h.wakes <- err
	if h.which == "WakeEnd" {
		panic("hook WakeEnd")
	}
}

// syncBuffer is a log destination safe for the runner's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Issue 27.4: a Hooks method that panics is recovered and logged, and the task still runs
// once and its result is recorded (the wake acknowledged). Before the fix the panic killed
// the test process (exit 2).
func TestHookPanicsAreRecovered(t *testing.T) {
	for _, which := range []string{"TaskStart", "TaskEnd", "WakeStart", "WakeEnd"} {
		t.Run(which, func(t *testing.T) {
			q := openQueue(t)
			var logs syncBuffer
			hooks := &panickyHooks{which: which, ends: make(chan runner.TaskResult, 10), wakes: make(chan error, 10)}
			var runs atomic.Int32
			r := start(t, q, runner.Config{Handlers: map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) {
				runs.Add(1)
				return json.RawMessage(`"done"`), nil
			}}, Concurrency: 1, LeaseFor: time.Minute, Hooks: hooks,
				WakeHandler: func(context.Context, work.Wake) error { return nil },
				Logger:      slog.New(slog.NewTextHandler(&logs, nil))})
			task := submit(t, q, "k", "1")
			if _, err := q.Session("s").Wake(context.Background(), work.WakeRequest{Payload: json.RawMessage(`1`)}); err != nil {
				t.Fatal(err)
			}
			select {
			case res := <-hooks.ends:
				if res.Result != runner.Succeeded || res.SettleErr != nil {
					t.Fatalf("task end: %v %v", res.Result, res.SettleErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the task did not end")
			}
			select {
			case err := <-hooks.wakes:
				if err != nil {
					t.Fatalf("wake: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the wake was not handled")
			}
			if _, err := stopWithin(t, r, context.Background(), 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if got := read(t, q, task.ID); got.State != work.TaskSucceeded || got.Attempts != 1 || runs.Load() != 1 {
				t.Fatalf("task %s after %d attempts, %d runs: want succeeded, once", got.State, got.Attempts, runs.Load())
			}
			acked := 0
			q.ReadLog(context.Background(), 0, func(ev events.Event) error {
				if ev.Type() == events.TypeWakeAcked {
					acked++
				}
				return nil
			})
			if acked != 1 {
				t.Fatalf("%d wakes acknowledged, want 1", acked)
			}
			if out := logs.String(); !strings.Contains(out, "Hooks."+which+" panicked") || !strings.Contains(out, "fault_test.go") {
				t.Fatalf("log has no recovered panic of %s with its stack:\n%s", which, out)
			}
		})
	}
}

// Issue 26.11: a panic's release reason is its value and the frame that panicked, a few
// hundred bytes, not its stack (which goes to the log); every release reason stays within
// the queue's limit, however long the error.
func TestReleaseReasonsAreShort(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	var logs syncBuffer
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{
		"panic": func(context.Context, work.Task) (json.RawMessage, error) { panic("kaboom") },
		"long": func(context.Context, work.Task) (json.RawMessage, error) {
			return nil, errors.New(strings.Repeat("é", 100<<10))
		},
	}, Concurrency: 2, LeaseFor: time.Minute, MaxAttempts: 2, Hooks: hooks,
		Backoff: func(uint32, error) time.Duration { return time.Millisecond },
		Logger:  slog.New(slog.NewTextHandler(&logs, nil))})
	pnc, long := submit(t, q, "panic", "1"), submit(t, q, "long", "1")
	for range 4 {
		if e := hooks.next(t); e.r.SettleErr != nil {
			t.Fatalf("%s: %v: settle error %v", e.d.Task.ID, e.r.Result, e.r.SettleErr)
		}
	}
	reasons := map[string]string{}
	err := q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		if rel, ok := ev.(*events.TaskReleased); ok {
			reasons[rel.TaskID] = rel.Reason
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p := reasons[pnc.ID]
	if len(p) > 512 || !strings.HasPrefix(p, "panic: kaboom") || !strings.Contains(p, "fault_test.go") || strings.Contains(p, "goroutine") {
		t.Errorf("panic's release reason (%d bytes): %q, want the value and the frame that panicked, no stack", len(p), p)
	}
	if l := reasons[long.ID]; len(l) > 1<<10 || !strings.HasSuffix(l, "[cut]") {
		t.Errorf("long error's release reason: %d bytes, want at most 1 KiB, cut", len(l))
	}
	if got := read(t, q, pnc.ID); got.State != work.TaskFailed || !strings.HasPrefix(got.Outcome.Error, "panic: kaboom") || len(got.Outcome.Error) > 512 {
		t.Errorf("panicking task's failure: %s %q", got.State, got.Outcome.Error)
	}
	if out := logs.String(); !strings.Contains(out, "goroutine") || !strings.Contains(out, "kaboom") {
		t.Errorf("the log has no panic stack")
	}
}

// WakeSessions: the runner claims (ClaimSessionWakes) and handles only the wakes of its
// sessions; another session's wake stays unclaimed for another runner. WakeSessions without
// a WakeHandler, or with a blank session, is refused.
func TestWakeSessionsRunner(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	handled := make(chan string, 10)
	r := start(t, q, runner.Config{LeaseFor: time.Minute, Hooks: hooks, WakeSessions: []string{"mine", "also-mine"},
		WakeHandler: func(_ context.Context, w work.Wake) error { handled <- w.SessionID; return nil }})
	ctx := context.Background()
	other, err := q.Session("other").Wake(ctx, work.WakeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"mine", "also-mine"} {
		if _, err := q.Session(s).Wake(ctx, work.WakeRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case err := <-hooks.wakes:
			if err != nil {
				t.Fatalf("wake: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a wake of the runner's sessions was not handled")
		}
	}
	if _, err := stopWithin(t, r, ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	close(handled)
	for s := range handled {
		if s != "mine" && s != "also-mine" {
			t.Errorf("the runner handled a wake of session %q", s)
		}
	}
	ws, err := q.ClaimWakes(ctx, time.Minute, 10)
	if err != nil || len(ws) != 1 || ws[0].Wake.ID != other.ID || ws[0].Attempt != 1 {
		t.Fatalf("after the runner: %v, %v; want only the other session's wake, never claimed before", ws, err)
	}
	for _, c := range []runner.Config{
		{LeaseFor: time.Minute, Concurrency: 1, Handlers: map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }},
			WakeSessions: []string{"mine"}},
		{LeaseFor: time.Minute, WakeSessions: []string{"mine", " "}, WakeHandler: func(context.Context, work.Wake) error { return nil }},
	} {
		var ce *runner.ConfigError
		if _, err := runner.New(q, c); !errors.As(err, &ce) || ce.Field != "WakeSessions" {
			t.Errorf("config %+v: %v, want a ConfigError naming WakeSessions", c.WakeSessions, err)
		}
	}
}
