package work

import (
	"context"
	"time"
)

// Backend is the storage and leasing provider under a Queue (seed: WorkBackend). Queue and
// Session validate requests before calling it, as in the seed; a backend owns persistence,
// atomic claim fencing, restart behaviour and retention.
//
// Submit and RequestWake enforce session-scoped idempotency. Claims are at least once: an
// expired, unfinished lease becomes eligible again. Finish and AckWake fence stale lease
// tokens and are idempotent when repeated with the same token (and, for Finish, the same
// outcome).
//
// NewInMemory and Open return queues over worklog's own event-sourced backend; New takes any
// other implementation.
type Backend interface {
	Submit(ctx context.Context, sessionID string, r TaskRequest, now time.Time) (Task, error)
	Task(ctx context.Context, sessionID, taskID string) (Task, bool, error)
	Cancel(ctx context.Context, sessionID, taskID string, now time.Time) (Task, error)
	ClaimDue(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error)
	Finish(ctx context.Context, d TaskDelivery, o Outcome, now time.Time) (Task, error)
	RequestWake(ctx context.Context, sessionID string, r WakeRequest, now time.Time) (Wake, error)
	ClaimWakes(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]WakeDelivery, error)
	AckWake(ctx context.Context, d WakeDelivery) error
	Close() error
}

// ackerAt is implemented by backends that record the time of an acknowledgment. The seed's
// acknowledge_wake takes no time; Queue.AckWakeAt passes the caller's when it can.
type ackerAt interface {
	AckWakeAt(ctx context.Context, d WakeDelivery, now time.Time) error
}
