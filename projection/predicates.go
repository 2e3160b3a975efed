package projection

import "github.com/worklog/worklog/events"

// The predicates below are the rules the fold (Apply) checks and the decide code (package
// work) consults before it appends an event. Each is written here once, so the two cannot
// drift: a delivery that decide lets settle is one the fold accepts, and a rejection decide
// records is one the fold counts.

// OwnedBy reports whether the delivery of attempt with token still owns the task's claim:
// the task is running under that very claim. Only such a delivery may settle it.
func (t *Task) OwnedBy(attempt uint32, token string) bool {
	return t.HeldBy(attempt) && t.LeaseToken == token
}

// HeldBy reports whether attempt holds the task's claim: the task is running and that is its
// latest attempt. It is OwnedBy without the token, for the events of the claim's holder that
// do not repeat it (events.TaskExtended, events.TaskReleased): the decide code appends them
// only after OwnedBy, and the fold accepts them only under HeldBy.
func (t *Task) HeldBy(attempt uint32) bool {
	return t.Claimed() && t.Attempts == attempt
}

// OwnedBy reports whether the delivery of attempt with token still owns the wake's claim:
// unacknowledged and held by that very claim. A wake never claimed has attempt 0 and no
// token, so a delivery presenting exactly those owns nothing.
func (w *Wake) OwnedBy(attempt uint32, token string) bool {
	return w.Held() && w.Attempts == attempt && w.LeaseToken == token
}

// Held reports whether an unacknowledged claim holds the wake (its lease may have expired):
// Wake.Claimed, and not acknowledged.
func (w *Wake) Held() bool { return !w.Acked && w.Claimed() }

// RejectionRecordable reports whether a stale settlement presenting attempt may be recorded
// as an audit event (events.TaskSettleRejected): see rejectionRecordable.
func (t *Task) RejectionRecordable(attempt uint32) bool {
	return rejectionRecordable(attempt, t.Attempts, t.RejectedAttempt)
}

// RejectionRecordable is Task.RejectionRecordable for a stale acknowledgment
// (events.WakeAckRejected).
func (w *Wake) RejectionRecordable(attempt uint32) bool {
	return rejectionRecordable(attempt, w.Attempts, w.RejectedAttempt)
}

// rejectionRecordable bounds the audit of stale settlements and acknowledgments: one record
// per attempt that was really handed out (1..attempts), in increasing attempt order (above
// recorded, the highest attempt recorded so far). So a record carries at most as many
// rejections as claims, and a flood of forged or repeated stale calls writes nothing.
func rejectionRecordable(attempt, attempts, recorded uint32) bool {
	return attempt != 0 && attempt <= attempts && attempt > recorded
}

// ClaimableAt reports whether a claim at now may take the task: it is in the due index
// (EligibleAt) at a time not after now.
func (t *Task) ClaimableAt(now int64) bool {
	at, ok := t.EligibleAt()
	return ok && at <= now
}

// ClaimableAt reports whether a claim at now may take the wake (AvailableAt, not after now).
func (w *Wake) ClaimableAt(now int64) bool {
	at, ok := w.AvailableAt()
	return ok && at <= now
}

// Retryable reports whether an operator may retry the task (events.TaskRetried): it ended
// failed or canceled. A succeeded task is done; a pending or running one has not ended.
func (t *Task) Retryable() bool {
	return t.State == events.StateFailed || t.State == events.StateCanceled
}

// CompletionWakeDue reports whether the task's completion wake is to be recorded now: its
// policy asks for one, it is terminal, and it has none yet. Decide records one exactly then
// (after a settlement, or a cancel of pending work); the fold accepts one only then.
func (t *Task) CompletionWakeDue() bool { return t.completionWakeCheck() == completionWakeOK }

// completionWakeBlock is CompletionWakeDue with the reason a completion wake may not be
// recorded, which the fold's rejection names. A code, not a message: decide asks on every
// settlement, and a formatted message there would cost an allocation each time.
type completionWakeBlock uint8

const (
	completionWakeOK completionWakeBlock = iota
	completionWakeNever
	completionWakeNotTerminal
	completionWakeRecorded
)

func (t *Task) completionWakeCheck() completionWakeBlock {
	switch {
	case !t.WakeOnCompletion:
		return completionWakeNever
	case !t.State.Terminal():
		return completionWakeNotTerminal
	case t.CompletionWakeID != "":
		return completionWakeRecorded
	}
	return completionWakeOK
}
