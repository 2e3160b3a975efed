package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// partitioned is a Backend between a runner and a real queue (Pebble's) that can be cut off
// from it: while cut, every call that writes (Extend, SettleAndClaim, Release, Finish, the
// claims) fails with work.ErrBackend, as over a connection to PostgreSQL through a proxy that
// froze. WaitTasks still forwards: it only says when to try again. Every call forwards to the
// queue's method of the same time (the At twins), so the queue's validation runs twice.
type partitioned struct {
	q   *work.Queue
	cut atomic.Bool
}

var errCut = fmt.Errorf("%w: the connection to the queue is cut", work.ErrBackend)

func (p *partitioned) Submit(ctx context.Context, sessionID string, r work.TaskRequest, now time.Time) (work.Task, error) {
	if p.cut.Load() {
		return work.Task{}, errCut
	}
	return p.q.Session(sessionID).SubmitAt(ctx, r, now)
}

func (p *partitioned) Task(ctx context.Context, sessionID, taskID string) (work.Task, bool, error) {
	return p.q.Session(sessionID).Task(ctx, taskID)
}

func (p *partitioned) Cancel(ctx context.Context, sessionID, taskID string, now time.Time) (work.Task, error) {
	if p.cut.Load() {
		return work.Task{}, errCut
	}
	return p.q.Session(sessionID).CancelAt(ctx, taskID, now)
}

func (p *partitioned) ClaimDue(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]work.TaskDelivery, error) {
	if p.cut.Load() {
		return nil, errCut
	}
	return p.q.ClaimDueAt(ctx, now, leaseFor, limit)
}

func (p *partitioned) Finish(ctx context.Context, d work.TaskDelivery, o work.Outcome, now time.Time) (work.Task, error) {
	if p.cut.Load() {
		return work.Task{}, errCut
	}
	return p.q.FinishAt(ctx, d, o, now)
}

func (p *partitioned) RequestWake(ctx context.Context, sessionID string, r work.WakeRequest, now time.Time) (work.Wake, error) {
	if p.cut.Load() {
		return work.Wake{}, errCut
	}
	return p.q.Session(sessionID).WakeAt(ctx, r, now)
}

func (p *partitioned) ClaimWakes(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]work.WakeDelivery, error) {
	if p.cut.Load() {
		return nil, errCut
	}
	return p.q.ClaimWakesAt(ctx, now, leaseFor, limit)
}

func (p *partitioned) AckWake(ctx context.Context, d work.WakeDelivery) error {
	if p.cut.Load() {
		return errCut
	}
	return p.q.AckWake(ctx, d)
}

func (p *partitioned) Close() error { return nil } // the queue's test closes it

func (p *partitioned) Extend(ctx context.Context, d work.TaskDelivery, leaseFor time.Duration, now time.Time) (work.TaskDelivery, error) {
	if p.cut.Load() {
		return work.TaskDelivery{}, errCut
	}
	return p.q.ExtendAt(ctx, d, leaseFor, now)
}

func (p *partitioned) Release(ctx context.Context, d work.TaskDelivery, r work.ReleaseRequest, now time.Time) (work.Task, error) {
	if p.cut.Load() {
		return work.Task{}, errCut
	}
	return p.q.ReleaseAt(ctx, d, r, now)
}

func (p *partitioned) ClaimKinds(ctx context.Context, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]work.TaskDelivery, error) {
	if p.cut.Load() {
		return nil, errCut
	}
	return p.q.ClaimKindsAt(ctx, kinds, now, leaseFor, limit)
}

func (p *partitioned) Tasks(ctx context.Context, sessionID string, f work.TaskFilter) ([]work.Task, error) {
	return p.q.Session(sessionID).Tasks(ctx, f)
}

func (p *partitioned) Stats(ctx context.Context, now time.Time) (work.QueueStats, error) {
	return p.q.StatsAt(ctx, now)
}

func (p *partitioned) SettleAndClaim(ctx context.Context, settles []work.Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]work.SettleResult, []work.TaskDelivery, error) {
	if p.cut.Load() {
		return nil, nil, errCut
	}
	return p.q.SettleAndClaimAt(ctx, settles, kinds, now, leaseFor, limit)
}

func (p *partitioned) WaitTasks(ctx context.Context, kinds []string) error {
	return p.q.WaitTasks(ctx, kinds)
}

func (p *partitioned) WaitWakes(ctx context.Context) error { return p.q.WaitWakes(ctx) }

var (
	_ work.RunningBackend = (*partitioned)(nil)
	_ work.Waiter         = (*partitioned)(nil)
)

// run is one handler run, on the real clock (to: zero while it runs).
type run struct {
	runner   string
	task     string
	from, to time.Time
	cause    error // context.Cause when the handler returned
}

// runs records every handler run of a test, and the most that ran at once.
type runs struct {
	mu      sync.Mutex
	all     []run
	now     int
	most    int
	started chan string // the runner's name, at each start
}

func newRuns() *runs { return &runs{started: make(chan string, 100)} }

// handler runs for hold (or until its context ends, when it returns the cause), recording
// the run as name's.
func (rs *runs) handler(name string, hold func(work.Task) time.Duration) runner.Handler {
	return func(ctx context.Context, t work.Task) (json.RawMessage, error) {
		rs.mu.Lock()
		rs.now++
		rs.most = max(rs.most, rs.now)
		i := len(rs.all)
		rs.all = append(rs.all, run{runner: name, task: t.ID, from: time.Now()})
		rs.mu.Unlock()
		rs.started <- name
		var err error
		select {
		case <-time.After(hold(t)):
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		rs.mu.Lock()
		rs.now--
		rs.all[i].to, rs.all[i].cause = time.Now(), err
		rs.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return json.RawMessage(fmt.Sprintf("%q", name)), nil
	}
}

// overlaps lists every two runs of one task that overlapped in time (a run still going
// counts as running until now).
func (rs *runs) overlaps() []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	now := time.Now()
	all := make([]run, len(rs.all))
	for i, r := range rs.all {
		if r.to.IsZero() {
			r.to = now
		}
		all[i] = r
	}
	var bad []string
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.task == b.task && a.from.Before(b.to) && b.from.Before(a.to) {
				bad = append(bad, fmt.Sprintf("task %s: %s ran %v..%v, %s ran %v..%v (together %v)", a.task,
					a.runner, a.from.Format("15:04:05.000"), a.to.Format("15:04:05.000"),
					b.runner, b.from.Format("15:04:05.000"), b.to.Format("15:04:05.000"),
					earlier(a.to, b.to).Sub(later(a.from, b.from))))
			}
		}
	}
	return bad
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// waitStart waits (30 s at most) for a handler of runner name to start.
func (rs *runs) waitStart(t *testing.T, name string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case n := <-rs.started:
			if n == name {
				return
			}
		case <-deadline:
			t.Fatalf("no handler of runner %s started within 30 s", name)
		}
	}
}

// The lease of the partition tests: 2 s, a heartbeat every 250 ms, a margin of 1 s (a
// loaded machine running the race detector may be late by hundreds of milliseconds; the
// margin is what the deadline leaves for that).
const (
	cutLease  = 2 * time.Second
	cutBeat   = 250 * time.Millisecond
	cutMargin = time.Second
)

// Issue 43.1: a runner cut off from its queue (every heartbeat fails with ErrBackend, a
// proxy to PostgreSQL froze) ends its handler's context at its lease deadline, with cause
// ErrLeaseExpired, LeaseMargin before the lease expires, and records nothing of the attempt;
// a second runner claims the task once the lease has expired and runs it. The two handlers
// never run together. Before the fix the first handler's context had no deadline: it ran on
// for its whole hold (8 s), and the second runner's handler ran beside it.
func TestHandlerEndsBeforeItsLeaseWhenTheQueueIsCut(t *testing.T) {
	base := openQueue(t)
	cut := &partitioned{q: base}
	qa := work.New(cut)
	rs := newRuns()
	var logs syncBuffer
	hooksA, hooksB := newHooks(), newHooks()
	hold := 4 * cutLease
	start(t, qa, runner.Config{Handlers: map[string]runner.Handler{"k": rs.handler("A", func(work.Task) time.Duration { return hold })},
		Concurrency: 1, LeaseFor: cutLease, Heartbeat: cutBeat, LeaseMargin: cutMargin, Hooks: hooksA,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	task := submit(t, base, "k", "1")
	rs.waitStart(t, "A")
	time.Sleep(2 * cutBeat) // a heartbeat or two succeed: the deadline moved past the claim's
	cut.cut.Store(true)
	cutAt := time.Now()
	start(t, base, runner.Config{Handlers: map[string]runner.Handler{"k": rs.handler("B", func(work.Task) time.Duration { return 100 * time.Millisecond })},
		Concurrency: 1, LeaseFor: cutLease, Hooks: hooksB})

	e := hooksB.next(t)
	if e.d.Task.ID != task.ID || e.r.Result != runner.Succeeded || e.r.SettleErr != nil {
		t.Fatalf("B: %s %v %v, want the task succeeded", e.d.Task.ID, e.r.Result, e.r.SettleErr)
	}
	if bad := rs.overlaps(); len(bad) > 0 {
		t.Fatalf("two handlers of one task ran together:\n%s", strings.Join(bad, "\n"))
	}
	e = hooksA.next(t)
	if e.r.Result != runner.LeaseLost || !errors.Is(e.r.Err, runner.ErrLeaseExpired) {
		t.Fatalf("A's end: %v %v, want LeaseLost with ErrLeaseExpired", e.r.Result, e.r.Err)
	}
	rs.mu.Lock()
	a, b := rs.all[0], rs.all[1]
	rs.mu.Unlock()
	if a.runner != "A" || !errors.Is(a.cause, runner.ErrLeaseExpired) {
		t.Fatalf("first run: %s, its context's cause %v, want A's, ended by ErrLeaseExpired", a.runner, a.cause)
	}
	// The deadline is at most LeaseFor - LeaseMargin after the last heartbeat that succeeded,
	// which was sent before the cut.
	if took := a.to.Sub(cutAt); took > cutLease {
		t.Errorf("A's handler ended %v after the cut, later than LeaseFor", took)
	}
	t.Logf("A's handler ended %v after the cut; B's started %v after A's ended", a.to.Sub(cutAt), b.from.Sub(a.to))

	cut.cut.Store(false) // healed: A has nothing to record
	time.Sleep(3 * cutBeat)
	var finishes, releases int
	if err := base.ReadLog(context.Background(), 0, func(ev events.Event) error {
		switch ev.Type() {
		case events.TypeTaskSettled:
			finishes++
		case events.TypeTaskReleased:
			releases++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, base, task.ID); got.State != work.TaskSucceeded || string(got.Outcome.Output) != `"B"` || finishes != 1 || releases != 0 {
		t.Fatalf("task %s with %s, %d finishes, %d releases; want succeeded by B alone, nothing of A recorded", got.State, got.Outcome.Output, finishes, releases)
	}
	if out := logs.String(); !strings.Contains(out, `"msg":"runner: task lease expiring`) || !strings.Contains(out, `"lease_margin_seconds":1`) {
		t.Errorf("A's log does not say its lease ran out:\n%s", out)
	}
}

// Issue 43.1: with a kind's MaxRunning 1, at most one handler of the kind runs at any time
// across two runners, one of them cut off from the queue while it runs a long task and then
// healed: its handler ends at its lease deadline, before the other runner may claim. Before
// the fix the cut runner's handler ran on after its lease expired, beside the other's
// (MaxRunning counts unexpired leases only).
func TestMaxRunningHoldsAcrossAPartition(t *testing.T) {
	base := openQueue(t)
	ctx := context.Background()
	if err := base.SetKindPolicy(ctx, "one", work.KindPolicy{MaxRunning: 1}); err != nil {
		t.Fatal(err)
	}
	cut := &partitioned{q: base}
	qa := work.New(cut)
	rs := newRuns()
	var first atomic.Bool
	hold := func(work.Task) time.Duration {
		if first.CompareAndSwap(false, true) {
			return 4 * cutLease // the task A holds when it is cut
		}
		return 50 * time.Millisecond
	}
	hooks := newHooks()
	cfg := func(name string) runner.Config {
		return runner.Config{Handlers: map[string]runner.Handler{"one": rs.handler(name, hold)},
			Concurrency: 2, LeaseFor: cutLease, Heartbeat: cutBeat, LeaseMargin: cutMargin, Hooks: hooks,
			Backoff: func(uint32, error) time.Duration { return 0 }}
	}
	start(t, qa, cfg("A"))
	var ids []string
	ids = append(ids, submit(t, base, "one", "0").ID)
	rs.waitStart(t, "A")
	for i := range 8 {
		ids = append(ids, submit(t, base, "one", fmt.Sprint(i+1)).ID)
	}
	time.Sleep(2 * cutBeat)
	cut.cut.Store(true)
	start(t, base, cfg("B"))
	time.Sleep(cutLease + cutLease/2) // B claims once A's lease has expired
	cut.cut.Store(false)
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for read(t, base, id).State != work.TaskSucceeded {
			if time.Now().After(deadline) {
				t.Fatalf("task %s is %s after 60 s", id, read(t, base, id).State)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	rs.mu.Lock()
	most, n := rs.most, len(rs.all)
	rs.mu.Unlock()
	if bad := rs.overlaps(); len(bad) > 0 {
		t.Errorf("two handlers of one task ran together:\n%s", strings.Join(bad, "\n"))
	}
	if most != 1 {
		t.Fatalf("%d handlers of the kind ran at once (%d runs), want at most MaxRunning 1", most, n)
	}
}
