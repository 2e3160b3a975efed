package runner

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/worklog/worklog/work"
)

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
