package runner

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/worklog/worklog/work"
)

// errorRetryDelay is how long the loops wait after a storage error before trying again.
const errorRetryDelay = 100 * time.Millisecond

// StopGrace is how long Stop waits, once its context has ended, for the releases of the
// tasks it canceled (and the results still queued) to be recorded, before it gives up on
// them. Stop returns at the latest StopGrace after its context ends (twice that if a call to
// the queue ignores its context).
const StopGrace = 2 * time.Second

// stopRetries is how many times in a row a round may fail during a stop before its results
// are dropped: Stop does not wait out its context on a store that failed.
const stopRetries = 3

// minCallBound is the least bound of one call to the queue (callBound: LeaseFor, or this
// when the lease is shorter).
const minCallBound = 5 * time.Second

// errGaveUp is why results are dropped once Stop gave up on the queue.
var errGaveUp = errors.New("runner: stop gave up: the queue did not record the results within StopGrace after the stop's context ended")

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

	// lifeCtx is the parent of every call the runner makes to the queue (each also bounded
	// by callBound): it ends when Stop gives up, StopGrace after its context ended.
	lifeCtx   context.Context
	giveUp    context.CancelCauseFunc
	callBound time.Duration

	mu           sync.Mutex
	started      bool
	stopping     bool
	closed       bool       // the queue was closed under the runner: nothing more to claim
	failures     int        // consecutive failed rounds
	dropped      int        // results given up (the queue closed, the store failed during a stop, Stop gave up)
	dropErr      error      // why the first of them was
	wakesRunning int        // wake handlers running
	gone         bool       // the dispatcher exited: nothing queued is recorded any more
	free         int        // tasks the runner may still claim: Concurrency+Prefetch minus those it holds
	slots        int        // handler slots (goroutines) not running a handler
	ready        []*task    // claimed (prefetched), waiting for a slot
	active       int        // tasks claimed whose result is not queued yet
	finished     []finished // results waiting for the next SettleAndClaim
	inFlight     int        // SettleAndClaim calls going (at most roundsInFlight)
	idle         bool       // the last claim found fewer tasks than it asked: wait before the next
	running      map[*task]struct{}
	waitCancel   context.CancelFunc // ends the dispatcher's WaitTasks when a result arrives
	kick         chan struct{}      // cap 1: a result arrived or Stop began
	handlers     sync.WaitGroup     // task and wake handler goroutines
	loops        sync.WaitGroup     // the dispatcher and the wake loop
	stopOnce     sync.Once
	stopErr      error
}

// task is one claimed task while its handler runs.
type task struct {
	d       work.TaskDelivery               // the claim (heartbeats keep the same attempt and token)
	base    context.Context                 // the handler's context before Hooks.TaskStart
	hookCtx atomic.Pointer[context.Context] // what Hooks.TaskStart returned, once it runs
	cancel  context.CancelCauseFunc
	// timer is the task's one timer (tick): it fires at the earliest of the next heartbeat,
	// the attempt's time limit and the lease deadline.
	timer    *time.Timer
	run      bool         // its handler started (set with started, under Runner.mu)
	started  time.Time    // when its handler started
	canceled atomic.Bool  // a cancel request was seen
	owner    atomic.Int32 // 0 while the handler runs; then who records the result (ownerHandler, ownerLost, ownerStop)
	// outcome is the result the handler's goroutine settles with (finished.settle.Outcome
	// points here, so that a result costs no allocation of its own): written once, by the
	// goroutine that took ownerHandler, before it queues the result under Runner.mu.
	outcome work.Outcome

	tm       sync.Mutex    // guards the fields below, and arms timer
	beatAt   time.Time     // the next heartbeat; zero while one is in flight, or none after a timeout
	leaseEnd time.Time     // the lease deadline: when the call that set the lease was sent + LeaseFor - LeaseMargin
	limitAt  time.Time     // the attempt's time limit (its handler's start + limit); zero: none
	limit    time.Duration // the attempt's time limit
	timedOut error         // the timeout's cause, once the limit passed
	ended    bool          // the handler returned, or the deadline passed: the timer does nothing more
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
	r.log.Info("runner: started", "kinds", r.kinds, "concurrency", r.cfg.Concurrency,
		"lease_seconds", r.cfg.LeaseFor.Seconds(), "lease_margin_seconds", r.cfg.LeaseMargin.Seconds())
	if len(r.kinds) > 0 {
		r.loops.Go(r.dispatch)
	}
	if r.cfg.WakeHandler != nil {
		r.loops.Go(r.wakeLoop)
	}
	return nil
}

// Stop stops gracefully: it stops claiming, lets the running handlers finish and records
// their results while ctx lasts, and then cancels the handlers still running (their
// context's cause is ErrStopping) and releases their tasks, so that they are delivered again
// at once rather than when their lease expires. Wake handlers still running then are
// canceled; their wakes are delivered again when their lease expires.
//
// Stop returns within ctx, or at the latest StopGrace after ctx ends: the releases of the
// tasks it canceled get that long to be recorded, and whatever is still unrecorded then
// (a store that stopped answering) is given up. It returns nil when every handler finished
// in time and every result was recorded, else a *StopError saying how many tasks were
// released and how many results could not be recorded (their tasks are delivered again when
// their leases expire); it wraps ctx's error when ctx ended first, and the store's error
// (errors.Is: work.ErrClosed, work.ErrBackend) when results were dropped. Results are
// dropped without waiting out ctx when the queue is closed, or when the store still fails
// after stopRetries tries during the stop. A handler that ignores its context keeps running
// in its goroutine, but its result is not recorded. Calling Stop again returns the first
// call's result.
func (r *Runner) Stop(ctx context.Context) error {
	r.stopOnce.Do(func() { r.stopErr = r.stop(ctx) })
	return r.stopErr
}

func (r *Runner) stop(ctx context.Context) error {
	r.mu.Lock()
	r.stopping = true
	started := r.started
	// Prefetched tasks never started: they go back at once.
	for _, t := range r.ready {
		if t.take(ownerStop) {
			t.stopTimer()
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
		r.abandon()
		return nil
	}
	handlersDone := make(chan struct{})
	go func() { r.handlers.Wait(); close(handlersDone) }()
	se := &StopError{}
	select {
	case <-handlersDone:
	case <-ctx.Done():
		se.Err = ctx.Err()
		r.mu.Lock()
		for t := range r.running {
			if !t.take(ownerStop) {
				continue // its handler returned: its result is queued
			}
			t.stopTimer()
			t.cancel(ErrStopping)
			r.queue(finished{t: t, settle: work.Settle{Delivery: t.d,
				Release: &work.ReleaseRequest{Reason: "runner stopping"}},
				res: TaskResult{Result: Released, Err: ErrStopping, Duration: time.Since(t.started)}})
			se.Released++
		}
		se.WakesCanceled = r.wakesRunning
		r.mu.Unlock()
		r.runCancel() // wake handlers too
	}
	// The dispatcher records every result queued, the releases included, and exits; the
	// wake loop exits. Both make only calls bounded by lifeCtx, which ends StopGrace after
	// ctx: then whatever is still unrecorded is dropped, and they return at once.
	loopsDone := make(chan struct{})
	go func() { r.loops.Wait(); close(loopsDone) }()
	select {
	case <-loopsDone:
	case <-ctx.Done():
		if se.Err == nil {
			se.Err = ctx.Err()
		}
		grace := time.NewTimer(StopGrace)
		select {
		case <-loopsDone:
		case <-grace.C:
			r.abandon()
			r.nudge()
			grace.Reset(StopGrace)
			select {
			case <-loopsDone:
			case <-grace.C:
				se.Abandoned = true // a store call that ignores its context: left behind
			}
		}
		grace.Stop()
	}
	r.runCancel()
	r.abandon()
	r.mu.Lock()
	se.Unrecorded, se.StoreErr = r.dropped, r.dropErr
	if se.Released == 0 && se.WakesCanceled == 0 && se.Unrecorded == 0 && !se.Abandoned {
		se.Err = nil // nothing was cut short: ctx ending after the work was done is no error
	}
	r.mu.Unlock()
	if se.Err == nil && se.StoreErr == nil && !se.Abandoned {
		r.log.Info("runner: stopped")
		return nil
	}
	r.log.Warn("runner: stopped", "err", se)
	return se
}

// abandon ends lifeCtx: every call to the queue still going returns, and the dispatcher
// drops what it has not recorded.
func (r *Runner) abandon() { r.giveUp(errGaveUp) }

// nudge wakes the dispatcher: a result arrived, or Stop began.
func (r *Runner) nudge() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// queue adds a result for the next SettleAndClaim; r.mu is held. After the dispatcher
// exited (Stop gave up) the result is dropped.
func (r *Runner) queue(f finished) {
	r.active--
	delete(r.running, f.t)
	if r.gone {
		go r.drop([]finished{f}, errGaveUp)
		return
	}
	r.finished = append(r.finished, f)
	if r.waitCancel != nil {
		r.waitCancel()
		r.waitCancel = nil
	}
	r.nudge()
}
