package work

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	engineapi "github.com/worklog/worklog/internal/engine"

	"github.com/worklog/worklog/events"
)

// Queue is the entry point for session work and wakes (seed: WorkQueue). It validates every
// request, then hands it to its Backend. A Queue is safe for concurrent use.
type Queue struct {
	b        Backend
	caps     backendCaps // b's optional interfaces, resolved once (New)
	maxValue int
	clock    func() time.Time // the queue's clock (now); never nil
	closed   atomic.Bool
	onClose  func() error
	// stopPruner stops background pruning (Options.Retention: prune.go); nil when off.
	stopPruner func()
	// stopInbox stops the ingest loop of an engine with an inbox (inbox.go); nil otherwise.
	stopInbox func()
	// stopInspect stops the inspection endpoint (Options.NoInspect); nil when none.
	stopInspect func() error
}

// NewInMemory returns an offline queue whose state lives in this process (seed:
// WorkQueue::in_memory). It is event-sourced like the durable store, with the same decide and
// fold code, and keeps every event until the queue is dropped.
func NewInMemory() *Queue {
	return newEngineQueue(newMemEngine(), engineapi.Config{})
}

// New returns a queue over a custom backend (seed: WorkQueue::with_backend). Queue still
// validates requests before calling it. The queue gets every optional capability b
// implements (see Backend: RunningBackend, LogReader, Verifier, Pruner, Waiter, ...); a
// method whose capability b lacks returns an ErrBackend error naming the interface. The
// queue's clock is b's when b is a Clock, else the host's wall clock.
func New(b Backend) *Queue {
	q := &Queue{b: b, caps: resolveBackendCaps(b), maxValue: DefaultMaxValueBytes, clock: wallClock}
	if lb, ok := b.(*logBackend); ok {
		q.maxValue = lb.maxValue
	}
	if q.caps.clock != nil {
		q.clock = q.caps.clock.Now
	}
	return q
}

// Close releases the backend. Calls after Close return an ErrBackend error wrapping
// ErrClosed. Closing twice is fine.
func (q *Queue) Close() error {
	if q.closed.Swap(true) {
		return nil
	}
	if q.stopInspect != nil {
		_ = q.stopInspect() // first: no inspector reads a store that is closing (what it fails to remove, the next Open does)
	}
	if q.stopPruner != nil {
		q.stopPruner() // before the backend closes under it
	}
	if q.stopInbox != nil {
		q.stopInbox()
	}
	err := q.b.Close()
	if q.onClose != nil {
		err = errors.Join(err, q.onClose())
	}
	return backendErr(err)
}

// begin rejects calls on a closed queue or with a done context.
func (q *Queue) begin(ctx context.Context) error {
	if q.closed.Load() {
		return backendErr(ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return backendErr(err)
	}
	return nil
}

// wrap makes sure a custom backend's error still matches exactly one kind.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	var we *Error
	if errors.As(err, &we) {
		return err
	}
	return backendErr(err)
}

// Session scopes requests and reads to one session (seed: for_session). The id is checked
// on each call, not here.
func (q *Queue) Session(id string) *Session { return &Session{q: q, id: id} }

// ClaimDue claims due work at the queue's clock's time.
func (q *Queue) ClaimDue(ctx context.Context, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	return q.ClaimDueAt(ctx, q.now(), leaseFor, limit)
}

// ClaimDueAt atomically claims up to limit tasks that are due at now: pending tasks with
// ScheduledAt <= now and running tasks whose lease expired (LeaseExpiresAt <= now), in the
// order they became eligible, ties by submission order. Each claim makes the task running,
// adds one attempt and leases it with a fresh token until now+leaseFor. A cancel request does
// not stop redelivery: the worker sees CancelRequestedAt and should settle with
// Cancellation. If now+leaseFor overflows the time range nothing is claimed.
func (q *Queue) ClaimDueAt(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	if err := q.begin(ctx); err != nil {
		return nil, err
	}
	if err := validateClaim(leaseFor, limit); err != nil {
		return nil, err
	}
	if err := validateWorker(ctx); err != nil {
		return nil, err
	}
	d, err := q.b.ClaimDue(ctx, now, leaseFor, limit)
	return d, wrap(err)
}

// Finish settles a claimed task at the queue's clock's time.
func (q *Queue) Finish(ctx context.Context, d TaskDelivery, o Outcome) (Task, error) {
	return q.FinishAt(ctx, d, o, q.now())
}

// FinishAt settles the task of delivery d with outcome o. The delivery must still own the
// claim (same attempt and token) or the result is ErrStaleDelivery; lease expiry alone does
// not fence a late worker, only a new claim does. Repeating the same delivery with an equal
// outcome returns the task and changes nothing; with another outcome it is
// ErrInvalidTransition. With WakeOnCompletion, settling records one completion wake in the
// same atomic step.
func (q *Queue) FinishAt(ctx context.Context, d TaskDelivery, o Outcome, now time.Time) (Task, error) {
	if err := q.begin(ctx); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("task_id", d.Task.ID); err != nil {
		return Task{}, err
	}
	if err := validateOutcome(&o, q.maxValue); err != nil {
		return Task{}, err
	}
	t, err := q.b.Finish(ctx, d, o, now)
	return t, wrap(err)
}

// ClaimWakes claims wakes at the queue's clock's time.
func (q *Queue) ClaimWakes(ctx context.Context, leaseFor time.Duration, limit int) ([]WakeDelivery, error) {
	return q.ClaimWakesAt(ctx, q.now(), leaseFor, limit)
}

// ClaimWakesAt atomically claims up to limit unacknowledged wakes that are unclaimed or whose
// lease expired at now, in the order they became available (creation time, lease expiry),
// ties by creation order.
func (q *Queue) ClaimWakesAt(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]WakeDelivery, error) {
	if err := q.begin(ctx); err != nil {
		return nil, err
	}
	if err := validateClaim(leaseFor, limit); err != nil {
		return nil, err
	}
	if err := validateWorker(ctx); err != nil {
		return nil, err
	}
	d, err := q.b.ClaimWakes(ctx, now, leaseFor, limit)
	return d, wrap(err)
}

// AckWake acknowledges a wake delivery (seed: acknowledge_wake) at the queue's clock's time. The
// delivery must own the claim (same attempt and token) or the result is ErrStaleDelivery;
// repeating the same acknowledgment is fine. An acknowledged wake is never delivered again.
func (q *Queue) AckWake(ctx context.Context, d WakeDelivery) error {
	return q.AckWakeAt(ctx, d, q.now())
}

// AckWakeAt is AckWake with the caller's time, which the event log records. A custom
// backend without a time argument is called through AckWake. A delivery without a wake id
// (a zero WakeDelivery) is ErrInvalidRequest naming wake_id, as Finish's is task_id.
func (q *Queue) AckWakeAt(ctx context.Context, d WakeDelivery, now time.Time) error {
	if err := q.begin(ctx); err != nil {
		return err
	}
	if err := validateNonBlank("wake_id", d.Wake.ID); err != nil {
		return err
	}
	if q.caps.ackAt != nil {
		return wrap(q.caps.ackAt.AckWakeAt(ctx, d, now))
	}
	return wrap(q.b.AckWake(ctx, d))
}

// ReadLog calls fn for every event with sequence >= from (inclusive; 0 or 1 means the
// start), in order, until fn returns an error, which ReadLog returns. A queue over a custom
// Backend has a log when the backend is a LogReader.
func (q *Queue) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	if err := q.begin(ctx); err != nil {
		return err
	}
	if q.caps.log == nil {
		return unsupported("Queue.ReadLog", "LogReader")
	}
	fnErr, err := callerFn(fn, func(fn func(events.Event) error) error { return q.caps.log.ReadLog(ctx, from, fn) })
	if fnErr != nil {
		return fnErr
	}
	return wrap(err)
}

// callerFn runs read with fn and keeps fn's own error apart from read's: fn's is the
// caller's, returned as it is (ReadLog, Follow), read's the backend's, wrapped.
func callerFn(fn func(events.Event) error, read func(func(events.Event) error) error) (fnErr, err error) {
	err = read(func(ev events.Event) error {
		if err := fn(ev); err != nil {
			fnErr = err
			return err
		}
		return nil
	})
	return fnErr, err
}

// ReadLog is Queue.ReadLog on worklog's backend: the engine's log.
func (b *logBackend) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return backendErr(b.eng.ReadLog(ctx, from, fn))
}

// VerifyError lists every difference Verify found.
type VerifyError struct {
	Problems []string
}

func (e *VerifyError) Error() string {
	const show = 20
	p := e.Problems
	more := ""
	if len(p) > show {
		more = fmt.Sprintf("\n... and %d more", len(p)-show)
		p = p[:show]
	}
	return fmt.Sprintf("verify: %d problem(s):\n%s%s", len(e.Problems), strings.Join(p, "\n"), more)
}

// Verify rebuilds the projection from the event log and compares it with the live one; it
// also checks that the log is gap-free and that every event decodes. It returns nil when all
// holds, or an ErrBackend error wrapping a *VerifyError with every difference. A queue over
// a custom Backend verifies when the backend is a Verifier.
func (q *Queue) Verify(ctx context.Context) error {
	if err := q.begin(ctx); err != nil {
		return err
	}
	if q.caps.verify == nil {
		return unsupported("Queue.Verify", "Verifier")
	}
	return wrap(q.caps.verify.Verify(ctx))
}

// Verify is Queue.Verify on worklog's backend: the engine's Verify.
func (b *logBackend) Verify(ctx context.Context) error {
	problems, err := b.eng.Verify(ctx)
	if err != nil {
		return backendErr(err)
	}
	if len(problems) > 0 {
		return backendErr(&VerifyError{Problems: problems})
	}
	return nil
}

// Session is a Queue scoped to one owning session (seed: SessionWork).
type Session struct {
	q  *Queue
	id string
}

// ID returns the session id every request through this handle carries.
func (s *Session) ID() string { return s.id }

// Submit submits work at the queue's clock's time.
func (s *Session) Submit(ctx context.Context, r TaskRequest) (Task, error) {
	return s.SubmitAt(ctx, r, s.q.now())
}

// SubmitAt stores a new pending task (attempts 0, scheduled at RunAt or now), or, when the
// idempotency key was used before in this session, returns that task's current snapshot if
// the request is equal (kind, input as a JSON value, schedule, key, wake policy) and
// ErrIdempotencyConflict otherwise (naming the first differing field and the existing task:
// see TaskRequest.IdempotencyKey), storing nothing. A key names its task until the task is
// pruned (Options.Retention, Queue.Prune); then it is free for a new one.
func (s *Session) SubmitAt(ctx context.Context, r TaskRequest, now time.Time) (Task, error) {
	if err := s.q.begin(ctx); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return Task{}, err
	}
	if err := validateTaskRequest(&r, s.q.maxValue); err != nil {
		return Task{}, err
	}
	t, err := s.q.b.Submit(ctx, s.id, r, now)
	return t, wrap(err)
}

// Task reads a task of this session; another session's task reads as not found (false,
// no error).
func (s *Session) Task(ctx context.Context, taskID string) (Task, bool, error) {
	if err := s.q.begin(ctx); err != nil {
		return Task{}, false, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return Task{}, false, err
	}
	if err := validateNonBlank("task_id", taskID); err != nil {
		return Task{}, false, err
	}
	t, ok, err := s.q.b.Task(ctx, s.id, taskID)
	return t, ok, wrap(err)
}

// Cancel requests cancellation at the queue's clock's time.
func (s *Session) Cancel(ctx context.Context, taskID string) (Task, error) {
	return s.CancelAt(ctx, taskID, s.q.now())
}

// CancelAt requests cancellation of a task of this session. A pending task (even one
// scheduled in the future) is canceled at once and, with WakeOnCompletion, wakes the session.
// A running task only records the request (its first time is kept); its worker should settle
// with Cancellation. A terminal task is returned unchanged. Unknown or foreign tasks give
// ErrTaskNotFound.
func (s *Session) CancelAt(ctx context.Context, taskID string, now time.Time) (Task, error) {
	if err := s.q.begin(ctx); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("task_id", taskID); err != nil {
		return Task{}, err
	}
	t, err := s.q.b.Cancel(ctx, s.id, taskID, now)
	return t, wrap(err)
}

// Wake records a direct wake at the queue's clock's time.
func (s *Session) Wake(ctx context.Context, r WakeRequest) (Wake, error) {
	return s.WakeAt(ctx, r, s.q.now())
}

// WakeAt records a wake for this session, claimable at once. With an idempotency key used
// before in this session, an equal payload returns the existing wake and a different one is
// ErrIdempotencyConflict. Wake keys and task keys are separate namespaces.
func (s *Session) WakeAt(ctx context.Context, r WakeRequest, now time.Time) (Wake, error) {
	if err := s.q.begin(ctx); err != nil {
		return Wake{}, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return Wake{}, err
	}
	if err := validateWakeRequest(&r, s.q.maxValue); err != nil {
		return Wake{}, err
	}
	w, err := s.q.b.RequestWake(ctx, s.id, r, now)
	return w, wrap(err)
}

// wallClock is the clock of a queue built without one (NewInMemory, Open, New over a backend
// that is no Clock): the host's. A variable only for the crash tests' children, which set it
// before they open their queue (SetClock).
var wallClock = time.Now

// now is the queue's clock: the only clock the package reads, for every method without an At
// twin's time, the background pruner and a waiter's timer. A queue has one, set when it is
// built: the host's wall clock, or its backend's (postgres.Open: the database server's).
func (q *Queue) now() time.Time { return q.clock() }

// Now is the queue's clock on worklog's backend (Clock), so that a queue New builds over it
// keeps it.
func (b *logBackend) Now() time.Time { return b.clock() }
