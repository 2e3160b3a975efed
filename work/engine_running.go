package work

import (
	"context"
	"errors"
	"time"
)

// errTODO marks the part-2 decide code not written yet (issue 13 in progress).
var errTODO = errors.New("work: not implemented yet")

var _ RunningBackend = (*logBackend)(nil)

func (b *logBackend) Extend(ctx context.Context, d TaskDelivery, leaseFor time.Duration, now time.Time) (TaskDelivery, error) {
	return TaskDelivery{}, backendErr(errTODO)
}

func (b *logBackend) Release(ctx context.Context, d TaskDelivery, r ReleaseRequest, now time.Time) (Task, error) {
	return Task{}, backendErr(errTODO)
}

func (b *logBackend) ClaimKinds(ctx context.Context, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	return nil, backendErr(errTODO)
}

func (b *logBackend) Tasks(ctx context.Context, sessionID string, f TaskFilter) ([]Task, error) {
	return nil, backendErr(errTODO)
}

func (b *logBackend) Stats(ctx context.Context, now time.Time) (QueueStats, error) {
	return QueueStats{}, backendErr(errTODO)
}

func (b *logBackend) SettleAndClaim(ctx context.Context, settles []Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]SettleResult, []TaskDelivery, error) {
	return nil, nil, backendErr(errTODO)
}
