package work

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// TaskRequest asks for session-owned work.
//
// The queue stores its own copy of Input. The Task that the call returns may share Input's
// bytes when they are large (pebblelog.BlobMin, 256 KiB, on a durable queue: one copy fewer
// of a large value): keep them unchanged while you use that Task. The same holds for a
// WakeRequest's Payload and an Outcome's Output.
type TaskRequest struct {
	Kind  string          // routing name; must not be blank
	Input json.RawMessage // any JSON value, stored unchanged; nil means JSON null
	RunAt time.Time       // zero: immediate (seed Immediate); else no earlier than RunAt (seed At)
	// IdempotencyKey makes a retried submit return the task the key already names in this
	// session instead of a new one. "" means none; all-whitespace is invalid.
	//
	// The key stands for an intent: Kind, Input (compared as a JSON value), RunAt (as an
	// instant; zero and non-zero differ), Wake and Priority. A resubmit equal in all of them
	// returns the existing task, in whatever state it is now (Headers are not part of the
	// intent: a resubmit with other headers returns the existing task, headers unchanged);
	// one that differs in any is ErrIdempotencyConflict, whose Error.Field names the first
	// differing field in the order "kind", "run_at", "wake", "priority", "input", and
	// Error.ID the existing task. The trap: a producer that
	// computes RunAt = now + 5s and resubmits after a crash asks for another instant, a
	// conflict on run_at; compute RunAt once and keep it with the key, or keep RunAt out of
	// the intent by submitting immediately.
	//
	// A key is free again once its task was pruned (Options.Retention, Queue.Prune): from
	// then on it names nothing and a submit makes a new task.
	IdempotencyKey string
	Wake           WakePolicy
	// Priority orders the claims among due tasks: every claim method takes a higher
	// Priority first, then the earlier ScheduledAt, then submission order. Default 0; it must
	// be in -1000..1000 (else ErrInvalidRequest naming "priority"). A task scheduled later is
	// never claimed before it is due, whatever its priority; a running task whose lease
	// expired is claimed again in the same order, under its own priority.
	Priority int
	// Headers are carried with the task unchanged (W3C traceparent/tracestate, a tenant, a
	// request id): stored in its task_submitted event, returned in Task.Headers, shown by
	// replay. At most 64 entries, each key 1..256 bytes, keys and values together at most
	// 16 KiB, else ErrInvalidRequest naming "headers". Keys and values may be any bytes (no
	// UTF-8 rule, as for Kind). Not part of the idempotency intent. The map is copied.
	Headers map[string]string
}

// WakePolicy says whether a task that reaches a terminal state wakes its session.
type WakePolicy int

const (
	// WakeNever records no wake; the application reads the task when it wants.
	WakeNever WakePolicy = iota
	// WakeOnCompletion records exactly one leased wake when the task first becomes terminal,
	// however it ended (success, failure, cancellation of pending or running work).
	WakeOnCompletion
)

// TaskState is a task's lifecycle state.
type TaskState int

const (
	TaskPending   TaskState = iota // stored, not held by a claim
	TaskRunning                    // claimed; its lease may still expire and be redelivered
	TaskSucceeded                  // finished successfully
	TaskFailed                     // finished with an application error
	TaskCanceled                   // canceled while pending, or stopped cooperatively by its worker
)

// Terminal reports whether no further deliveries of the task can be claimed.
func (s TaskState) Terminal() bool {
	return s == TaskSucceeded || s == TaskFailed || s == TaskCanceled
}

// String returns "pending", "running", "succeeded", "failed" or "canceled".
func (s TaskState) String() string {
	switch s {
	case TaskPending:
		return "pending"
	case TaskRunning:
		return "running"
	case TaskSucceeded:
		return "succeeded"
	case TaskFailed:
		return "failed"
	case TaskCanceled:
		return "canceled"
	}
	return fmt.Sprintf("TaskState(%d)", int(s))
}

// Outcome is the terminal result a worker reports. Build one with Success,
// SuccessWithSummary, Failure or Cancellation.
type Outcome struct {
	State   TaskState       // TaskSucceeded, TaskFailed or TaskCanceled
	Summary string          // optional human summary of a success; "" means none
	Output  json.RawMessage // output of a success; nil means JSON null
	Error   string          // message of a failure
}

// Success is a successful outcome with JSON output.
func Success(output json.RawMessage) Outcome { return Outcome{State: TaskSucceeded, Output: output} }

// SuccessWithSummary is a successful outcome with a human summary and JSON output.
func SuccessWithSummary(summary string, output json.RawMessage) Outcome {
	return Outcome{State: TaskSucceeded, Summary: summary, Output: output}
}

// Failure is a failed outcome with a stable, application-defined message.
func Failure(message string) Outcome { return Outcome{State: TaskFailed, Error: message} }

// Cancellation is the outcome of a worker that observed a cancel request and stopped safely.
func Cancellation() Outcome { return Outcome{State: TaskCanceled} }

// Task is a snapshot of a background task owned by one session.
type Task struct {
	ID, SessionID, Kind string
	Input               json.RawMessage
	State               TaskState
	CancelRequestedAt   time.Time // zero: never requested
	IdempotencyKey      string
	ScheduledAt         time.Time
	CreatedAt           time.Time
	Attempts            uint32            // claims so far, redeliveries included
	FinishedAt          time.Time         // zero: not terminal
	Outcome             *Outcome          // nil until terminal
	Priority            int               // the request's Priority
	Headers             map[string]string // the request's Headers (a copy); nil when none
}

// TaskDelivery is a leased, at-least-once delivery of a task to a worker. Its lease token
// fences settlement to this attempt; fmt never prints it.
type TaskDelivery struct {
	Task           Task
	Attempt        uint32    // one-based
	LeaseExpiresAt time.Time // after this, an unfinished delivery may be claimed again
	Worker         string    // who claimed it, as its claim event records (WithWorker)
	leaseToken     string
}

// LeaseToken returns the opaque token that fences settlement to this delivery attempt.
func (d TaskDelivery) LeaseToken() string { return d.leaseToken }

// WakeRequest asks to wake a session now.
type WakeRequest struct {
	Payload        json.RawMessage // any JSON value; nil means JSON null
	IdempotencyKey string          // "" means none; all-whitespace is invalid
}

// WakeKind tells why a wake exists.
type WakeKind int

const (
	WakeRequested    WakeKind = iota // the application asked for it (Session.Wake)
	WakeTaskFinished                 // a task with WakeOnCompletion reached a terminal state
)

func (k WakeKind) String() string {
	switch k {
	case WakeRequested:
		return "requested"
	case WakeTaskFinished:
		return "task_finished"
	}
	return fmt.Sprintf("WakeKind(%d)", int(k))
}

// WakeReason is why a session should wake, with the data to act on it.
type WakeReason struct {
	Kind    WakeKind
	Payload json.RawMessage // WakeRequested
	TaskID  string          // WakeTaskFinished
	State   TaskState       // WakeTaskFinished
	Outcome *Outcome        // WakeTaskFinished
}

// Wake is a snapshot of a wake owned by one session.
type Wake struct {
	ID, SessionID  string
	Reason         WakeReason
	CreatedAt      time.Time
	IdempotencyKey string // direct wakes only
}

// WakeDelivery is a leased, at-least-once delivery of a wake; fmt never prints its token.
type WakeDelivery struct {
	Wake           Wake
	Attempt        uint32
	LeaseExpiresAt time.Time
	Worker         string // who claimed it, as its claim event records (WithWorker)
	leaseToken     string
}

// LeaseToken returns the opaque token that fences acknowledgment to this delivery attempt.
func (d WakeDelivery) LeaseToken() string { return d.leaseToken }

// The redacted views are what fmt prints for deliveries: same fields, token replaced.
type redactedTaskDelivery struct {
	Task           Task
	Attempt        uint32
	LeaseExpiresAt time.Time
	Worker         string
	LeaseToken     string
}

type redactedWakeDelivery struct {
	Wake           Wake
	Attempt        uint32
	LeaseExpiresAt time.Time
	Worker         string
	LeaseToken     string
}

const redacted = "[redacted]"

// Format prints the delivery with its lease token redacted, for every verb.
func (d TaskDelivery) Format(f fmt.State, verb rune) {
	v := redactedTaskDelivery{d.Task, d.Attempt, d.LeaseExpiresAt, d.Worker, redacted}
	fmt.Fprintf(f, fmt.FormatString(f, verb), v)
}

// Format prints the delivery with its lease token redacted, for every verb.
func (d WakeDelivery) Format(f fmt.State, verb rune) {
	v := redactedWakeDelivery{d.Wake, d.Attempt, d.LeaseExpiresAt, d.Worker, redacted}
	fmt.Fprintf(f, fmt.FormatString(f, verb), v)
}

// PendingTask builds the snapshot of a newly accepted task (seed: Task::pending), for custom
// backends. It does not validate r.
func PendingTask(id, sessionID string, r TaskRequest, createdAt time.Time) Task {
	scheduled := createdAt
	if !r.RunAt.IsZero() {
		scheduled = r.RunAt
	}
	return Task{
		ID: id, SessionID: sessionID, Kind: r.Kind, Input: ownJSON(r.Input),
		State: TaskPending, IdempotencyKey: r.IdempotencyKey,
		ScheduledAt: scheduled, CreatedAt: createdAt,
	}
}

// NewTaskDelivery builds a delivery after a backend has claimed t (seed:
// TaskDelivery::from_claim). Tokens must be unique per attempt and unguessable.
func NewTaskDelivery(t Task, attempt uint32, leaseExpiresAt time.Time, leaseToken string) TaskDelivery {
	return TaskDelivery{Task: t, Attempt: attempt, LeaseExpiresAt: leaseExpiresAt, leaseToken: leaseToken}
}

// RequestedWake builds the snapshot of a direct wake (seed: SessionWake::requested).
func RequestedWake(id, sessionID string, r WakeRequest, createdAt time.Time) Wake {
	return Wake{
		ID: id, SessionID: sessionID,
		Reason:    WakeReason{Kind: WakeRequested, Payload: ownJSON(r.Payload)},
		CreatedAt: createdAt, IdempotencyKey: r.IdempotencyKey,
	}
}

// TaskFinishedWake builds the completion wake of a terminal task (seed:
// SessionWake::task_finished). It returns false when t has no outcome, is not terminal, or
// its outcome's state differs from its state.
func TaskFinishedWake(id string, t Task, createdAt time.Time) (Wake, bool) {
	if t.Outcome == nil || !t.State.Terminal() || t.Outcome.State != t.State {
		return Wake{}, false
	}
	o := *t.Outcome
	if o.Output != nil {
		o.Output = bytes.Clone(o.Output)
	}
	return Wake{
		ID: id, SessionID: t.SessionID,
		Reason:    WakeReason{Kind: WakeTaskFinished, TaskID: t.ID, State: t.State, Outcome: &o},
		CreatedAt: createdAt,
	}, true
}

// NewWakeDelivery builds a delivery after a backend has claimed w (seed:
// WakeDelivery::from_claim).
func NewWakeDelivery(w Wake, attempt uint32, leaseExpiresAt time.Time, leaseToken string) WakeDelivery {
	return WakeDelivery{Wake: w, Attempt: attempt, LeaseExpiresAt: leaseExpiresAt, leaseToken: leaseToken}
}

// jsonOrNull is b, or JSON null for nil. The null is a new slice each time: no caller may
// change a value another one holds.
func jsonOrNull(b json.RawMessage) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return b
}

// ownJSON is jsonOrNull(b) as a copy the caller can no longer change. Stored values must not
// alias caller buffers: the in-memory engine keeps events and records as they are, and a
// caller that reuses its buffer after a call would otherwise rewrite stored state.
func ownJSON(b json.RawMessage) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return bytes.Clone(b)
}
