package projection

import (
	"errors"
	"fmt"
	"math"

	"github.com/worklog/worklog/events"
)

// ErrInconsistent marks an event that does not follow from the state it is applied to: a gap
// in the sequence, a claim of a task that is not eligible, a settlement by a delivery that does
// not own the claim. The live stores never append such an event; Verify and replay report it.
var ErrInconsistent = errors.New("projection: event inconsistent with state")

// ErrUnknownEvent marks an event of a type the fold has no rule for. It is wrapped, beside
// ErrInconsistent, in the *ApplyError of such an event, so that a test can tell an event
// type nobody wrote a rule for from an event its rule refused.
var ErrUnknownEvent = errors.New("projection: no rule for this event type")

// ApplyError names the event and the rule it broke.
type ApplyError struct {
	Seq  uint64
	Type events.Type
	ID   string // the task or wake
	Rule string
	Err  error // a more specific kind than ErrInconsistent (ErrUnknownEvent), or nil
}

func (e *ApplyError) Error() string {
	return fmt.Sprintf("%v: seq %d (%s %s): %s", ErrInconsistent, e.Seq, e.Type, e.ID, e.Rule)
}

// Unwrap gives ErrInconsistent, and Err when it is set.
func (e *ApplyError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInconsistent}
	}
	return []error{ErrInconsistent, e.Err}
}

// failFunc builds the *ApplyError of the event being applied.
type failFunc func(format string, args ...any) *ApplyError

// unknownEvent is the rejection of an event type the fold has no rule for.
func unknownEvent(ev events.Event, fail failFunc) error {
	e := fail("unknown event type %d", uint8(ev.Type()))
	e.Err = ErrUnknownEvent
	return e
}

// Apply folds one event into s. It checks every precondition first; an event it rejects
// leaves s unchanged and returns an *ApplyError.
//
// There is one orchestration for every State: records are reached through the State's
// record-access methods (EditTask and TaskEdited, NewTask and PutTask, and the wake twins),
// so a Mem (or anything that embeds one) is changed in place and a store writes back copies,
// under the same rules, written once below.
func Apply(s State, ev events.Event) error {
	h := ev.Head()
	taskID, wakeID := ev.Subject()
	fail := func(format string, args ...any) *ApplyError {
		return &ApplyError{Seq: h.Seq, Type: ev.Type(), ID: taskID + wakeID, Rule: fmt.Sprintf(format, args...)}
	}
	last, err := s.LastSeq()
	if err != nil {
		return err
	}
	if h.Seq != last+1 {
		return fail("sequence %d does not follow %d", h.Seq, last)
	}
	if err := applyEvent(s, ev, h, taskID, wakeID, fail); err != nil {
		return err
	}
	return s.SetLastSeq(h.Seq)
}

func applyEvent(s State, ev events.Event, h *events.Header, taskID, wakeID string, fail failFunc) error {
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		return applyTaskSubmitted(s, e, fail)
	case *events.WakeRecorded:
		return applyWakeRecorded(s, e, fail)
	case *events.TaskRetried:
		return applyTaskRetried(s, e, h, fail)
	case *events.ScheduleSet:
		return applyScheduleSet(s, e, fail)
	case *events.ScheduleRemoved:
		return applyScheduleRemoved(s, e, fail)
	case *events.KindPolicySet:
		return applyKindPolicySet(s, e, fail)
	case *events.TaskClaimed, *events.TaskSettled, *events.TaskCancelRequested, *events.TaskSettleRejected,
		*events.TaskExtended, *events.TaskReleased:
		t, err := s.EditTask(taskID)
		if err != nil {
			return err
		}
		if t == nil {
			return fail("no such task")
		}
		old := placeOf(t)
		if err := taskRule(t, ev, h, fail); err != nil {
			return err
		}
		if err := moveTask(s, old, t); err != nil {
			return err
		}
		if _, ok := ev.(*events.TaskClaimed); ok {
			if err := takeToken(s, t.Kind, h.At); err != nil {
				return err
			}
		}
		if !old.state.Terminal() && t.State.Terminal() {
			if err := indexPrunableTask(s, t, nil); err != nil {
				return err
			}
		}
		return s.TaskEdited(t)
	case *events.TaskSubmitRejected:
		// Audit only: the key must name the task, of the event's session. Nothing changes.
		t, err := s.Task(taskID)
		if err != nil {
			return err
		}
		if t == nil {
			return fail("no such task")
		}
		if t.SessionID != h.SessionID {
			return fail("task belongs to session %q, event names %q", t.SessionID, h.SessionID)
		}
		if t.IdempotencyKey != e.IdempotencyKey {
			return fail("task has idempotency key %q, event names %q", t.IdempotencyKey, e.IdempotencyKey)
		}
		return nil
	case *events.WakeClaimed, *events.WakeAcked, *events.WakeAckRejected:
		w, err := s.EditWake(wakeID)
		if err != nil {
			return err
		}
		if w == nil {
			return fail("no such wake")
		}
		oldAt, oldIn := w.AvailableAt()
		wasAcked := w.Acked
		var t *Task // a completion wake's task, when it is acknowledged now
		if _, ok := ev.(*events.WakeAcked); ok && !wasAcked && w.Reason == events.WakeTaskFinished {
			if t, err = detachedAckRule(s, w, fail); err != nil {
				return err
			}
		}
		if err := wakeRule(w, ev, h, fail); err != nil {
			return err
		}
		if err := moveWakeIndex(s, oldAt, oldIn, w); err != nil {
			return err
		}
		if !wasAcked && w.Acked {
			if err := indexPrunableWake(s, w, t); err != nil {
				return err
			}
		}
		return s.WakeEdited(w)
	}
	return unknownEvent(ev, fail)
}

// taskRule checks ev, an event on an existing task other than its submission, against t and,
// only when every check holds, changes t as the event says. A rejected event leaves t as it
// was (t may be the state's own record).
func taskRule(t *Task, ev events.Event, h *events.Header, fail failFunc) error {
	if t.SessionID != h.SessionID {
		return fail("task belongs to session %q, event names %q", t.SessionID, h.SessionID)
	}
	switch e := ev.(type) {
	case *events.TaskClaimed:
		if !t.ClaimableAt(h.At) {
			return fail("claim of a task that is not eligible (state %s)", t.State)
		}
		if err := claimRule("task", t.Attempts, e.Attempt, e.LeaseToken, e.LeaseExpiresAt, h.At, fail); err != nil {
			return err
		}
		t.State = events.StateRunning
		t.Attempts = e.Attempt
		t.LeaseToken = e.LeaseToken
		t.LeaseExpiresAt = e.LeaseExpiresAt
	case *events.TaskExtended:
		if !t.HeldBy(e.Attempt) {
			return fail("extension by attempt %d, which does not hold the claim (state %s, attempts %d)", e.Attempt, t.State, t.Attempts)
		}
		if e.LeaseExpiresAt <= h.At {
			return fail("extension needs a lease that ends after it")
		}
		t.LeaseExpiresAt = e.LeaseExpiresAt
	case *events.TaskReleased:
		if !t.HeldBy(e.Attempt) {
			return fail("release by attempt %d, which does not hold the claim (state %s, attempts %d)", e.Attempt, t.State, t.Attempts)
		}
		if e.RunAt < h.At {
			return fail("release until %d, before the release", e.RunAt)
		}
		t.LeaseToken, t.LeaseExpiresAt = "", 0
		if t.CancelRequested {
			// The holder gives back work whose cancel was requested: it ends as a cancel of
			// pending work does (the decide code then records its completion wake).
			cancelNow(t, h.At)
		} else {
			t.State = events.StatePending
			t.ScheduledAt = e.RunAt
		}
	case *events.TaskSettled:
		if !t.OwnedBy(e.Attempt, e.LeaseToken) {
			return fail("settlement by a delivery that does not own the claim")
		}
		t.State = e.Outcome.State
		t.FinishedAt = h.At
		t.Outcome = e.Outcome
		t.SettledToken = e.LeaseToken
		t.LeaseToken, t.LeaseExpiresAt = "", 0
	case *events.TaskCancelRequested:
		if t.State.Terminal() {
			return fail("cancel request on a terminal task")
		}
		if !t.CancelRequested {
			t.CancelRequested, t.CancelRequestedAt = true, h.At
		}
		if t.State == events.StatePending {
			cancelNow(t, h.At)
		}
	case *events.TaskRetried:
		if !t.Retryable() {
			return fail("retry of a task in state %s (only a failed or canceled task can be retried)", t.State)
		}
		if e.Attempts != t.Attempts {
			return fail("retry names attempts %d, the task has %d", e.Attempts, t.Attempts)
		}
		if e.RunAt < h.At {
			return fail("retry until %d, before the retry", e.RunAt)
		}
		// Pending again with its request and history: the end of the last run is cleared
		// (the completion wake id too, so that the next end records a wake of its own), the
		// attempts are kept and remembered, so the next claim is attempt Attempts+1.
		t.State = events.StatePending
		t.ScheduledAt = e.RunAt
		t.FinishedAt = 0
		t.Outcome = events.Outcome{}
		t.SettledToken = ""
		t.CancelRequested, t.CancelRequestedAt = false, 0
		t.CompletionWakeID = ""
		t.AttemptsAtRetry = e.Attempts
	case *events.TaskSettleRejected:
		if !t.RejectionRecordable(e.Attempt) {
			return rejectionFail(e.Attempt, t.Attempts, t.RejectedAttempt, fail)
		}
		t.RejectedAttempt = e.Attempt
	default:
		return unknownEvent(ev, fail)
	}
	t.UpdatedSeq = h.Seq
	return nil
}

// applyTaskRetried applies a retry (events.TaskRetried): the task rule above, then the
// indexes a terminal task leaves. The task's completion wake, when it has one, stays recorded
// but is no longer the task's (CompletionWakeID is cleared). Acknowledged, it becomes a
// retention subject of its own (Wake.DetachedPruneAt), pruned before the task can be. Not
// acknowledged yet, it stays deliverable with its outcome and enters no retention index: the
// task counts it (UnackedEarlierWakes) and is not prunable until its acknowledgment counts it
// off (indexPrunableWake), so the wake can never outlive the task's pruning and leave a
// retained event naming a pruned task. (A fold of a pruned log finds no wake there: it was
// pruned first, and its acknowledgment with it.) The task re-enters the due indexes and its
// counts move (moveTask, as for any task event); it leaves the retention index, where it was
// if it had become prunable.
func applyTaskRetried(s State, e *events.TaskRetried, h *events.Header, fail failFunc) error {
	t, err := s.EditTask(e.TaskID)
	if err != nil {
		return err
	}
	if t == nil {
		return fail("no such task")
	}
	var w *Wake // the completion wake of the run that ended; read only
	if t.CompletionWakeID != "" {
		if w, err = s.EditWake(t.CompletionWakeID); err != nil {
			return err
		}
	}
	if w != nil && !w.Acked && t.UnackedEarlierWakes == math.MaxUint32 {
		return fail("retry of a task that counts %d unacknowledged earlier completion wakes; the count cannot grow", t.UnackedEarlierWakes)
	}
	old := placeOf(t)
	oldPruneAt, wasPrunable := t.PruneAt(w)
	if err := taskRule(t, e, h, fail); err != nil {
		return err
	}
	if w != nil && !w.Acked {
		t.UnackedEarlierWakes++
	}
	if err := moveTask(s, old, t); err != nil {
		return err
	}
	if p, ok := s.(PruneIndexer); ok {
		if wasPrunable {
			if err := p.DeletePrunable(PruneEntry{At: oldPruneAt, Seq: t.SubmitSeq, ID: t.ID}); err != nil {
				return err
			}
		}
		if w != nil {
			if at, ok := w.DetachedPruneAt(t); ok {
				if err := p.PutPrunable(PruneEntry{At: at, Seq: w.RecordSeq, ID: w.ID, Wake: true}); err != nil {
					return err
				}
			}
		}
	}
	return s.TaskEdited(t)
}

// detachedAckRule checks the acknowledgment of w, a completion wake not acknowledged yet,
// against its task, and returns the task (from EditTask, for indexPrunableWake to change; nil
// when the fold has none, as a fold of part of the log may not): a wake that is no longer its
// task's completion wake was detached by a retry while unacknowledged, so the task must count
// it (Task.UnackedEarlierWakes).
func detachedAckRule(s State, w *Wake, fail failFunc) (*Task, error) {
	t, err := s.EditTask(w.TaskID)
	if err != nil || t == nil {
		return nil, err
	}
	if t.CompletionWakeID != w.ID && t.UnackedEarlierWakes == 0 {
		return nil, fail("acknowledgment of completion wake %s of an earlier run of task %s, which counts no unacknowledged earlier wake", w.ID, t.ID)
	}
	return t, nil
}

// cancelNow ends t, which no claim holds, as canceled at at: a cancel request on pending
// work, or the release of work whose cancel was requested.
func cancelNow(t *Task, at int64) {
	t.State = events.StateCanceled
	t.FinishedAt = at
	t.Outcome = events.Outcome{State: events.StateCanceled}
}

// claimRule checks what a claim of an eligible task or wake names: the next attempt (attempts
// cannot grow past MaxUint32), a token, and a lease that ends after the claim.
func claimRule(what string, attempts, attempt uint32, token string, expires, now int64, fail failFunc) error {
	if attempts == math.MaxUint32 {
		return fail("the %s has been claimed %d times; attempts cannot grow", what, attempts)
	}
	if attempt != attempts+1 {
		return fail("claim attempt %d, want %d", attempt, attempts+1)
	}
	if token == "" || expires <= now {
		return fail("claim needs a token and a lease that ends after the claim")
	}
	return nil
}

// rejectionFail is the rejection of an audit record that RejectionRecordable refuses.
func rejectionFail(attempt, attempts, recorded uint32, fail failFunc) error {
	return fail("rejection of attempt %d is not recordable (attempts %d, recorded %d)", attempt, attempts, recorded)
}

// wakeRule is taskRule for the events on an existing wake.
func wakeRule(w *Wake, ev events.Event, h *events.Header, fail failFunc) error {
	if w.SessionID != h.SessionID {
		return fail("wake belongs to session %q, event names %q", w.SessionID, h.SessionID)
	}
	switch e := ev.(type) {
	case *events.WakeClaimed:
		if !w.ClaimableAt(h.At) {
			return fail("claim of a wake that is not available")
		}
		if err := claimRule("wake", w.Attempts, e.Attempt, e.LeaseToken, e.LeaseExpiresAt, h.At, fail); err != nil {
			return err
		}
		w.Attempts = e.Attempt
		w.LeaseToken = e.LeaseToken
		w.LeaseExpiresAt = e.LeaseExpiresAt
	case *events.WakeAcked:
		if !w.OwnedBy(e.Attempt, e.LeaseToken) {
			return fail("acknowledgment by a delivery that does not own the claim")
		}
		w.Acked = true
		w.AckedAt = h.At
		w.AckedToken = e.LeaseToken
		w.LeaseToken, w.LeaseExpiresAt = "", 0
	case *events.WakeAckRejected:
		if !w.RejectionRecordable(e.Attempt) {
			return rejectionFail(e.Attempt, w.Attempts, w.RejectedAttempt, fail)
		}
		w.RejectedAttempt = e.Attempt
	default:
		return unknownEvent(ev, fail)
	}
	w.UpdatedSeq = h.Seq
	return nil
}

// submitRule checks a submission against s: the id is new, and so is the idempotency key.
func submitRule(s State, e *events.TaskSubmitted, fail failFunc) error {
	if e.TaskID == "" || e.Kind == "" {
		return fail("a task needs an id and a kind")
	}
	if t, err := s.EditTask(e.TaskID); err != nil {
		return err
	} else if t != nil {
		return fail("task id already used")
	}
	if e.IdempotencyKey != "" {
		id, err := s.TaskKey(e.SessionID, e.IdempotencyKey)
		if err != nil {
			return err
		}
		if id != "" {
			return fail("idempotency key %q already names %s", e.IdempotencyKey, id)
		}
	}
	return nil
}

// SubmittedTask is the record e makes (as Apply's fold makes it, at e's Seq): for a
// submission decided before its event is in the log (postgres.SubmitTx).
func SubmittedTask(e *events.TaskSubmitted) *Task {
	t := &Task{}
	fillTask(t, e)
	return t
}

// fillTask fills t, a zero record, from its submission.
func fillTask(t *Task, e *events.TaskSubmitted) {
	*t = Task{
		ID: e.TaskID, SessionID: e.SessionID, Kind: e.Kind, Input: e.Input,
		HasRunAt: e.HasRunAt, RunAt: e.RunAt, IdempotencyKey: e.IdempotencyKey,
		WakeOnCompletion: e.WakeOnCompletion, CreatedAt: e.At, ScheduledAt: e.ScheduledAt(),
		SubmitSeq: e.Seq, State: events.StatePending, UpdatedSeq: e.Seq,
		Priority: e.Priority, Headers: e.Headers,
	}
}

func applyTaskSubmitted(s State, e *events.TaskSubmitted, fail failFunc) error {
	if err := submitRule(s, e, fail); err != nil {
		return err
	}
	var oldSc, sc *Schedule
	if e.Schedule != "" {
		var err error
		if oldSc, sc, err = tickRule(s, e, fail); err != nil {
			return err
		}
	}
	t := s.NewTask()
	fillTask(t, e)
	if e.IdempotencyKey != "" {
		if err := s.PutTaskKey(e.SessionID, e.IdempotencyKey, e.TaskID); err != nil {
			return err
		}
	}
	if err := addTask(s, t); err != nil {
		return err
	}
	if sc != nil {
		if err := moveSchedule(s, oldSc, sc); err != nil {
			return err
		}
	}
	return s.PutTask(t)
}

// wakeRecordedRule checks a new wake against s: the id is new; a direct wake's key is new; a
// completion wake names a terminal task of its session whose policy asks for it and that has
// none yet (Task.CompletionWakeDue), with the same outcome. For a completion wake it returns
// that task, from EditTask, for Apply to change.
func wakeRecordedRule(s State, e *events.WakeRecorded, fail failFunc) (*Task, error) {
	if e.WakeID == "" {
		return nil, fail("a wake needs an id")
	}
	if w, err := s.EditWake(e.WakeID); err != nil {
		return nil, err
	} else if w != nil {
		return nil, fail("wake id already used")
	}
	switch e.Reason {
	case events.WakeRequested:
		if e.IdempotencyKey != "" {
			id, err := s.WakeKey(e.SessionID, e.IdempotencyKey)
			if err != nil {
				return nil, err
			}
			if id != "" {
				return nil, fail("idempotency key %q already names %s", e.IdempotencyKey, id)
			}
		}
		return nil, nil
	case events.WakeTaskFinished:
		t, err := s.EditTask(e.TaskID)
		if err != nil {
			return nil, err
		}
		if t == nil {
			return nil, fail("completion wake for unknown task %s", e.TaskID)
		}
		if t.SessionID != e.SessionID {
			return nil, fail("completion wake in another session than task %s", e.TaskID)
		}
		switch t.completionWakeCheck() {
		case completionWakeNever:
			return nil, fail("completion wake for task %s whose policy is never", e.TaskID)
		case completionWakeNotTerminal:
			return nil, fail("completion wake for task %s in state %s", e.TaskID, t.State)
		case completionWakeRecorded:
			return nil, fail("second completion wake for task %s (first %s)", e.TaskID, t.CompletionWakeID)
		}
		if t.State != e.Outcome.State {
			return nil, fail("completion wake for task %s in state %s", e.TaskID, t.State)
		}
		return t, nil
	}
	return nil, fail("unknown wake reason %d", e.Reason)
}

// fillWake fills w, a zero record, from the event that records it.
func fillWake(w *Wake, e *events.WakeRecorded) {
	*w = Wake{
		ID: e.WakeID, SessionID: e.SessionID, Reason: e.Reason, Payload: e.Payload,
		IdempotencyKey: e.IdempotencyKey, TaskID: e.TaskID, Outcome: e.Outcome,
		CreatedAt: e.At, RecordSeq: e.Seq, UpdatedSeq: e.Seq,
	}
}

func applyWakeRecorded(s State, e *events.WakeRecorded, fail failFunc) error {
	task, err := wakeRecordedRule(s, e, fail)
	if err != nil {
		return err
	}
	w := s.NewWake()
	fillWake(w, e)
	if task != nil {
		// A terminal task is in no index, before and after.
		task.CompletionWakeID = e.WakeID
		task.UpdatedSeq = e.Seq
		if err := s.TaskEdited(task); err != nil {
			return err
		}
	}
	if e.Reason == events.WakeRequested && e.IdempotencyKey != "" {
		if err := s.PutWakeKey(e.SessionID, e.IdempotencyKey, e.WakeID); err != nil {
			return err
		}
	}
	if err := moveWakeIndex(s, 0, false, w); err != nil {
		return err
	}
	return s.PutWake(w)
}

// taskPlace is what the fold's indexes and counts hold of a task: its due-index time and
// whether it is in the due index at all (EligibleAt), and its state (Counts). Apply takes it
// before a rule changes the task, and moveTask moves the task's entries from there.
type taskPlace struct {
	at     int64
	due    bool
	state  events.TaskState
	lease  IndexEntry // its entry in its kind's lease index, when leased
	leased bool
}

func placeOf(t *Task) taskPlace {
	at, due := t.EligibleAt()
	lease, leased := t.LeaseEntry()
	return taskPlace{at: at, due: due, state: t.State, lease: lease, leased: leased}
}

// addTask enters a new task into the indexes and counts: its session's list, the due indexes
// (a new task is pending) and the count of its kind's pending tasks.
func addTask(s State, t *Task) error {
	if err := s.PutSessionTask(t.SessionID, t.SubmitSeq, t.ID); err != nil {
		return err
	}
	if err := s.AddCount(t.Kind, t.State, 1); err != nil {
		return err
	}
	at, _ := t.EligibleAt()
	return moveEntry(s, TaskIndexes(t), false, IndexEntry{}, true, t.DueEntry(at))
}

// moveTask moves t's entries from old, its place before the change, to where it is now: its
// count from the old state to the new, and its entry in the due indexes (TaskIndexes) from
// the old time to the new (out of them once it is terminal).
func moveTask(s State, old taskPlace, t *Task) error {
	if err := moveLease(s, old.lease, old.leased, t); err != nil {
		return err
	}
	if old.state != t.State {
		if err := s.AddCount(t.Kind, old.state, -1); err != nil {
			return err
		}
		if err := s.AddCount(t.Kind, t.State, 1); err != nil {
			return err
		}
	}
	newAt, newIn := t.EligibleAt()
	return moveEntry(s, TaskIndexes(t), old.due, t.DueEntry(old.at), newIn, t.DueEntry(newAt))
}

// moveWakeIndex is moveTask for the wake indexes (WakeIndexes; wakes have no counts).
func moveWakeIndex(s State, oldAt int64, oldIn bool, w *Wake) error {
	newAt, newIn := w.AvailableAt()
	return moveEntry(s, WakeIndexes(w), oldIn, w.WakeEntry(oldAt), newIn, w.WakeEntry(newAt))
}

// moveEntry moves a record's entry in each of its indexes ps from old (if oldIn) to e (if
// in); nothing when it stays at the same key.
func moveEntry(s State, ps [2]Placement, oldIn bool, old IndexEntry, in bool, e IndexEntry) error {
	if oldIn {
		if in && old == e {
			return nil // entries unchanged
		}
		for _, p := range ps {
			if err := s.DeleteIndex(p.Index, p.Part, old); err != nil {
				return err
			}
		}
	}
	if in {
		for _, p := range ps {
			if err := s.PutIndex(p.Index, p.Part, e); err != nil {
				return err
			}
		}
	}
	return nil
}
