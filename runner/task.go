package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/worklog/worklog/work"
)

// startTask starts d's handler in a goroutine if a slot is free, else keeps it ready
// (prefetched) for the next slot; its heartbeat starts now either way, and its lease deadline
// counts from sent, when the call that claimed it was sent.
func (r *Runner) startTask(d work.TaskDelivery, sent time.Time) {
	hctx, cancel := context.WithCancelCause(r.runCtx)
	t := &task{d: d, base: hctx, cancel: cancel, leaseEnd: sent.Add(r.cfg.LeaseFor - r.cfg.LeaseMargin)}
	// Armed only once t.timer is set: the callback re-arms it.
	t.timer = time.AfterFunc(time.Duration(1<<62), func() { r.tick(t) })
	r.mu.Lock()
	r.active++
	r.running[t] = struct{}{}
	if r.stopping {
		// Claimed by a round that was in flight when Stop began: it goes back at once,
		// and no handler starts once Stop waits for them.
		t.take(ownerStop)
		t.stopTimer()
		t.cancel(ErrStopping)
		r.free++
		r.queue(finished{t: t, settle: work.Settle{Delivery: d,
			Release: &work.ReleaseRequest{Reason: "runner stopping"}},
			res: TaskResult{Result: Released, Err: ErrStopping}})
		r.mu.Unlock()
		return
	}
	t.tm.Lock()
	now := time.Now()
	t.beatAt = now.Add(r.heartbeat)
	t.arm(now)
	t.tm.Unlock()
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

// runTask runs t's handler, queues its result, and returns the next ready task to run in
// this slot (nil: none).
func (r *Runner) runTask(t *task) *task {
	d := t.d
	if limit := r.limit(d.Task.Kind); limit > 0 {
		t.tm.Lock()
		t.limit, t.limitAt = limit, t.started.Add(limit)
		if !t.ended {
			t.arm(time.Now())
		}
		t.tm.Unlock()
	}
	ctx := r.taskStart(t.base, t.d)
	if ctx != t.base { // t.ctx() is t.base until then: no pointer stored (and allocated) for it
		hctx := ctx // its own variable: only this branch moves a context to the heap
		t.hookCtx.Store(&hctx)
	}
	var out json.RawMessage
	var err error
	ran := false
	switch {
	case !d.Task.CancelRequestedAt.IsZero():
		// Canceled while an earlier worker held it: nothing to run.
		t.canceled.Store(true)
		err = ErrCancelRequested
	case runAttempt(d) > r.maxAttempts:
		// Its earlier workers died (or their leases ran out) with every attempt.
		err = Permanent(fmt.Errorf("attempt %d is beyond MaxAttempts %d: earlier attempts never reported", runAttempt(d), r.maxAttempts))
	default:
		ran = true
		out, err = r.call(ctx, r.cfg.Handlers[d.Task.Kind], d.Task)
	}
	t.tm.Lock()
	t.ended = true
	timedOut := t.timedOut
	t.tm.Unlock()
	t.timer.Stop()
	var took time.Duration
	if ran {
		took = time.Since(t.started)
	}
	if timedOut != nil {
		// The attempt ran past its limit: it failed, whatever the handler returned since.
		out, err = nil, timedOut
	}
	if !t.take(ownerHandler) {
		// Lease lost or run out, or released by Stop: the result is not recorded.
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
		t.outcome = work.Success(out)
		f.settle.Outcome, f.res.Result = &t.outcome, Succeeded
	case t.canceled.Load():
		t.outcome = work.Cancellation()
		f.settle.Outcome, f.res.Result = &t.outcome, Canceled
	case IsPermanent(err) || runAttempt(d) >= r.maxAttempts:
		t.outcome = work.Failure(message(err))
		f.settle.Outcome, f.res.Result = &t.outcome, Failed
	default:
		f.res.RetryAt = time.Now().Add(r.backoff(d, err))
		f.settle.Release = &work.ReleaseRequest{RunAt: f.res.RetryAt, Reason: reason(err)}
		f.res.Result = Retried
	}
	r.mu.Lock()
	r.free++
	r.queue(f)
	next := r.nextReady()
	r.mu.Unlock()
	return next
}

// limit is the time limit of an attempt of kind (0: none).
func (r *Runner) limit(kind string) time.Duration {
	if d, ok := r.cfg.KindTimeouts[kind]; ok {
		return d
	}
	return r.cfg.Timeout
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

// backoff is Config.Backoff's delay after d's attempt failed with err; a Backoff that panics
// is logged and replaced by the default's.
func (r *Runner) backoff(d work.TaskDelivery, err error) (wait time.Duration) {
	defer func() {
		if v := recover(); v != nil {
			r.log.Error("runner: Config.Backoff panicked (recovered); the default backoff is used",
				append(taskAttrs(d), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))...)
			wait = ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax)(runAttempt(d), err)
		}
	}()
	return max(r.cfg.Backoff(runAttempt(d), err), 0)
}

// runAttempt is d's attempt as MaxAttempts and Backoff count it: the attempts since the
// task was last retried by an operator (work.Session.Retry), which gives a task that had
// exhausted MaxAttempts as many again. Attempt numbers in the log never repeat; this count
// starts at 1 after each retry.
func runAttempt(d work.TaskDelivery) uint32 {
	if d.Attempt <= d.Task.AttemptsAtRetry { // not a delivery of this task's current run
		return d.Attempt
	}
	return d.Attempt - d.Task.AttemptsAtRetry
}
