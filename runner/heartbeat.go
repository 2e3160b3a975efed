package runner

import (
	"context"
	"errors"

	"github.com/worklog/worklog/work"
)

// beat extends t's lease, and re-arms itself while the handler runs.
func (r *Runner) beat(t *task) {
	if t.owner.Load() != 0 {
		return
	}
	// Bounded by the lease: an extension that cannot be recorded within it is too late.
	ctx, cancel := context.WithTimeout(r.runCtx, r.cfg.LeaseFor)
	d, err := r.q.Extend(ctx, t.d, r.cfg.LeaseFor)
	cancel()
	switch {
	case errors.Is(err, work.ErrStaleDelivery):
		if t.take(ownerLost) {
			r.log.WarnContext(t.ctx(), "runner: task lease lost", taskAttrs(t.d)...)
			t.cancel(ErrLeaseLost)
			r.mu.Lock()
			r.active--
			delete(r.running, t)
			if !t.run {
				r.free++ // no handler will return for it (nextReady skips it)
			}
			r.mu.Unlock()
			r.nudge()
			r.taskEnd(t.ctx(), t.d, TaskResult{Result: LeaseLost, Err: ErrLeaseLost})
		}
		return
	case err != nil:
		// The lease may still hold: try again at the next beat.
		if t.owner.Load() == 0 && r.runCtx.Err() == nil {
			r.log.WarnContext(t.ctx(), "runner: heartbeat failed", append(taskAttrs(t.d), "err", err)...)
		}
	default:
		if !d.Task.CancelRequestedAt.IsZero() && !t.canceled.Swap(true) {
			r.log.InfoContext(t.ctx(), "runner: cancel requested", taskAttrs(t.d)...)
			t.cancel(ErrCancelRequested)
		}
	}
	if t.owner.Load() == 0 {
		t.hb.Reset(r.heartbeat)
	}
}
