package events

import "fmt"

// Type identifies an event type on the wire.
//
// These constants are part of the wire format and must never be changed or reused: a retired
// type keeps its number (as `_`) forever.
type Type uint8

const (
	_                       Type = 0 // reserved: a zero byte is never a valid event type
	TypeTaskSubmitted       Type = 1
	TypeTaskClaimed         Type = 2
	TypeTaskSettled         Type = 3
	TypeTaskCancelRequested Type = 4
	TypeWakeRecorded        Type = 5
	TypeWakeClaimed         Type = 6
	TypeWakeAcked           Type = 7
	TypeTaskSettleRejected  Type = 8
	TypeWakeAckRejected     Type = 9
)

// typeNames are the stable names used by tools and JSON output.
var typeNames = [...]string{
	TypeTaskSubmitted:       "task_submitted",
	TypeTaskClaimed:         "task_claimed",
	TypeTaskSettled:         "task_settled",
	TypeTaskCancelRequested: "task_cancel_requested",
	TypeWakeRecorded:        "wake_recorded",
	TypeWakeClaimed:         "wake_claimed",
	TypeWakeAcked:           "wake_acked",
	TypeTaskSettleRejected:  "task_settle_rejected",
	TypeWakeAckRejected:     "wake_ack_rejected",
}

// String returns the stable snake_case name of t, or "type(N)" for an unknown type.
func (t Type) String() string {
	if int(t) < len(typeNames) && typeNames[t] != "" {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Known reports whether t is a type this version of the package can decode.
func (t Type) Known() bool { return t >= TypeTaskSubmitted && t <= TypeWakeAckRejected }

// TypeByName returns the type with the stable name s.
func TypeByName(s string) (Type, bool) {
	for i, n := range typeNames {
		if n != "" && n == s {
			return Type(i), true
		}
	}
	return 0, false
}

// AllTypes lists every known type in number order.
func AllTypes() []Type {
	out := make([]Type, 0, len(typeNames))
	for i, n := range typeNames {
		if n != "" {
			out = append(out, Type(i))
		}
	}
	return out
}

// Header is carried by every event.
type Header struct {
	Seq       uint64 // global sequence number, 1-based, gap-free, assigned at append
	SessionID string // the session that owns the task or wake
	At        int64  // the caller's time of the command, Unix nanoseconds
}

// Event is one transition. The concrete types are the pointer types of this package.
type Event interface {
	Type() Type
	Head() *Header
	// TaskID or WakeID of the subject; exactly one is non-empty.
	Subject() (taskID, wakeID string)
}

// TaskState mirrors work.TaskState on the wire. The numbers are part of the wire format.
type TaskState uint8

const (
	StatePending   TaskState = 0
	StateRunning   TaskState = 1
	StateSucceeded TaskState = 2
	StateFailed    TaskState = 3
	StateCanceled  TaskState = 4
)

var stateNames = [...]string{"pending", "running", "succeeded", "failed", "canceled"}

func (s TaskState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Terminal reports whether s is succeeded, failed or canceled.
func (s TaskState) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCanceled
}

// Outcome is a task's terminal result.
type Outcome struct {
	State   TaskState // StateSucceeded, StateFailed or StateCanceled
	Summary string    // success only; "" means none
	Output  []byte    // success only; JSON
	Error   string    // failure only
}

// WakeReason tells why a wake was recorded. The numbers are part of the wire format.
type WakeReason uint8

const (
	WakeRequested    WakeReason = 0 // a direct wake asked for by the application
	WakeTaskFinished WakeReason = 1 // a completion wake of a task with WakeOnCompletion
)

func (r WakeReason) String() string {
	switch r {
	case WakeRequested:
		return "requested"
	case WakeTaskFinished:
		return "task_finished"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// RejectReason tells why a settlement or acknowledgment was refused. Wire numbers.
type RejectReason uint8

const (
	// RejectSuperseded: the presented attempt is older than the current claim, or the task or
	// wake was claimed again since.
	RejectSuperseded RejectReason = 0
	// RejectTokenMismatch: the attempt matches but the lease token does not (forged or mixed up).
	RejectTokenMismatch RejectReason = 1
	// RejectNotClaimed: the subject is not held by any claim (already settled, acknowledged,
	// canceled while pending, or never claimed).
	RejectNotClaimed RejectReason = 2
)

func (r RejectReason) String() string {
	switch r {
	case RejectSuperseded:
		return "superseded"
	case RejectTokenMismatch:
		return "token_mismatch"
	case RejectNotClaimed:
		return "not_claimed"
	}
	return fmt.Sprintf("reject(%d)", uint8(r))
}

// TaskSubmitted records a new task. Its RunAt is kept apart from ScheduledAt because the
// idempotency comparison tells an explicit schedule from an immediate one.
type TaskSubmitted struct {
	Header
	TaskID           string
	Kind             string
	Input            []byte // JSON as given
	HasRunAt         bool   // the request named a time (seed: WorkSchedule::At)
	RunAt            int64  // meaningful when HasRunAt
	IdempotencyKey   string // "" means none
	WakeOnCompletion bool
}

// ScheduledAt is when the task first becomes eligible: RunAt, or the submit time.
func (e *TaskSubmitted) ScheduledAt() int64 {
	if e.HasRunAt {
		return e.RunAt
	}
	return e.At
}

// TaskClaimed records a delivery: the task is running under a new lease.
type TaskClaimed struct {
	Header
	TaskID         string
	Attempt        uint32 // one-based; equals the task's attempts after the claim
	LeaseToken     string
	LeaseExpiresAt int64
}

// TaskSettled records a worker's terminal outcome for the delivery it owned.
type TaskSettled struct {
	Header
	TaskID     string
	Attempt    uint32
	LeaseToken string
	Outcome    Outcome
}

// TaskCancelRequested records a cancel request on a non-terminal task. The fold applies the
// rule: a pending task becomes canceled at once; a running one only records the request.
type TaskCancelRequested struct {
	Header
	TaskID string
}

// WakeRecorded records a new wake: a direct one (Reason WakeRequested, with Payload and an
// optional key) or a completion wake (WakeTaskFinished, with TaskID and Outcome).
type WakeRecorded struct {
	Header
	WakeID         string
	Reason         WakeReason
	Payload        []byte // WakeRequested: JSON as given
	IdempotencyKey string // WakeRequested: "" means none
	TaskID         string // WakeTaskFinished
	Outcome        Outcome
}

// WakeClaimed records a wake delivery under a new lease.
type WakeClaimed struct {
	Header
	WakeID         string
	Attempt        uint32
	LeaseToken     string
	LeaseExpiresAt int64
}

// WakeAcked records the acknowledgment of the delivery that owned the wake.
type WakeAcked struct {
	Header
	WakeID     string
	Attempt    uint32
	LeaseToken string
}

// TaskSettleRejected is an audit event: a Finish was refused as stale. It changes no state
// except the task's count of recorded rejections (which bounds them, see the design).
// The presented token is never stored.
type TaskSettleRejected struct {
	Header
	TaskID  string
	Attempt uint32 // the attempt the stale delivery presented
	Reason  RejectReason
}

// WakeAckRejected is the audit twin of TaskSettleRejected for AckWake.
type WakeAckRejected struct {
	Header
	WakeID  string
	Attempt uint32
	Reason  RejectReason
}

func (e *TaskSubmitted) Type() Type       { return TypeTaskSubmitted }
func (e *TaskClaimed) Type() Type         { return TypeTaskClaimed }
func (e *TaskSettled) Type() Type         { return TypeTaskSettled }
func (e *TaskCancelRequested) Type() Type { return TypeTaskCancelRequested }
func (e *WakeRecorded) Type() Type        { return TypeWakeRecorded }
func (e *WakeClaimed) Type() Type         { return TypeWakeClaimed }
func (e *WakeAcked) Type() Type           { return TypeWakeAcked }
func (e *TaskSettleRejected) Type() Type  { return TypeTaskSettleRejected }
func (e *WakeAckRejected) Type() Type     { return TypeWakeAckRejected }

func (h *Header) Head() *Header { return h }

func (e *TaskSubmitted) Subject() (string, string)       { return e.TaskID, "" }
func (e *TaskClaimed) Subject() (string, string)         { return e.TaskID, "" }
func (e *TaskSettled) Subject() (string, string)         { return e.TaskID, "" }
func (e *TaskCancelRequested) Subject() (string, string) { return e.TaskID, "" }
func (e *WakeRecorded) Subject() (string, string)        { return "", e.WakeID }
func (e *WakeClaimed) Subject() (string, string)         { return "", e.WakeID }
func (e *WakeAcked) Subject() (string, string)           { return "", e.WakeID }
func (e *TaskSettleRejected) Subject() (string, string)  { return e.TaskID, "" }
func (e *WakeAckRejected) Subject() (string, string)     { return "", e.WakeID }

// LeaseToken returns the token an event carries, or "".
func LeaseToken(e Event) string {
	switch e := e.(type) {
	case *TaskClaimed:
		return e.LeaseToken
	case *TaskSettled:
		return e.LeaseToken
	case *WakeClaimed:
		return e.LeaseToken
	case *WakeAcked:
		return e.LeaseToken
	}
	return ""
}
