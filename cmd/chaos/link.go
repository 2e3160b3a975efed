package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/worklog/worklog/work"
)

// link is a goroutine group's way to the Pebble queue of its process: a work.Backend that
// forwards every call to the queue through a gate the nemesis can cut, as the proxy cuts a
// PostgreSQL client's connections: "freeze" holds calls until the link heals (or the call's
// context ends), "drop" fails them before they reach the queue (work.ErrBackend: nothing
// happened), "delay" holds each call a while. The group's manual operations and its runner
// both use a queue over its link (work.New), so a cut link is a runner whose heartbeats fail.
type link struct {
	q *work.Queue

	mu    sync.Mutex
	mode  string
	delay time.Duration
	heal  chan struct{} // closed when a freeze ends
}

func newLink(q *work.Queue) *link { return &link{q: q, heal: make(chan struct{})} }

var errDropped = fmt.Errorf("chaos: the link is cut: %w", work.NewBackendError(fmt.Errorf("partitioned")))

func (l *link) set(mode string, delay time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mode == "freeze" && mode != "freeze" {
		close(l.heal)
		l.heal = make(chan struct{})
	}
	l.mode, l.delay = mode, delay
}

// gate lets a call through, or fails it.
func (l *link) gate(ctx context.Context) error {
	for {
		l.mu.Lock()
		mode, delay, heal := l.mode, l.delay, l.heal
		l.mu.Unlock()
		switch mode {
		case "freeze":
			select {
			case <-heal:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		case "drop":
			return errDropped
		case "delay":
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
}

func (l *link) Now() time.Time { return time.Now() }

func (l *link) Submit(ctx context.Context, sessionID string, r work.TaskRequest, now time.Time) (work.Task, error) {
	if err := l.gate(ctx); err != nil {
		return work.Task{}, err
	}
	return l.q.Session(sessionID).SubmitAt(ctx, r, now)
}

func (l *link) Task(ctx context.Context, sessionID, taskID string) (work.Task, bool, error) {
	if err := l.gate(ctx); err != nil {
		return work.Task{}, false, err
	}
	return l.q.Session(sessionID).Task(ctx, taskID)
}

func (l *link) Cancel(ctx context.Context, sessionID, taskID string, now time.Time) (work.Task, error) {
	if err := l.gate(ctx); err != nil {
		return work.Task{}, err
	}
	return l.q.Session(sessionID).CancelAt(ctx, taskID, now)
}

func (l *link) ClaimDue(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]work.TaskDelivery, error) {
	if err := l.gate(ctx); err != nil {
		return nil, err
	}
	return l.q.ClaimDueAt(ctx, now, leaseFor, limit)
}

func (l *link) Finish(ctx context.Context, d work.TaskDelivery, o work.Outcome, now time.Time) (work.Task, error) {
	if err := l.gate(ctx); err != nil {
		return work.Task{}, err
	}
	return l.q.FinishAt(ctx, d, o, now)
}

func (l *link) RequestWake(ctx context.Context, sessionID string, r work.WakeRequest, now time.Time) (work.Wake, error) {
	if err := l.gate(ctx); err != nil {
		return work.Wake{}, err
	}
	return l.q.Session(sessionID).WakeAt(ctx, r, now)
}

func (l *link) ClaimWakes(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]work.WakeDelivery, error) {
	if err := l.gate(ctx); err != nil {
		return nil, err
	}
	return l.q.ClaimWakesAt(ctx, now, leaseFor, limit)
}

func (l *link) AckWake(ctx context.Context, d work.WakeDelivery) error {
	if err := l.gate(ctx); err != nil {
		return err
	}
	return l.q.AckWake(ctx, d)
}

func (l *link) AckWakeAt(ctx context.Context, d work.WakeDelivery, now time.Time) error {
	if err := l.gate(ctx); err != nil {
		return err
	}
	return l.q.AckWakeAt(ctx, d, now)
}

func (l *link) Close() error { return nil } // the process's queue is closed by its owner

func (l *link) Extend(ctx context.Context, d work.TaskDelivery, leaseFor time.Duration, now time.Time) (work.TaskDelivery, error) {
	if err := l.gate(ctx); err != nil {
		return work.TaskDelivery{}, err
	}
	return l.q.ExtendAt(ctx, d, leaseFor, now)
}

func (l *link) Release(ctx context.Context, d work.TaskDelivery, r work.ReleaseRequest, now time.Time) (work.Task, error) {
	if err := l.gate(ctx); err != nil {
		return work.Task{}, err
	}
	return l.q.ReleaseAt(ctx, d, r, now)
}

func (l *link) ClaimKinds(ctx context.Context, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]work.TaskDelivery, error) {
	if err := l.gate(ctx); err != nil {
		return nil, err
	}
	return l.q.ClaimKindsAt(ctx, kinds, now, leaseFor, limit)
}

func (l *link) Tasks(ctx context.Context, sessionID string, f work.TaskFilter) ([]work.Task, error) {
	if err := l.gate(ctx); err != nil {
		return nil, err
	}
	return l.q.Session(sessionID).Tasks(ctx, f)
}

func (l *link) Stats(ctx context.Context, now time.Time) (work.QueueStats, error) {
	if err := l.gate(ctx); err != nil {
		return work.QueueStats{}, err
	}
	return l.q.StatsAt(ctx, now)
}

func (l *link) SettleAndClaim(ctx context.Context, settles []work.Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]work.SettleResult, []work.TaskDelivery, error) {
	if err := l.gate(ctx); err != nil {
		return nil, nil, err
	}
	return l.q.SettleAndClaimAt(ctx, settles, kinds, now, leaseFor, limit)
}

func (l *link) WaitTasks(ctx context.Context, kinds []string) error {
	if err := l.gate(ctx); err != nil {
		return err
	}
	return l.q.WaitTasks(ctx, kinds)
}

func (l *link) WaitWakes(ctx context.Context) error {
	if err := l.gate(ctx); err != nil {
		return err
	}
	return l.q.WaitWakes(ctx)
}

// The link must give its queue every capability the workload and the runner use.
var (
	_ work.Backend        = (*link)(nil)
	_ work.RunningBackend = (*link)(nil)
	_ work.Waiter         = (*link)(nil)
	_ work.WakeAckerAt    = (*link)(nil)
	_ work.Clock          = (*link)(nil)
)

func (l *link) TaskByKey(ctx context.Context, sessionID, key string) (work.Task, bool, error) {
	if err := l.gate(ctx); err != nil {
		return work.Task{}, false, err
	}
	t, err := l.q.Session(sessionID).TaskByKey(ctx, key)
	if err != nil {
		if errors.Is(err, work.ErrTaskNotFound) {
			return work.Task{}, false, nil
		}
		return work.Task{}, false, err
	}
	return t, true, nil
}

func (l *link) Retry(ctx context.Context, sessionID, taskID string, runAt, now time.Time) (work.Task, error) {
	if err := l.gate(ctx); err != nil {
		return work.Task{}, err
	}
	return l.q.Session(sessionID).RetryAt(ctx, taskID, runAt, now)
}

func (l *link) SubmitMany(ctx context.Context, sessionID string, rs []work.TaskRequest, now time.Time) ([]work.SubmitResult, error) {
	if err := l.gate(ctx); err != nil {
		return nil, err
	}
	return l.q.Session(sessionID).SubmitManyAt(ctx, rs, now)
}

var _ work.SessionBackend = (*link)(nil)
