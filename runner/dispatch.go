package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/worklog/worklog/work"
)

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
			r.gone = true
			return
		}
		if r.lifeCtx.Err() != nil && r.inFlight == 0 {
			// Stop gave up: what is queued is dropped, and so is what comes later (queue).
			batch := r.finished
			r.finished, r.gone = nil, true
			r.mu.Unlock()
			r.drop(batch, context.Cause(r.lifeCtx))
			r.mu.Lock()
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
			// In loops: Stop waits for the round's hooks too.
			r.loops.Go(func() { r.round(batch, want) })
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
// fill; claiming fewer than want makes the dispatcher idle (wait for tasks). The recorded
// results are reported (their log records, Hooks.TaskEnd) only after the round is over and
// its tasks started: the next round and the handlers do not wait for the hooks.
func (r *Runner) round(batch []finished, want int) {
	got, report := r.settleAndClaim(batch, want)
	r.mu.Lock()
	r.inFlight--
	r.free += want - got
	if got < want {
		r.idle = true
	}
	r.mu.Unlock()
	r.nudge()
	for _, f := range report {
		r.report(f)
	}
}

// settleAndClaim is one SettleAndClaim: it starts a handler for each task claimed, and
// returns their number and the results of batch to report (the queue recorded them, or
// refused them with res.SettleErr set). A result whose output was refused is not reported: it
// is queued again, as a failure, for the next round.
func (r *Runner) settleAndClaim(batch []finished, want int) (int, []finished) {
	settles := make([]work.Settle, len(batch))
	for i := range batch {
		settles[i] = batch[i].settle
	}
	// lifeCtx, not claimCtx: results are recorded during a stop too.
	ctx, cancel := r.callCtx()
	sent := time.Now() // the leases it claims expire LeaseFor after this, or later
	results, ds, err := r.q.SettleAndClaim(ctx, settles, r.kinds, r.cfg.LeaseFor, want)
	cancel()
	if err != nil {
		r.mu.Lock()
		r.failures++
		closed := errors.Is(err, work.ErrClosed)
		gaveUp := r.lifeCtx.Err() != nil
		// Nothing can be recorded any more when the queue is closed or Stop gave up; during a
		// stop a store that keeps failing is not waited for either (it may have failed for
		// good: a Pebble store does after a failed write).
		drop := closed || gaveUp || r.stopping && r.failures >= stopRetries
		if closed {
			r.closed = true
		}
		if !drop {
			r.finished = append(batch, r.finished...) // try again
		}
		r.mu.Unlock()
		if drop {
			if gaveUp {
				err = fmt.Errorf("%w: %w", context.Cause(r.lifeCtx), err)
			}
			r.drop(batch, err)
			return 0, nil
		}
		r.log.Error("runner: settle and claim failed", "settles", len(batch), "err", err)
		select {
		case <-time.After(errorRetryDelay):
		case <-r.lifeCtx.Done():
		}
		return 0, nil
	}
	r.mu.Lock()
	r.failures = 0
	r.mu.Unlock()
	// Before the round ends (the dispatcher may exit once it has, and a result queued later
	// would be dropped): the refused outputs go back as failures.
	report := batch[:0]
	for i := range batch {
		f := batch[i]
		if i < len(results) {
			f.res.SettleErr, f.res.Seq = results[i].Err, results[i].Seq
		}
		if !r.refused(f) {
			report = append(report, f)
		}
	}
	for _, d := range ds {
		r.startTask(d, sent)
	}
	return len(ds), report
}

// drop gives up on recording batch's results for err: the tasks stay claimed until their
// leases expire, and are delivered again then. Stop's error counts them.
func (r *Runner) drop(batch []finished, err error) {
	if len(batch) == 0 {
		return
	}
	r.log.Error("runner: results dropped", "settles", len(batch), "err", err)
	r.mu.Lock()
	r.dropped += len(batch)
	if r.dropErr == nil {
		r.dropErr = err
	}
	r.mu.Unlock()
	for _, f := range batch {
		f.res.SettleErr = err
		r.taskEnd(f.t.ctx(), f.settle.Delivery, f.res)
	}
}

// callCtx is the context of one call to the queue: bounded by callBound, and ended when Stop
// gives up.
func (r *Runner) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.lifeCtx, r.callBound)
}

// refused queues f again as a failure, with the reason, when the queue refused its output
// (not JSON, too large), and reports whether it did.
func (r *Runner) refused(f finished) bool {
	d, serr := f.settle.Delivery, f.res.SettleErr
	if serr == nil || !errors.Is(serr, work.ErrInvalidRequest) || f.settle.Outcome == nil || f.settle.Outcome.State != work.TaskSucceeded {
		return false
	}
	err := fmt.Errorf("the handler's output was refused: %w", serr)
	r.log.ErrorContext(f.t.ctx(), "runner: task output refused", append(taskAttrs(d), "err", serr)...)
	o := work.Failure(message(err))
	r.mu.Lock()
	r.active++
	r.queue(finished{t: f.t, settle: work.Settle{Delivery: d, Outcome: &o},
		res: TaskResult{Result: Failed, Err: err, Duration: f.res.Duration}})
	r.mu.Unlock()
	return true
}

// report logs a result the queue recorded (or refused with res.SettleErr) and calls
// Hooks.TaskEnd. The levels are what an operator acts on: a retry is INFO (the queue will
// try again: nothing to do yet), a failure on the last attempt WARN (the task is failed, by
// errors that were worth retrying), a permanent failure ERROR (the handler said it cannot
// succeed), and so is a result the queue could not record; a success is DEBUG.
func (r *Runner) report(f finished) {
	d, res := f.settle.Delivery, f.res
	ctx := f.t.ctx()
	level, msg := slog.LevelDebug, "runner: task done"
	switch {
	case res.SettleErr != nil:
		level, msg = slog.LevelError, "runner: recording the result failed"
	case res.Result == Failed && IsPermanent(res.Err):
		level, msg = slog.LevelError, "runner: task failed"
	case res.Result == Failed:
		level, msg = slog.LevelWarn, "runner: task failed on its last attempt"
	case res.Result == Retried:
		level, msg = slog.LevelInfo, "runner: task will be retried"
	case res.Result == Released:
		level, msg = slog.LevelWarn, "runner: task released at stop"
	}
	// The attributes are built only for a record the logger keeps: a success is at Debug,
	// which a logger usually drops, and W2 runs tens of thousands of them a second.
	if r.log.Enabled(ctx, level) {
		attrs := append(taskAttrs(d), slog.String("result", res.Result.String()))
		if res.Duration > 0 {
			attrs = append(attrs, slog.Float64("duration_seconds", res.Duration.Seconds()))
		}
		switch {
		case res.SettleErr != nil:
			attrs = append(attrs, "err", res.SettleErr)
		case res.Result == Retried:
			attrs = append(attrs, "retry_at", res.RetryAt,
				slog.Float64("retry_in_seconds", max(time.Until(res.RetryAt), 0).Seconds()), "err", res.Err)
		case res.Err != nil && res.Result != Released:
			attrs = append(attrs, "err", res.Err)
		}
		r.log.Log(ctx, level, msg, attrs...)
	}
	r.taskEnd(ctx, d, res)
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
