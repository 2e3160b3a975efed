package runner

import (
	"context"
	"errors"
	"time"

	"github.com/worklog/worklog/work"
)

// A claimed task has one timer (task.timer), armed at the earliest of three instants: its next
// heartbeat, its attempt's time limit, and its lease deadline. The lease deadline is when the
// call that set the lease (the claim's SettleAndClaim, or the last heartbeat that succeeded)
// was sent, on the runner's monotonic clock, + LeaseFor - LeaseMargin: the queue set the
// lease's expiry from its own clock after that moment, so the deadline comes at least
// LeaseMargin before any other worker can claim the task, whatever the offset between the
// clocks. The handler's context ends at the earlier of the time limit (ErrTimeout) and the
// lease deadline (ErrLeaseExpired).

// arm sets t's timer to the earliest of its next heartbeat, its time limit (until it passed)
// and its lease deadline; t.tm is held.
func (t *task) arm(now time.Time) {
	next := t.leaseEnd
	if !t.limitAt.IsZero() && t.timedOut == nil && t.limitAt.Before(next) {
		next = t.limitAt
	}
	if !t.beatAt.IsZero() && t.beatAt.Before(next) {
		next = t.beatAt
	}
	t.timer.Reset(next.Sub(now))
}

// stopTimer ends t's timer: its handler returned, or its result is someone else's.
func (t *task) stopTimer() {
	t.tm.Lock()
	t.ended = true
	t.tm.Unlock()
	t.timer.Stop()
}

// tick is t's timer: it ends t's lease when its deadline passed, cancels the handler when its
// time limit passed, beats when a heartbeat is due, and re-arms the timer.
func (r *Runner) tick(t *task) {
	t.tm.Lock()
	if t.ended || t.owner.Load() != 0 {
		t.tm.Unlock()
		return
	}
	now := time.Now()
	switch {
	case !now.Before(t.leaseEnd):
		t.ended = true
		t.tm.Unlock()
		r.lose(t, ErrLeaseExpired)
	case !t.limitAt.IsZero() && t.timedOut == nil && !now.Before(t.limitAt):
		// No more heartbeats: the handler has what is left of its lease to return.
		t.timedOut = timeoutError(t.limit)
		t.beatAt = time.Time{}
		t.arm(now)
		cause := t.timedOut
		t.tm.Unlock()
		r.log.WarnContext(t.ctx(), "runner: task timed out", append(taskAttrs(t.d), "timeout_seconds", t.limit.Seconds())...)
		t.cancel(cause)
	case !t.beatAt.IsZero() && !now.Before(t.beatAt):
		t.beatAt = time.Time{} // one heartbeat at a time; the deadline stays armed meanwhile
		leaseEnd := t.leaseEnd
		t.arm(now)
		t.tm.Unlock()
		r.beat(t, leaseEnd)
	default:
		t.arm(now) // early: a Reset raced with a firing
		t.tm.Unlock()
	}
}

// beat extends t's lease, within its lease deadline leaseEnd (an extension recorded later
// comes too late: the handler's context ended), and schedules the next heartbeat.
func (r *Runner) beat(t *task, leaseEnd time.Time) {
	sent := time.Now()
	ctx, cancel := context.WithDeadline(r.runCtx, leaseEnd)
	d, err := r.q.Extend(ctx, t.d, r.cfg.LeaseFor)
	cancel()
	switch {
	case errors.Is(err, work.ErrStaleDelivery):
		r.lose(t, ErrLeaseLost)
		return
	case err != nil:
		// The lease may still hold: try again at the next beat, until the lease deadline.
		if t.owner.Load() == 0 && r.runCtx.Err() == nil {
			r.log.WarnContext(t.ctx(), "runner: heartbeat failed", append(taskAttrs(t.d),
				"lease_deadline_in_seconds", time.Until(leaseEnd).Seconds(), "err", err)...)
		}
	default:
		if !d.Task.CancelRequestedAt.IsZero() && !t.canceled.Swap(true) {
			r.log.InfoContext(t.ctx(), "runner: cancel requested", taskAttrs(t.d)...)
			t.cancel(ErrCancelRequested)
		}
	}
	now := time.Now()
	t.tm.Lock()
	defer t.tm.Unlock()
	if err == nil {
		if end := sent.Add(r.cfg.LeaseFor - r.cfg.LeaseMargin); end.After(t.leaseEnd) {
			t.leaseEnd = end
		}
	}
	if t.ended {
		return
	}
	if t.timedOut == nil {
		t.beatAt = now.Add(r.heartbeat)
	}
	t.arm(now)
}

// lose gives t up: its lease is lost (ErrLeaseLost: another worker claimed it) or runs out
// (ErrLeaseExpired: it could not be extended). Its handler's context is canceled with cause,
// and nothing of its attempt is recorded, neither a settle nor a release: the lease is not
// the runner's any more. Its slot frees when its handler returns.
func (r *Runner) lose(t *task, cause error) {
	if !t.take(ownerLost) {
		return
	}
	t.stopTimer()
	attrs := taskAttrs(t.d)
	if errors.Is(cause, ErrLeaseExpired) {
		r.log.WarnContext(t.ctx(), "runner: task lease expiring: the handler's context is canceled, nothing is recorded; the task is delivered again once its lease expires",
			append(attrs, "lease_margin_seconds", r.cfg.LeaseMargin.Seconds())...)
	} else {
		r.log.WarnContext(t.ctx(), "runner: task lease lost", attrs...)
	}
	t.cancel(cause)
	r.mu.Lock()
	r.active--
	delete(r.running, t)
	if !t.run {
		r.free++ // no handler will return for it (nextReady skips it)
	}
	r.mu.Unlock()
	r.nudge()
	var took time.Duration
	r.mu.Lock()
	if t.run {
		took = time.Since(t.started)
	}
	r.mu.Unlock()
	r.taskEnd(t.ctx(), t.d, TaskResult{Result: LeaseLost, Err: cause, Duration: took})
}
