package events

import (
	"fmt"
	"math"
)

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
	TypeTaskExtended        Type = 10
	TypeTaskReleased        Type = 11
	TypeTaskRetried         Type = 12
	TypeKindPolicySet       Type = 13
	TypeScheduleSet         Type = 14
	TypeScheduleRemoved     Type = 15
	TypeTaskSubmitRejected  Type = 16
)

// Subject says what the events of a type are about: a task or a wake. Event.Subject returns
// the id in the slot the type's Subject names.
type Subject uint8

const (
	SubjectTask Subject = 1
	SubjectWake Subject = 2
	// SubjectSchedule: a session's periodic schedule, named by (session, name). Such events
	// name no task or wake: Event.Subject returns two empty ids, and ScheduleName names it.
	SubjectSchedule Subject = 3
	// SubjectKind: an event about a task kind as a whole (its flow-control policy). It names
	// no task or wake, and no session: Event.Subject returns two empty ids and the header's
	// SessionID is "".
	SubjectKind Subject = 4
)

func (s Subject) String() string {
	switch s {
	case SubjectTask:
		return "task"
	case SubjectWake:
		return "wake"
	case SubjectSchedule:
		return "schedule"
	case SubjectKind:
		return "kind"
	}
	return fmt.Sprintf("subject(%d)", uint8(s))
}

// TypeInfo is one row of the event catalogue.
type TypeInfo struct {
	Type    Type
	Name    string  // the stable snake_case name of tools, JSON output and filters; never changed
	Subject Subject // a task's or a wake's event
	Doc     string  // one line for help texts: what the event records
}

// catalogue is the one table of event types. Known, String, TypeByName, AllTypes and Types
// derive from it, and so do the lists of types that tools print (replay log --help), so a type
// missing here is missing everywhere at once rather than in one list nobody looks at. Adding
// an event starts here: docs/design.md §8 is the checklist of the other places, and says which
// test fails when one is forgotten. Rows are in number order.
var catalogue = [...]TypeInfo{
	{TypeTaskSubmitted, "task_submitted", SubjectTask, "a task was submitted"},
	{TypeTaskClaimed, "task_claimed", SubjectTask, "a worker claimed a task under a lease: a new attempt"},
	{TypeTaskSettled, "task_settled", SubjectTask, "the attempt holding the claim settled the task: succeeded, failed or canceled"},
	{TypeTaskCancelRequested, "task_cancel_requested", SubjectTask, "a cancel was asked for: a pending task is canceled at once, a running one is told"},
	{TypeWakeRecorded, "wake_recorded", SubjectWake, "a wake was recorded: on request, or on the completion of a task"},
	{TypeWakeClaimed, "wake_claimed", SubjectWake, "a consumer claimed a wake under a lease: a new delivery"},
	{TypeWakeAcked, "wake_acked", SubjectWake, "the delivery holding the claim acknowledged the wake"},
	{TypeTaskSettleRejected, "task_settle_rejected", SubjectTask, "audit: a stale settlement was refused; no state changes"},
	{TypeWakeAckRejected, "wake_ack_rejected", SubjectWake, "audit: a stale acknowledgment was refused; no state changes"},
	{TypeTaskExtended, "task_extended", SubjectTask, "the attempt holding the claim extended its lease (a heartbeat)"},
	{TypeTaskReleased, "task_released", SubjectTask, "the attempt holding the claim gave the task back: pending again, or canceled if a cancel was requested"},
	{TypeTaskRetried, "task_retried", SubjectTask, "a failed or canceled task was retried: pending again, its history and attempts kept"},
	{TypeKindPolicySet, "kind_policy_set", SubjectKind, "a kind's flow-control policy was set (pause, max running, rate); a zero policy removes it"},
	{TypeScheduleSet, "schedule_set", SubjectSchedule, "a periodic schedule of the session was set (or replaced): its rule, template and first tick"},
	{TypeScheduleRemoved, "schedule_removed", SubjectSchedule, "a periodic schedule of the session was removed: no more ticks"},
	{TypeTaskSubmitRejected, "task_submit_rejected", SubjectTask, "audit: a submission taken in from the inbox (postgres.SubmitTx) reused a key with another intent; no task, no state changes"},
}

// byNumber is the catalogue indexed by type number; a row with no Name is not a known type.
// Indexing a [256] array by a uint8 needs no bounds check: Known stays one load, as the range
// comparison it replaced was, on the encode and decode paths.
var byNumber = func() (t [256]TypeInfo) {
	for _, row := range catalogue {
		t[row.Type] = row
	}
	return t
}()

// String returns the stable snake_case name of t, or "type(N)" for an unknown type.
func (t Type) String() string {
	if n := byNumber[t].Name; n != "" {
		return n
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Known reports whether t is a type this version of the package can decode.
func (t Type) Known() bool { return byNumber[t].Name != "" }

// Info returns t's row of the catalogue; ok is false for an unknown type.
func (t Type) Info() (info TypeInfo, ok bool) { return byNumber[t], t.Known() }

// subject is the Subject of t's row (0 for an unknown type).
func (t Type) subject() Subject { return byNumber[t].Subject }

// TypeByName returns the type with the stable name s.
func TypeByName(s string) (Type, bool) {
	for _, row := range catalogue {
		if row.Name == s {
			return row.Type, true
		}
	}
	return 0, false
}

// AllTypes lists every known type in number order.
func AllTypes() []Type {
	out := make([]Type, len(catalogue))
	for i, row := range catalogue {
		out[i] = row.Type
	}
	return out
}

// Types returns the catalogue, every known type in number order.
func Types() []TypeInfo { return append([]TypeInfo(nil), catalogue[:]...) }

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
	// TaskID or WakeID of the subject; exactly one is non-empty, except for an event whose
	// catalogue row names SubjectKind, where both are empty.
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

	// Schema version 2 (written only when either is set: a submit with neither keeps
	// encoding version 1, the bytes older builds wrote).
	Priority int64             // claim order among due tasks, higher first: MinPriority..MaxPriority
	Headers  map[string]string // carried with the task (trace context, tenant, ...): see MaxHeaders; nil when none

	// Schema version 3 (written only when Schedule is set): the task is the tick of a
	// periodic schedule of its session, submitted by a claim's decide code. The fold moves
	// the schedule's cursor to Tick and its next tick to ScheduleNext.
	Schedule     string // the schedule's name; "" for a task a caller submitted
	Tick         int64  // the tick this task runs (its RunAt)
	ScheduleNext int64  // the schedule's next tick after Tick; 0: none
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
	Worker         string // who claimed it (schema version 2; "" in version 1): at most MaxWorker bytes
}

// The bounds of TaskSubmitted's priority and headers: the limits the API validates
// (work.TaskRequest), which decoding checks again.
const (
	MinPriority = -1000
	MaxPriority = 1000
	// MaxHeaders is the most headers a task carries; each key is 1..MaxHeaderKey bytes and
	// the keys and values together at most MaxHeaderBytes. Keys and values are any bytes
	// (no UTF-8 rule, as for kinds and keys): the tools escape them when they print them.
	MaxHeaders     = 64
	MaxHeaderKey   = 256
	MaxHeaderBytes = 16 << 10
)

// CheckHeaders says what is wrong with h as a task's headers ("" when nothing): too many
// entries, a key empty or too long, too many bytes. The API and the decoder both ask it.
func CheckHeaders(h map[string]string) string {
	if len(h) > MaxHeaders {
		return fmt.Sprintf("%d entries is more than %d", len(h), MaxHeaders)
	}
	total := 0
	for k, v := range h {
		if len(k) == 0 || len(k) > MaxHeaderKey {
			return fmt.Sprintf("a key of %d bytes is not 1..%d bytes", len(k), MaxHeaderKey)
		}
		total += len(k) + len(v)
	}
	if total > MaxHeaderBytes {
		return fmt.Sprintf("%d bytes of keys and values is more than %d", total, MaxHeaderBytes)
	}
	return ""
}

// MaxWorker is the longest worker identity of a claim event, in bytes: the limit the API
// enforces (work.WithWorker).
const MaxWorker = 256

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
	Worker         string // who claimed it (schema version 2; "" in version 1): at most MaxWorker bytes
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

// TaskSubmitRejected is an audit event: a submission committed in the application's
// transaction (postgres.SubmitTx) was taken in by the queue, and its idempotency key already
// named a task of the session with another intent. No task is made and no state changes; the
// event records who asked, the key, the first differing field (as ErrIdempotencyConflict names
// it), the task the key names (TaskID, its subject) and the rejected request's kind.
type TaskSubmitRejected struct {
	Header
	TaskID         string // the existing task the key names
	IdempotencyKey string
	Field          string // the first field of the intent that differs: kind, run_at, wake, input, ...
	Kind           string // the rejected request's kind
}

// WakeAckRejected is the audit twin of TaskSettleRejected for AckWake.
type WakeAckRejected struct {
	Header
	WakeID  string
	Attempt uint32
	Reason  RejectReason
}

// TaskExtended records a heartbeat of the delivery that holds the claim: the lease of attempt
// Attempt now expires at LeaseExpiresAt (earlier or later than before). The token is not
// written again: the claim's TaskClaimed event has it.
type TaskExtended struct {
	Header
	TaskID         string
	Attempt        uint32
	LeaseExpiresAt int64
}

// TaskReleased records the delivery that holds the claim giving the task back: the task is
// pending again at RunAt with no claim and its attempts unchanged; if a cancel was requested,
// the fold settles it as canceled at the event's time instead (as a cancel of pending work).
type TaskReleased struct {
	Header
	TaskID  string
	Attempt uint32
	RunAt   int64  // when the task is eligible again: the request's RunAt, or the release time
	Reason  string // the worker's reason, "" for none (at most MaxReleaseReason bytes)
}

// TaskRetried records an operator's retry of a failed or canceled task (Session.Retry): the
// task is pending again at RunAt, its outcome, finish time, cancel request and completion wake
// cleared, its id, request and attempts kept. Attempts is the task's attempts at the retry,
// which the fold checks and keeps as the task's AttemptsAtRetry: the next claim is attempt
// Attempts+1, so attempt numbers never repeat in the log.
type TaskRetried struct {
	Header
	TaskID   string
	Attempts uint32
	RunAt    int64 // when the task is eligible again: never before the retry
}

// ScheduleSet records a periodic schedule of the session (Session.SetSchedule), replacing
// one of the same name. The decide code computed From and Next: ticks are the times the rule
// names strictly after From (the set's time, or the replaced schedule's last submitted tick
// when that is later, so no tick runs twice), and Next is the first of them (0: none).
type ScheduleSet struct {
	Header
	Name     string
	Cron     string // 5-field cron or "@every <duration>"
	TimeZone string // IANA name; "" is UTC
	Catchup  uint8  // 0 latest, 1 all
	// The template of each tick's task.
	Kind             string
	Input            []byte
	Priority         int64
	Headers          map[string]string
	WakeOnCompletion bool
	From             int64
	Next             int64
}

// ScheduleRemoved records the removal of a session's schedule: no more ticks. Tasks of
// ticks already submitted stay.
type ScheduleRemoved struct {
	Header
	Name string
}

// MaxScheduleName is the longest schedule name, in bytes.
const MaxScheduleName = 256

// ScheduleName returns the schedule an event is about ("" when none): the subject of a
// schedule event, or the schedule whose tick a TaskSubmitted is.
func ScheduleName(e Event) string {
	switch e := e.(type) {
	case *ScheduleSet:
		return e.Name
	case *ScheduleRemoved:
		return e.Name
	case *TaskSubmitted:
		return e.Schedule
	}
	return ""
}

// KindPolicySet records a kind's whole flow-control policy (work.KindPolicy), replacing the
// one before; a zero policy removes it. It belongs to no session (SessionID is "") and names
// no task or wake. The fold starts the kind's token bucket full (Burst tokens) at the event's
// time when Rate > 0.
type KindPolicySet struct {
	Header
	Kind       string
	Paused     bool
	MaxRunning int64   // > 0: at most this many tasks of the kind under unexpired leases; 0: no limit
	Rate       float64 // > 0: claims per second, finite; 0: no limit
	Burst      int64   // >= 1 when Rate > 0; 0 otherwise
	// Schema version 2 (written only when either is set: a policy without them is version 1's
	// bytes; and, omitted from JSON when zero, rendered as before).
	FairSessions         bool  `json:",omitempty"` // claims of the kind take from its sessions in turn
	MaxRunningPerSession int64 `json:",omitempty"` // > 0: at most this many tasks of the kind per session under unexpired leases; 0: no limit
}

// Zero reports whether e removes the kind's policy: nothing paused, no limit.
func (e *KindPolicySet) Zero() bool {
	return !e.Paused && e.MaxRunning == 0 && e.Rate == 0 && e.Burst == 0 && !e.FairSessions && e.MaxRunningPerSession == 0
}

// CheckKindPolicySession says what is wrong with a policy's per-session fields ("" when
// nothing) and which field, as CheckKindPolicy does for the others.
func CheckKindPolicySession(maxRunningPerSession int64) (field, msg string) {
	if maxRunningPerSession < 0 {
		return "max_running_per_session", fmt.Sprintf("%d is negative", maxRunningPerSession)
	}
	return "", ""
}

// CheckKindPolicy says what is wrong with a policy's fields ("" when nothing) and which field:
// the API and the decoder both ask it.
func CheckKindPolicy(kind string, maxRunning int64, rate float64, burst int64) (field, msg string) {
	switch {
	case kind == "":
		return "kind", "must not be empty"
	case maxRunning < 0:
		return "max_running", fmt.Sprintf("%d is negative", maxRunning)
	case math.IsNaN(rate) || math.IsInf(rate, 0):
		return "rate", fmt.Sprintf("%v is not a finite number", rate)
	case rate < 0:
		return "rate", fmt.Sprintf("%v is negative", rate)
	case burst < 0:
		return "burst", fmt.Sprintf("%d is negative", burst)
	case rate > 0 && burst < 1:
		return "burst", fmt.Sprintf("%d is less than 1 with a rate", burst)
	case rate == 0 && burst != 0:
		return "burst", "must be 0 without a rate"
	}
	return "", ""
}

// MaxReleaseReason is the longest TaskReleased.Reason, in bytes (64 KiB): the limit the API
// checks before a release is appended, which Decode checks again.
const MaxReleaseReason = 64 << 10

func (e *TaskSubmitted) Type() Type       { return TypeTaskSubmitted }
func (e *TaskClaimed) Type() Type         { return TypeTaskClaimed }
func (e *TaskSettled) Type() Type         { return TypeTaskSettled }
func (e *TaskCancelRequested) Type() Type { return TypeTaskCancelRequested }
func (e *WakeRecorded) Type() Type        { return TypeWakeRecorded }
func (e *WakeClaimed) Type() Type         { return TypeWakeClaimed }
func (e *WakeAcked) Type() Type           { return TypeWakeAcked }
func (e *TaskSettleRejected) Type() Type  { return TypeTaskSettleRejected }
func (e *WakeAckRejected) Type() Type     { return TypeWakeAckRejected }
func (e *TaskExtended) Type() Type        { return TypeTaskExtended }
func (e *TaskReleased) Type() Type        { return TypeTaskReleased }
func (e *TaskRetried) Type() Type         { return TypeTaskRetried }
func (e *ScheduleSet) Type() Type         { return TypeScheduleSet }
func (e *ScheduleRemoved) Type() Type     { return TypeScheduleRemoved }
func (e *TaskSubmitRejected) Type() Type  { return TypeTaskSubmitRejected }
func (e *KindPolicySet) Type() Type       { return TypeKindPolicySet }

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
func (e *TaskExtended) Subject() (string, string)        { return e.TaskID, "" }
func (e *TaskReleased) Subject() (string, string)        { return e.TaskID, "" }
func (e *TaskRetried) Subject() (string, string)         { return e.TaskID, "" }
func (e *ScheduleSet) Subject() (string, string)         { return "", "" }
func (e *ScheduleRemoved) Subject() (string, string)     { return "", "" }
func (e *TaskSubmitRejected) Subject() (string, string)  { return e.TaskID, "" }
func (e *KindPolicySet) Subject() (string, string)       { return "", "" }

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
