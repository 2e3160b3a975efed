package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/worklog/worklog/work"
)

// Handler runs one task. A nil error settles the task as succeeded with the returned output
// (a JSON value, or nil for null); an error releases it for a retry after a backoff, or fails
// it when the attempts are used up or the error is Permanent. The context is canceled when a
// cancel of the task is requested (the task then settles as canceled if the handler returns
// an error), when the runner loses the task's lease, or when a graceful stop runs out of time
// (in the last two cases nothing the handler returns is recorded).
type Handler func(ctx context.Context, t work.Task) (json.RawMessage, error)

// WakeHandler handles one wake; the wake is acknowledged when it returns nil. After an error
// (or a panic) the wake is not acknowledged and is delivered again once its lease expires.
type WakeHandler func(ctx context.Context, w work.Wake) error

// Defaults of Config's optional fields.
const (
	DefaultMaxAttempts     = 25
	DefaultWakeConcurrency = 4
	DefaultBackoffBase     = time.Second
	DefaultBackoffMax      = time.Hour
)

// Config configures a Runner. Handlers, Concurrency and LeaseFor are required; every other
// field has a default.
type Config struct {
	// Handlers maps each task kind the runner runs to its handler; the runner claims only
	// these kinds.
	Handlers map[string]Handler
	// Concurrency is the number of task handlers that may run at once (> 0).
	Concurrency int
	// Prefetch is how many tasks the runner may hold claimed beyond Concurrency, waiting for
	// a free slot (>= 0; default 0). A slot that frees then starts the next task at once,
	// without waiting for a claim's round trip (an fsync on a durable store), which is what
	// bounds the throughput of short handlers (docs/performance.md). The cost: those tasks'
	// leases run (and are heartbeaten) while they wait, and another runner cannot take
	// them meanwhile; Stop releases them at once.
	Prefetch int
	// LeaseFor is the lease of each claim (> 0); heartbeats renew it while a handler runs.
	LeaseFor time.Duration
	// Heartbeat is how often a running task's lease is extended; 0: LeaseFor/3. It must be
	// shorter than LeaseFor.
	Heartbeat time.Duration
	// MaxAttempts is the number of attempts a task gets (claims, redeliveries after a crash
	// included): an error on the last one fails the task, and a task claimed beyond it
	// (its earlier workers died) fails without running. 0: DefaultMaxAttempts.
	MaxAttempts int
	// Backoff is how long a task waits before its next attempt after attempt failed with
	// err; nil: ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax).
	Backoff func(attempt uint32, err error) time.Duration

	// WakeHandler, when set, handles the queue's wakes, with up to WakeConcurrency (0:
	// DefaultWakeConcurrency) at once and a lease of WakeLeaseFor (0: LeaseFor) each.
	WakeHandler     WakeHandler
	WakeConcurrency int
	WakeLeaseFor    time.Duration

	// Logger receives the runner's log; nil: slog.Default().
	Logger *slog.Logger
	// Hooks, when set, is told about every task and wake the runner handles (metrics,
	// tracing).
	Hooks Hooks
}

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError.
var ErrInvalidConfig = errors.New("runner: invalid configuration")

// ConfigError is New's refusal of a Config; Field names the field.
type ConfigError struct {
	Field, Message string
}

func (e *ConfigError) Error() string { return "runner: invalid Config." + e.Field + ": " + e.Message }

// Is matches ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// ErrStopped is returned by Start on a runner that was stopped.
var ErrStopped = errors.New("runner: stopped")

// ErrStarted is returned by Start on a runner already started.
var ErrStarted = errors.New("runner: already started")

// permanentError marks a handler's error as final: the task fails without a retry.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks err as permanent: a handler returning it (or an error wrapping it) fails
// its task at once, without a retry. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// PanicError is the error a handler's panic turns into: it is treated as any other error
// (a retry, or a failure on the last attempt), and its message, which the log records,
// includes the stack.
type PanicError struct {
	Value any
	Stack []byte
}

func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v\n\n%s", p.Value, p.Stack) }

// ExponentialBackoff returns a backoff that doubles from base with each attempt, up to max,
// with "equal jitter": a uniformly random duration between half of that and all of it, so
// tasks that failed together do not retry together.
func ExponentialBackoff(base, max time.Duration) func(attempt uint32, err error) time.Duration {
	return func(attempt uint32, _ error) time.Duration {
		d := base
		for i := uint32(1); i < attempt && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		if d <= 1 {
			return d
		}
		half := d / 2
		return half + rand.N(d-half+1)
	}
}

// Result is what became of a task the runner handled (Hooks.TaskEnd).
type Result int

const (
	Succeeded Result = iota // settled with the handler's output
	Failed                  // settled as failed: permanent error, last attempt, or attempts used up
	Retried                 // released, to run again at TaskResult.RetryAt
	Canceled                // settled as canceled: a cancel was requested
	LeaseLost               // the lease was lost (another worker claimed the task); nothing recorded
	Released                // a graceful stop ran out of time and gave the task back
)

var resultNames = [...]string{"succeeded", "failed", "retried", "canceled", "lease_lost", "released"}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// TaskResult describes a task's end for Hooks.TaskEnd.
type TaskResult struct {
	Result   Result
	Err      error         // the handler's error (nil when it succeeded)
	Duration time.Duration // how long the handler ran (0 when it did not run)
	RetryAt  time.Time     // Retried: when the task runs again
	// SettleErr is the error of recording the result, if any (the task then stays claimed
	// until its lease expires and is delivered again).
	SettleErr error
}

// Hooks is told about the tasks and wakes a runner handles, for metrics and tracing (an
// OpenTelemetry span, a Prometheus histogram) without the runner depending on either.
// Methods are called from the runner's goroutines and must be quick and safe for
// concurrent use. Embed NoHooks to implement only some of them.
type Hooks interface {
	// TaskStart is called before a task's handler runs; the handler runs with the context
	// it returns (a span's).
	TaskStart(ctx context.Context, d work.TaskDelivery) context.Context
	// TaskEnd is called once the task's result is recorded (or known lost), with the
	// context TaskStart returned.
	TaskEnd(ctx context.Context, d work.TaskDelivery, r TaskResult)
	// WakeStart and WakeEnd are the same for wakes; err is the handler's error or the
	// acknowledgment's.
	WakeStart(ctx context.Context, d work.WakeDelivery) context.Context
	WakeEnd(ctx context.Context, d work.WakeDelivery, err error)
}

// NoHooks implements Hooks with methods that do nothing.
type NoHooks struct{}

func (NoHooks) TaskStart(ctx context.Context, _ work.TaskDelivery) context.Context { return ctx }
func (NoHooks) TaskEnd(context.Context, work.TaskDelivery, TaskResult)             {}
func (NoHooks) WakeStart(ctx context.Context, _ work.WakeDelivery) context.Context { return ctx }
func (NoHooks) WakeEnd(context.Context, work.WakeDelivery, error)                  {}

// Causes of a handler's context cancellation (context.Cause).
var (
	ErrCancelRequested = errors.New("runner: a cancel of the task was requested")
	ErrLeaseLost       = errors.New("runner: the task's lease was lost")
	ErrStopping        = errors.New("runner: stopping, the task is released")
)

// maxMessage bounds the error text recorded with a failure or a release (the queue takes
// 64 KiB); a panic's stack is cut to fit.
const maxMessage = 16 << 10

// errorRetryDelay is how long the loops wait after a storage error before trying again.
const errorRetryDelay = 100 * time.Millisecond

// Runner claims tasks of its kinds and runs their handlers (and its wake handler). Make one
// with New, then Start it and Stop it.
type Runner struct {
	q           *work.Queue
	cfg         Config
	kinds       []string
	log         *slog.Logger
	hooks       Hooks
	heartbeat   time.Duration
	maxAttempts uint32

	// lifetime: claimCtx ends when Stop starts (no more claims); runCtx is every handler's
	// parent and ends when Stop runs out of time.
	claimCtx    context.Context
	claimCancel context.CancelFunc
	runCtx      context.Context
	runCancel   context.CancelFunc

	mu         sync.Mutex
	started    bool
	stopping   bool
	closed     bool            // the queue was closed under the runner: nothing more to claim
	stopCtx    context.Context // Stop's, once it began: how long a failing store is retried
	free       int             // tasks the runner may still claim: Concurrency+Prefetch minus those it holds
	slots      int             // handler slots (goroutines) not running a handler
	ready      []*task         // claimed (prefetched), waiting for a slot
	active     int             // tasks claimed whose result is not queued yet
	finished   []finished      // results waiting for the next SettleAndClaim
	inFlight   int             // SettleAndClaim calls going (at most roundsInFlight)
	idle       bool            // the last claim found fewer tasks than it asked: wait before the next
	running    map[*task]struct{}
	waitCancel context.CancelFunc // ends the dispatcher's WaitTasks when a result arrives
	kick       chan struct{}      // cap 1: a result arrived or Stop began
	handlers   sync.WaitGroup     // task and wake handler goroutines
	loops      sync.WaitGroup     // the dispatcher and the wake loop
	stopOnce   sync.Once
	stopErr    error
}

// task is one claimed task while its handler runs.
type task struct {
	d        work.TaskDelivery               // the claim (heartbeats keep the same attempt and token)
	base     context.Context                 // the handler's context before Hooks.TaskStart
	hookCtx  atomic.Pointer[context.Context] // what Hooks.TaskStart returned, once it runs
	cancel   context.CancelCauseFunc
	hb       *time.Timer
	run      bool         // its handler started (set with started, under Runner.mu)
	started  time.Time    // when its handler started
	canceled atomic.Bool  // a cancel request was seen
	owner    atomic.Int32 // 0 while the handler runs; then who records the result (ownerHandler, ownerLost, ownerStop)
}

const (
	ownerHandler int32 = iota + 1
	ownerLost
	ownerStop
)

// ctx is the context Hooks.TaskStart returned, or the handler's base context when the
// handler never started.
func (t *task) ctx() context.Context {
	if c := t.hookCtx.Load(); c != nil {
		return *c
	}
	return t.base
}

// take makes who the one that records t's result; false when another already did.
func (t *task) take(who int32) bool { return t.owner.CompareAndSwap(0, who) }

// finished is one result for the next SettleAndClaim.
type finished struct {
	t      *task
	settle work.Settle
	res    TaskResult
}

// New checks cfg and returns a runner over q. A bad configuration is a *ConfigError naming
// the field.
func New(q *work.Queue, cfg Config) (*Runner, error) {
	if q == nil {
		return nil, &ConfigError{Field: "Queue", Message: "must not be nil"}
	}
	if len(cfg.Handlers) == 0 {
		return nil, &ConfigError{Field: "Handlers", Message: "must register at least one kind"}
	}
	kinds := make([]string, 0, len(cfg.Handlers))
	for k, h := range cfg.Handlers {
		if strings.TrimSpace(k) == "" {
			return nil, &ConfigError{Field: "Handlers", Message: "has a blank kind"}
		}
		if h == nil {
			return nil, &ConfigError{Field: "Handlers", Message: fmt.Sprintf("kind %q has a nil handler", k)}
		}
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	if cfg.Concurrency <= 0 {
		return nil, &ConfigError{Field: "Concurrency", Message: "must be positive"}
	}
	if cfg.Prefetch < 0 {
		return nil, &ConfigError{Field: "Prefetch", Message: "must not be negative"}
	}
	if cfg.LeaseFor <= 0 {
		return nil, &ConfigError{Field: "LeaseFor", Message: "must be positive"}
	}
	hb := cfg.Heartbeat
	switch {
	case hb < 0:
		return nil, &ConfigError{Field: "Heartbeat", Message: "must not be negative"}
	case hb == 0:
		hb = cfg.LeaseFor / 3
		if hb <= 0 {
			hb = cfg.LeaseFor
		}
	case hb >= cfg.LeaseFor:
		return nil, &ConfigError{Field: "Heartbeat", Message: "must be shorter than LeaseFor"}
	}
	if cfg.MaxAttempts < 0 {
		return nil, &ConfigError{Field: "MaxAttempts", Message: "must not be negative"}
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Backoff == nil {
		cfg.Backoff = ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax)
	}
	if cfg.WakeConcurrency < 0 {
		return nil, &ConfigError{Field: "WakeConcurrency", Message: "must not be negative"}
	}
	if cfg.WakeConcurrency == 0 {
		cfg.WakeConcurrency = DefaultWakeConcurrency
	}
	if cfg.WakeLeaseFor < 0 {
		return nil, &ConfigError{Field: "WakeLeaseFor", Message: "must not be negative"}
	}
	if cfg.WakeLeaseFor == 0 {
		cfg.WakeLeaseFor = cfg.LeaseFor
	}
	r := &Runner{q: q, cfg: cfg, kinds: kinds, log: cfg.Logger, hooks: cfg.Hooks, heartbeat: hb,
		maxAttempts: uint32(min(cfg.MaxAttempts, 1<<31)), free: cfg.Concurrency + cfg.Prefetch, slots: cfg.Concurrency,
		running: make(map[*task]struct{}), kick: make(chan struct{}, 1)}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.hooks == nil {
		r.hooks = NoHooks{}
	}
	r.claimCtx, r.claimCancel = context.WithCancel(context.Background())
	r.runCtx, r.runCancel = context.WithCancel(context.Background())
	return r, nil
}

// Kinds returns the task kinds the runner claims, sorted.
func (r *Runner) Kinds() []string { return slices.Clone(r.kinds) }

// Start starts claiming and running. It returns at once.
func (r *Runner) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.stopping:
		return ErrStopped
	case r.started:
		return ErrStarted
	}
	r.started = true
	r.log.Info("runner: started", "kinds", r.kinds, "concurrency", r.cfg.Concurrency, "lease", r.cfg.LeaseFor)
	r.loops.Go(r.dispatch)
	if r.cfg.WakeHandler != nil {
		r.loops.Go(r.wakeLoop)
	}
	return nil
}

// Stop stops gracefully: it stops claiming, lets the running handlers finish and records
// their results while ctx lasts, and then cancels the handlers still running (their
// context's cause is ErrStopping) and releases their tasks, so that they are delivered again
// at once rather than when their lease expires. Wake handlers still running then are
// canceled; their wakes are delivered again when their lease expires. Stop returns nil when
// every handler finished in time, else an error wrapping ctx's error that says how many
// tasks were released. A handler that ignores its context keeps running in its goroutine,
// but its result is not recorded. Calling Stop again returns the first call's result.
func (r *Runner) Stop(ctx context.Context) error {
	r.stopOnce.Do(func() { r.stopErr = r.stop(ctx) })
	return r.stopErr
}

func (r *Runner) stop(ctx context.Context) error {
	r.mu.Lock()
	r.stopping, r.stopCtx = true, ctx
	started := r.started
	// Prefetched tasks never started: they go back at once.
	for _, t := range r.ready {
		if t.take(ownerStop) {
			t.hb.Stop()
			t.cancel(ErrStopping)
			r.free++
			r.queue(finished{t: t, settle: work.Settle{Delivery: t.d,
				Release: &work.ReleaseRequest{Reason: "runner stopping"}},
				res: TaskResult{Result: Released, Err: ErrStopping}})
		}
	}
	r.ready = nil
	r.mu.Unlock()
	r.claimCancel()
	r.nudge()
	if !started {
		r.runCancel()
		return nil
	}
	done := make(chan struct{})
	go func() { r.handlers.Wait(); close(done) }()
	var stopErr error
	select {
	case <-done:
	case <-ctx.Done():
		released := 0
		r.mu.Lock()
		for t := range r.running {
			if !t.take(ownerStop) {
				continue
			}
			t.hb.Stop()
			t.cancel(ErrStopping)
			r.queue(finished{t: t, settle: work.Settle{Delivery: t.d,
				Release: &work.ReleaseRequest{Reason: "runner stopping"}},
				res: TaskResult{Result: Released, Err: ErrStopping, Duration: time.Since(t.started)}})
			released++
		}
		r.mu.Unlock()
		r.runCancel() // wake handlers too
		stopErr = fmt.Errorf("runner: stop: %d task(s) still running were released: %w", released, ctx.Err())
	}
	r.loops.Wait() // the dispatcher records every result queued, the releases included
	r.runCancel()
	r.log.Info("runner: stopped")
	return stopErr
}

// nudge wakes the dispatcher: a result arrived, or Stop began.
func (r *Runner) nudge() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// queue adds a result for the next SettleAndClaim; r.mu is held.
func (r *Runner) queue(f finished) {
	r.finished = append(r.finished, f)
	r.active--
	delete(r.running, f.t)
	if r.waitCancel != nil {
		r.waitCancel()
		r.waitCancel = nil
	}
	r.nudge()
}

// roundsInFlight is how many SettleAndClaim calls the dispatcher keeps going at once.
// Measured with W2 (bench/, 16 slots, handlers that return at once): one round in flight,
// after gather, carried 14.7-15.2 results per round; two carried 8.2-8.8 each (the second
// round takes the results that came while the first flies, so each fsync carries half) and
// were no faster. Without gather, one round in flight carried 8.1 (the slots split into
// two cohorts that alternate).
const roundsInFlight = 1

// dispatch is the goroutine that talks to the queue for tasks: each round settles every
// result that arrived since the last one and claims as many tasks as there are free slots,
// in one SettleAndClaim (one fsync on a durable store), then starts their handlers. When a
// round claimed fewer than it asked, nothing was due: it waits with WaitTasks (which a
// result also ends, to record it) before it claims again; when every slot is busy it waits
// for a result. It never polls.
func (r *Runner) dispatch() {
	r.mu.Lock()
	defer r.mu.Unlock()
	gathered := false
	for {
		if r.stopping && r.active == 0 && len(r.finished) == 0 && r.inFlight == 0 {
			return
		}
		want := r.free
		if r.stopping || r.closed || r.idle {
			want = 0
		}
		if (len(r.finished) > 0 || want > 0) && r.inFlight < roundsInFlight {
			if !gathered {
				r.gather()
				gathered = true
				continue // the results and free slots may have grown: look again
			}
			gathered = false
			batch := r.finished
			r.finished = nil
			r.free -= want
			r.inFlight++
			go r.round(batch, want)
			continue
		}
		if r.idle && r.inFlight == 0 && !r.stopping && !r.closed {
			r.waitForTasks()
			continue
		}
		// Every change that gives the dispatcher something to do nudges it: a result, a
		// free slot, a round's end, a lost lease, Stop.
		r.mu.Unlock()
		<-r.kick
		r.mu.Lock()
	}
}

// gatherYields is how many times the dispatcher yields, before a round, to handlers that
// are running.
const gatherYields = 3

// gather lets running handlers that are about to return do so before a round is sent, so
// that their results go in it rather than in the next one: with instant handlers, the 16
// goroutines a round started are runnable but have not run when the dispatcher looks, and
// without this each fsync carried a few of them. It yields the processor (r.mu released)
// at most gatherYields times, and only while some handler runs and has not reported. It
// adds no wait when no handler is running (an idle runner's first task). r.mu is held.
func (r *Runner) gather() {
	for range gatherYields {
		if r.active == 0 || r.stopping {
			break
		}
		r.mu.Unlock()
		runtime.Gosched()
		r.mu.Lock()
	}
}

// round records batch and claims up to want tasks, then gives back the slots it did not
// fill; claiming fewer than want makes the dispatcher idle (wait for tasks).
func (r *Runner) round(batch []finished, want int) {
	got := r.settleAndClaim(batch, want)
	r.mu.Lock()
	r.inFlight--
	r.free += want - got
	if got < want {
		r.idle = true
	}
	r.mu.Unlock()
	r.nudge()
}

// settleAndClaim is one SettleAndClaim: it reports every result of batch and starts a
// handler for each task claimed, and returns their number.
func (r *Runner) settleAndClaim(batch []finished, want int) int {
	settles := make([]work.Settle, len(batch))
	for i := range batch {
		settles[i] = batch[i].settle
	}
	// Background, not claimCtx: results are recorded during a stop too.
	results, ds, err := r.q.SettleAndClaim(context.Background(), settles, r.kinds, r.cfg.LeaseFor, want)
	if err != nil {
		r.mu.Lock()
		stopCtx := r.stopCtx
		r.mu.Unlock()
		if errors.Is(err, work.ErrClosed) || stopCtx != nil && stopCtx.Err() != nil {
			// Nothing can be recorded any more: the tasks stay claimed until their leases
			// expire, and are delivered again then.
			r.log.Error("runner: results dropped", "settles", len(batch), "err", err)
			for _, f := range batch {
				f.res.SettleErr = err
				r.hooks.TaskEnd(f.t.ctx(), f.settle.Delivery, f.res)
			}
			if errors.Is(err, work.ErrClosed) {
				r.mu.Lock()
				r.closed = true
				r.mu.Unlock()
			}
			return 0
		}
		r.log.Error("runner: settle and claim failed", "settles", len(batch), "err", err)
		r.mu.Lock()
		r.finished = append(batch, r.finished...) // try again
		r.mu.Unlock()
		wait := context.Background()
		if stopCtx != nil {
			wait = stopCtx
		}
		select {
		case <-time.After(errorRetryDelay):
		case <-wait.Done():
		}
		return 0
	}
	for i := range batch {
		var serr error
		if i < len(results) {
			serr = results[i].Err
		}
		r.recorded(batch[i], serr)
	}
	for _, d := range ds {
		r.startTask(d)
	}
	return len(ds)
}

// recorded reports a result the queue recorded (or refused with serr).
func (r *Runner) recorded(f finished, serr error) {
	d := f.settle.Delivery
	if serr != nil && errors.Is(serr, work.ErrInvalidRequest) && f.settle.Outcome != nil && f.settle.Outcome.State == work.TaskSucceeded {
		// The output was refused (not JSON, too large): the task fails, with the reason.
		err := fmt.Errorf("the handler's output was refused: %w", serr)
		r.log.Error("runner: task output refused", "task", d.Task.ID, "kind", d.Task.Kind, "err", serr)
		o := work.Failure(message(err))
		r.mu.Lock()
		r.active++
		r.queue(finished{t: f.t, settle: work.Settle{Delivery: d, Outcome: &o},
			res: TaskResult{Result: Failed, Err: err, Duration: f.res.Duration}})
		r.mu.Unlock()
		return
	}
	res := f.res
	res.SettleErr = serr
	attrs := []any{"task", d.Task.ID, "kind", d.Task.Kind, "attempt", d.Attempt, "result", res.Result}
	switch {
	case serr != nil:
		r.log.Error("runner: recording the result failed", append(attrs, "err", serr)...)
	case res.Result == Failed:
		r.log.Error("runner: task failed", append(attrs, "err", res.Err)...)
	case res.Result == Retried:
		r.log.Warn("runner: task will be retried", append(attrs, "retry_at", res.RetryAt, "err", res.Err)...)
	case res.Result == Released:
		r.log.Warn("runner: task released at stop", attrs...)
	default:
		r.log.Debug("runner: task done", attrs...)
	}
	r.hooks.TaskEnd(f.t.ctx(), d, res)
}

// waitForTasks waits, with r.mu held on entry and exit, until tasks of the runner's kinds
// may be claimable (then the dispatcher is no longer idle), a result arrives, or Stop
// begins.
func (r *Runner) waitForTasks() {
	if len(r.finished) > 0 {
		return
	}
	ctx, cancel := context.WithCancel(r.claimCtx)
	r.waitCancel = cancel
	r.mu.Unlock()
	err := r.q.WaitTasks(ctx, r.kinds)
	canceled := ctx.Err() != nil
	cancel()
	if err != nil && !canceled {
		r.log.Error("runner: waiting for tasks failed", "err", err)
		select {
		case <-time.After(errorRetryDelay):
		case <-r.claimCtx.Done():
		}
	}
	r.mu.Lock()
	r.waitCancel = nil
	if !canceled {
		r.idle = false // work may be due (or the wait failed: try a claim)
	}
}

// startTask starts d's handler in a goroutine if a slot is free, else keeps it ready
// (prefetched) for the next slot; its heartbeat starts now either way.
func (r *Runner) startTask(d work.TaskDelivery) {
	hctx, cancel := context.WithCancelCause(r.runCtx)
	t := &task{d: d, base: hctx, cancel: cancel}
	// Armed only once t.hb is set: the callback re-arms it.
	t.hb = time.AfterFunc(time.Duration(1<<62), func() { r.beat(t) })
	r.mu.Lock()
	r.active++
	r.running[t] = struct{}{}
	if r.stopping {
		// Claimed by a round that was in flight when Stop began: it goes back at once,
		// and no handler starts once Stop waits for them.
		t.take(ownerStop)
		t.hb.Stop()
		t.cancel(ErrStopping)
		r.free++
		r.queue(finished{t: t, settle: work.Settle{Delivery: d,
			Release: &work.ReleaseRequest{Reason: "runner stopping"}},
			res: TaskResult{Result: Released, Err: ErrStopping}})
		r.mu.Unlock()
		return
	}
	t.hb.Reset(r.heartbeat)
	if r.slots == 0 {
		r.ready = append(r.ready, t)
		r.mu.Unlock()
		return
	}
	r.slots--
	t.run, t.started = true, time.Now()
	r.handlers.Add(1)
	r.mu.Unlock()
	go r.runTasks(t)
}

// runTasks runs t, then the ready tasks while there are any: one goroutine per slot.
func (r *Runner) runTasks(t *task) {
	defer r.handlers.Done()
	for t != nil {
		t = r.runTask(t)
	}
}

// nextReady takes the next ready task that is still the runner's, or gives the slot back;
// r.mu is held.
func (r *Runner) nextReady() *task {
	for len(r.ready) > 0 {
		t := r.ready[0]
		r.ready[0] = nil
		r.ready = r.ready[1:]
		if t.owner.Load() == 0 {
			t.run, t.started = true, time.Now()
			return t
		}
	}
	r.slots++
	return nil
}

// beat extends t's lease, and re-arms itself while the handler runs.
func (r *Runner) beat(t *task) {
	if t.owner.Load() != 0 {
		return
	}
	d, err := r.q.Extend(r.runCtx, t.d, r.cfg.LeaseFor)
	switch {
	case errors.Is(err, work.ErrStaleDelivery):
		if t.take(ownerLost) {
			r.log.Warn("runner: task lease lost", "task", t.d.Task.ID, "kind", t.d.Task.Kind, "attempt", t.d.Attempt)
			t.cancel(ErrLeaseLost)
			r.mu.Lock()
			r.active--
			delete(r.running, t)
			if !t.run {
				r.free++ // no handler will return for it (nextReady skips it)
			}
			r.mu.Unlock()
			r.nudge()
			r.hooks.TaskEnd(t.ctx(), t.d, TaskResult{Result: LeaseLost, Err: ErrLeaseLost})
		}
		return
	case err != nil:
		// The lease may still hold: try again at the next beat.
		if t.owner.Load() == 0 && r.runCtx.Err() == nil {
			r.log.Warn("runner: heartbeat failed", "task", t.d.Task.ID, "err", err)
		}
	default:
		if !d.Task.CancelRequestedAt.IsZero() && !t.canceled.Swap(true) {
			r.log.Info("runner: cancel requested", "task", t.d.Task.ID, "kind", t.d.Task.Kind)
			t.cancel(ErrCancelRequested)
		}
	}
	if t.owner.Load() == 0 {
		t.hb.Reset(r.heartbeat)
	}
}

// runTask runs t's handler, queues its result, and returns the next ready task to run in
// this slot (nil: none).
func (r *Runner) runTask(t *task) *task {
	ctx := r.hooks.TaskStart(t.base, t.d)
	t.hookCtx.Store(&ctx)
	d := t.d
	var out json.RawMessage
	var err error
	ran := false
	switch {
	case !d.Task.CancelRequestedAt.IsZero():
		// Canceled while an earlier worker held it: nothing to run.
		t.canceled.Store(true)
		err = ErrCancelRequested
	case d.Attempt > r.maxAttempts:
		// Its earlier workers died (or their leases ran out) with every attempt.
		err = Permanent(fmt.Errorf("attempt %d is beyond MaxAttempts %d: earlier attempts never reported", d.Attempt, r.maxAttempts))
	default:
		ran = true
		out, err = r.call(ctx, r.cfg.Handlers[d.Task.Kind], d.Task)
	}
	t.hb.Stop()
	var took time.Duration
	if ran {
		took = time.Since(t.started)
	}
	if !t.take(ownerHandler) {
		// Lease lost or released by Stop: the result is not recorded.
		r.mu.Lock()
		r.free++
		next := r.nextReady()
		r.mu.Unlock()
		r.nudge()
		return next
	}
	f := finished{t: t, settle: work.Settle{Delivery: d}, res: TaskResult{Err: err, Duration: took}}
	switch {
	case err == nil:
		o := work.Success(out)
		f.settle.Outcome, f.res.Result = &o, Succeeded
	case t.canceled.Load():
		o := work.Cancellation()
		f.settle.Outcome, f.res.Result = &o, Canceled
	case IsPermanent(err) || d.Attempt >= r.maxAttempts:
		o := work.Failure(message(err))
		f.settle.Outcome, f.res.Result = &o, Failed
	default:
		f.res.RetryAt = time.Now().Add(max(r.cfg.Backoff(d.Attempt, err), 0))
		f.settle.Release = &work.ReleaseRequest{RunAt: f.res.RetryAt, Reason: message(err)}
		f.res.Result = Retried
	}
	r.mu.Lock()
	r.free++
	r.queue(f)
	next := r.nextReady()
	r.mu.Unlock()
	return next
}

// call runs h, turning a panic into a *PanicError.
func (r *Runner) call(ctx context.Context, h Handler, t work.Task) (out json.RawMessage, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = nil, &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, t)
}

// message is err's text as the queue records it: cut to maxMessage bytes of valid UTF-8.
func message(err error) string {
	s := err.Error()
	if len(s) > maxMessage {
		s = strings.ToValidUTF8(s[:maxMessage], "") + " [cut]"
	}
	return s
}

// wakeLoop claims wakes (up to WakeConcurrency at a time), runs the wake handler on each
// and acknowledges those it handled; it waits with WaitWakes when there are none.
func (r *Runner) wakeLoop() {
	for r.claimCtx.Err() == nil {
		ws, err := r.q.ClaimWakes(r.claimCtx, r.cfg.WakeLeaseFor, r.cfg.WakeConcurrency)
		if err == nil && len(ws) == 0 {
			err = r.q.WaitWakes(r.claimCtx)
		}
		if err != nil {
			if r.claimCtx.Err() != nil {
				return
			}
			r.log.Error("runner: claiming wakes failed", "err", err)
			select {
			case <-time.After(errorRetryDelay):
			case <-r.claimCtx.Done():
			}
			continue
		}
		r.mu.Lock()
		if r.stopping {
			// Stop waits for the handlers: none may start now. The wakes are delivered
			// again when their leases expire.
			r.mu.Unlock()
			return
		}
		r.handlers.Add(len(ws))
		r.mu.Unlock()
		var wg sync.WaitGroup
		for _, d := range ws {
			wg.Go(func() {
				defer r.handlers.Done()
				r.runWake(d)
			})
		}
		wg.Wait()
	}
}

func (r *Runner) runWake(d work.WakeDelivery) {
	ctx, cancel := context.WithDeadline(r.runCtx, d.LeaseExpiresAt)
	defer cancel()
	ctx = r.hooks.WakeStart(ctx, d)
	err := r.callWake(ctx, d.Wake)
	if err == nil {
		// Background: a wake handled before a stop is acknowledged during it too.
		err = r.q.AckWake(context.Background(), d)
	}
	if err != nil {
		r.log.Error("runner: wake not acknowledged", "wake", d.Wake.ID, "attempt", d.Attempt, "err", err)
	} else {
		r.log.Debug("runner: wake acknowledged", "wake", d.Wake.ID)
	}
	r.hooks.WakeEnd(ctx, d, err)
}

func (r *Runner) callWake(ctx context.Context, w work.Wake) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return r.cfg.WakeHandler(ctx, w)
}
