package work

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/worklog/worklog/events"
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
//
// A Backend may implement more: New resolves, once, which of the optional interfaces below b
// implements (RunningBackend, WakeAckerAt, LogReader, Follower, Verifier, Pruner, Waiter,
// Checkpointer, Clock, SessionBackend, KindPolicyBackend, ScheduleBackend,
// SessionWakeClaimer, SessionWakeWaiter), and the queue's methods that need one call it. A method whose
// capability the backend lacks returns an ErrBackend error naming the interface, never a
// silent no-op. worklog's own backend (under a queue from NewInMemory, Open or
// postgres.Open) implements them all.
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

// WakeAckerAt is implemented by a backend that records the time of an acknowledgment. The
// seed's acknowledge_wake takes no time: Queue.AckWakeAt passes the caller's time to a
// backend that implements it, and calls AckWake on one that does not.
type WakeAckerAt interface {
	AckWakeAt(ctx context.Context, d WakeDelivery, now time.Time) error
}

// LogReader is implemented by a backend that keeps an event log (Queue.ReadLog): fn is called
// for each event with sequence >= from, in order, until it returns an error.
type LogReader interface {
	ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error
}

// Verifier is implemented by a backend that can check its own state (Queue.Verify): nil when
// all holds, else an error (worklog's: an ErrBackend error wrapping a *VerifyError).
type Verifier interface {
	Verify(ctx context.Context) error
}

// Pruner is implemented by a backend that can prune history (Queue.Prune, which validates
// before and then calls it).
type Pruner interface {
	Prune(ctx context.Context, before time.Time) (PruneResult, error)
}

// Waiter is implemented by a backend that signals its commits (Queue.WaitTasks and
// Queue.WaitWakes, which validate the kinds and then call it, with their contract).
type Waiter interface {
	WaitTasks(ctx context.Context, kinds []string) error
	WaitWakes(ctx context.Context) error
}

// Checkpointer is implemented by a backend that can copy its store while it runs
// (Queue.Checkpoint).
type Checkpointer interface {
	Checkpoint(dir string) error
}

// Clock is implemented by a backend whose time decides (postgres.Open's: the database
// server's clock): a queue over it takes the time of its methods without an At twin, and of
// its background pruner, from Now instead of the host's wall clock.
type Clock interface {
	Now() time.Time
}

// backendCaps are the optional interfaces of a queue's Backend, asserted once, when the queue
// is built (New, newEngineQueue); nil where the backend lacks one.
type backendCaps struct {
	running    RunningBackend
	sessWakes  SessionWakeClaimer
	ackAt      WakeAckerAt
	log        LogReader
	follow     Follower
	verify     Verifier
	prune      Pruner
	wait       Waiter
	checkpoint Checkpointer
	clock      Clock
	session    SessionBackend
	kindPolicy KindPolicyBackend
	schedule   ScheduleBackend
	sessWait   SessionWakeWaiter
}

func resolveBackendCaps(b Backend) backendCaps {
	var c backendCaps
	c.running, _ = b.(RunningBackend)
	c.sessWakes, _ = b.(SessionWakeClaimer)
	c.ackAt, _ = b.(WakeAckerAt)
	c.log, _ = b.(LogReader)
	c.follow, _ = b.(Follower)
	c.verify, _ = b.(Verifier)
	c.prune, _ = b.(Pruner)
	c.wait, _ = b.(Waiter)
	c.checkpoint, _ = b.(Checkpointer)
	c.clock, _ = b.(Clock)
	c.session, _ = b.(SessionBackend)
	c.kindPolicy, _ = b.(KindPolicyBackend)
	c.schedule, _ = b.(ScheduleBackend)
	c.sessWait, _ = b.(SessionWakeWaiter)
	return c
}

// errUnsupported is the cause of a call whose capability the queue's Backend lacks; the
// error names the interface (unsupported).
var errUnsupported = errors.New("work: the backend does not support this call")

// unsupported is the ErrBackend error of a call (Queue.Prune) that needs capability (an
// optional interface of this package, "Pruner") which the backend does not implement.
func unsupported(call, capability string) error {
	return backendErr(fmt.Errorf("%w: %s needs a Backend that implements work.%s", errUnsupported, call, capability))
}
