package projection

import (
	"cmp"

	"github.com/worklog/worklog/events"
)

// Task is the projected state of one task. Its stored form (pebblelog/record_codec.go) is a
// msgpack array of these fields in this order, part of the store format: append fields only,
// and add each to the record codec.
type Task struct {
	ID               string
	SessionID        string
	Kind             string
	Input            []byte
	HasRunAt         bool  // the request named a time; kept for idempotency comparison
	RunAt            int64 // meaningful when HasRunAt
	IdempotencyKey   string
	WakeOnCompletion bool
	CreatedAt        int64
	ScheduledAt      int64
	SubmitSeq        uint64 // sequence of the TaskSubmitted event: submission order

	State             events.TaskState
	CancelRequested   bool
	CancelRequestedAt int64 // first cancel request; meaningful when CancelRequested
	Attempts          uint32
	LeaseToken        string // the current claim's token while running
	LeaseExpiresAt    int64  // the current claim's expiry while running
	FinishedAt        int64  // meaningful when terminal
	Outcome           events.Outcome
	SettledToken      string // token of the delivery that settled it; "" if canceled while pending
	CompletionWakeID  string // the one completion wake, once recorded
	RejectedAttempt   uint32 // highest attempt whose stale settlement was recorded (bounds audit)
	UpdatedSeq        uint64 // sequence of the last event that changed this record

	// Fields appended after format 4 (records only ever gain fields at the end; a record
	// written before them decodes with them zero).
	AttemptsAtRetry uint32            // Attempts when the task was last retried (task_retried); 0 if never
	Priority        int64             // claim order among due tasks: higher first (task_submitted v2)
	Headers         map[string]string // carried with the task (task_submitted v2); nil when none
	// UnackedEarlierWakes counts the completion wakes of earlier runs that a retry detached
	// from the task before they were acknowledged (task_retried) and that are not acknowledged
	// yet (wake_acked counts it down). The task is not prunable while it is above 0 (PruneAt).
	// It changes without moving UpdatedSeq: a detached wake's acknowledgment is the wake's
	// event, and it may be pruned while the task stays.
	UnackedEarlierWakes uint32
}

// Claimed reports whether the task is held by a claim.
func (t *Task) Claimed() bool { return t.State == events.StateRunning }

// EligibleAt is the task's due-index key time, and whether it is in the index at all.
func (t *Task) EligibleAt() (int64, bool) {
	switch t.State {
	case events.StatePending:
		return t.ScheduledAt, true
	case events.StateRunning:
		return t.LeaseExpiresAt, true
	}
	return 0, false
}

// Wake is the projected state of one wake. Its stored form is like Task's.
type Wake struct {
	ID             string
	SessionID      string
	Reason         events.WakeReason
	Payload        []byte
	IdempotencyKey string
	TaskID         string
	Outcome        events.Outcome
	CreatedAt      int64
	RecordSeq      uint64 // sequence of the WakeRecorded event

	Attempts        uint32
	LeaseToken      string // current claim's token; "" when unclaimed
	LeaseExpiresAt  int64
	Acked           bool
	AckedToken      string
	RejectedAttempt uint32
	UpdatedSeq      uint64
	AckedAt         int64 // the acknowledgment's time, when Acked: retention (PruneAt) counts from it
}

// Claimed reports whether the wake is held (or was last held) by an unacknowledged claim.
func (w *Wake) Claimed() bool { return w.LeaseToken != "" }

// AvailableAt is the wake's available-index key time, and whether it is in the index.
func (w *Wake) AvailableAt() (int64, bool) {
	if w.Acked {
		return 0, false
	}
	if w.Claimed() {
		return w.LeaseExpiresAt, true
	}
	return w.CreatedAt, true
}

// IndexEntry is one entry of an eligibility index: ordered by At, then Seq.
type IndexEntry struct {
	Pri int64 // the task's Priority (due indexes); 0 in the wake index
	At  int64
	Seq uint64
	ID  string
}

// Less orders entries by claim order: higher Pri first, then (At, Seq). Wake entries all
// have Pri 0, so theirs is (At, Seq).
func (a IndexEntry) Less(b IndexEntry) bool { return compareEntries(a, b) < 0 }

// compareEntries is Less as a three-way comparison, for slices.SortFunc.
func compareEntries(a, b IndexEntry) int {
	return cmp.Or(cmp.Compare(b.Pri, a.Pri), cmp.Compare(a.At, b.At), cmp.Compare(a.Seq, b.Seq))
}

// DueEntry is t's entry in the due indexes when it is eligible at at.
func (t *Task) DueEntry(at int64) IndexEntry {
	return IndexEntry{Pri: t.Priority, At: at, Seq: t.SubmitSeq, ID: t.ID}
}

// The phases of a pending task, as other queues (River, Sidekiq, asynq) name them. They are
// derived from the record and a time, never stored: PendingPhase.
const (
	PhaseAvailable = "available" // due: a claim at that time may take it
	PhaseScheduled = "scheduled" // its run time is later (submitted with a run time, or retried by its session for later)
	PhaseRetrying  = "retrying"  // released by a worker after an attempt, to run again later
)

// PendingPhase is the phase of a pending task at now (Unix nanoseconds), "" for a task that
// is not pending. A task released for a retry whose run time has come is available again.
func (t *Task) PendingPhase(now int64) string {
	switch {
	case t.State != events.StatePending:
		return ""
	case t.ScheduledAt <= now:
		return PhaseAvailable
	case t.Attempts > t.AttemptsAtRetry:
		return PhaseRetrying
	}
	return PhaseScheduled
}
