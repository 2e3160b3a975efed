package runner

import (
	"context"
	"runtime/debug"
	"sync"
	"time"

	"github.com/worklog/worklog/work"
)

// wakeLoop claims wakes (up to WakeConcurrency at a time; only WakeSessions' when set), runs
// the wake handler on each and acknowledges those it handled; it waits with WaitWakes when
// there are none (WaitSessionWakes with WakeSessions: a wake of another session does not end
// the wait).
func (r *Runner) wakeLoop() {
	for r.claimCtx.Err() == nil {
		ctx, cancel := context.WithTimeout(r.claimCtx, r.callBound)
		var ws []work.WakeDelivery
		var err error
		if len(r.cfg.WakeSessions) > 0 {
			ws, err = r.q.ClaimSessionWakes(ctx, r.cfg.WakeSessions, r.cfg.WakeLeaseFor, r.cfg.WakeConcurrency)
		} else {
			ws, err = r.q.ClaimWakes(ctx, r.cfg.WakeLeaseFor, r.cfg.WakeConcurrency)
		}
		cancel()
		if err == nil && len(ws) == 0 {
			if len(r.cfg.WakeSessions) > 0 {
				err = r.q.WaitSessionWakes(r.claimCtx, r.cfg.WakeSessions)
			} else {
				err = r.q.WaitWakes(r.claimCtx)
			}
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
		r.wakesRunning += len(ws)
		r.mu.Unlock()
		var wg sync.WaitGroup
		for _, d := range ws {
			wg.Go(func() {
				defer r.handlers.Done()
				r.runWake(d)
				r.mu.Lock()
				r.wakesRunning--
				r.mu.Unlock()
			})
		}
		// Stop waits for the handlers itself, within its context: the loop does not wait
		// for one that ignores its context once claiming has ended.
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-r.claimCtx.Done():
			return
		}
	}
}

func (r *Runner) runWake(d work.WakeDelivery) {
	ctx, cancel := context.WithDeadline(r.runCtx, d.LeaseExpiresAt)
	defer cancel()
	ctx = r.wakeStart(ctx, d)
	err := r.callWake(ctx, d.Wake)
	if err == nil {
		// lifeCtx: a wake handled before a stop is acknowledged during it too.
		actx, cancel := r.callCtx()
		err = r.q.AckWake(actx, d)
		cancel()
	}
	if err != nil {
		r.log.ErrorContext(ctx, "runner: wake not acknowledged", "wake_id", d.Wake.ID, "session", d.Wake.SessionID, "attempt", d.Attempt, "err", err)
	} else {
		r.log.DebugContext(ctx, "runner: wake acknowledged", "wake_id", d.Wake.ID, "session", d.Wake.SessionID, "attempt", d.Attempt)
	}
	r.wakeEnd(ctx, d, err)
}

func (r *Runner) callWake(ctx context.Context, w work.Wake) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return r.cfg.WakeHandler(ctx, w)
}
