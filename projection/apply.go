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

// ApplyError names the event and the rule it broke.
type ApplyError struct {
	Seq  uint64
	Type events.Type
	ID   string // the task or wake
	Rule string
}

func (e *ApplyError) Error() string {
	return fmt.Sprintf("%v: seq %d (%s %s): %s", ErrInconsistent, e.Seq, e.Type, e.ID, e.Rule)
}

func (e *ApplyError) Unwrap() error { return ErrInconsistent }

// failFunc builds the *ApplyError of the event being applied.
type failFunc func(format string, args ...any) error

// Apply folds one event into s. It checks every precondition first; an event it rejects
// leaves s unchanged and returns an *ApplyError.
//
// A *Mem is changed in place (see Mem.apply); any other State through its methods, with
// records read by Task or Wake and written back by PutTask or PutWake. Both follow the same
// rules, written once below.
func Apply(s State, ev events.Event) error {
	h := ev.Head()
	taskID, wakeID := ev.Subject()
	fail := func(format string, args ...any) error {
		return &ApplyError{Seq: h.Seq, Type: ev.Type(), ID: taskID + wakeID, Rule: fmt.Sprintf(format, args...)}
	}
	if m, ok := s.(*Mem); ok {
		if h.Seq != m.lastSeq+1 {
			return fail("sequence %d does not follow %d", h.Seq, m.lastSeq)
		}
		if err := m.apply(ev, h, taskID, wakeID, fail); err != nil {
			return err
		}
		m.lastSeq = h.Seq
		return nil
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
	}
	if taskID != "" {
		t, err := s.Task(taskID)
		if err != nil {
			return err
		}
		if t == nil {
			return fail("no such task")
		}
		oldAt, oldIn := t.EligibleAt()
		if err := taskRule(t, ev, h, fail); err != nil {
			return err
		}
		if err := moveDue(s, oldAt, oldIn, t); err != nil {
			return err
		}
		return s.PutTask(t)
	}
	w, err := s.Wake(wakeID)
	if err != nil {
		return err
	}
	if w == nil {
		return fail("no such wake")
	}
	oldAt, oldIn := w.AvailableAt()
	if err := wakeRule(w, ev, h, fail); err != nil {
		return err
	}
	if err := moveWakeIndex(s, oldAt, oldIn, w); err != nil {
		return err
	}
	return s.PutWake(w)
}

// taskRule checks ev, an event on an existing task other than its submission, against t and,
// only when every check holds, changes t as the event says. A rejected event leaves t as it
// was.
func taskRule(t *Task, ev events.Event, h *events.Header, fail failFunc) error {
	if t.SessionID != h.SessionID {
		return fail("task belongs to session %q, event names %q", t.SessionID, h.SessionID)
	}
	switch e := ev.(type) {
	case *events.TaskClaimed:
		if at, ok := t.EligibleAt(); !ok || at > h.At {
			return fail("claim of a task that is not eligible (state %s)", t.State)
		}
		if err := claimRule("task", t.Attempts, e.Attempt, e.LeaseToken, e.LeaseExpiresAt, h.At, fail); err != nil {
			return err
		}
		t.State = events.StateRunning
		t.Attempts = e.Attempt
		t.LeaseToken = e.LeaseToken
		t.LeaseExpiresAt = e.LeaseExpiresAt
	case *events.TaskSettled:
		if t.State != events.StateRunning || t.Attempts != e.Attempt || t.LeaseToken != e.LeaseToken {
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
			t.State = events.StateCanceled
			t.FinishedAt = h.At
			t.Outcome = events.Outcome{State: events.StateCanceled}
		}
	case *events.TaskSettleRejected:
		if err := rejectionRule(e.Attempt, t.Attempts, t.RejectedAttempt, fail); err != nil {
			return err
		}
		t.RejectedAttempt = e.Attempt
	default:
		return fail("unknown event")
	}
	t.UpdatedSeq = h.Seq
	return nil
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

// rejectionRule bounds the audit of stale settlements and acknowledgments: one record per
// attempt that was really handed out (1..attempts), in increasing attempt order.
func rejectionRule(attempt, attempts, recorded uint32, fail failFunc) error {
	if attempt == 0 || attempt > attempts || attempt <= recorded {
		return fail("rejection of attempt %d is not recordable (attempts %d, recorded %d)",
			attempt, attempts, recorded)
	}
	return nil
}

// wakeRule is taskRule for the events on an existing wake.
func wakeRule(w *Wake, ev events.Event, h *events.Header, fail failFunc) error {
	if w.SessionID != h.SessionID {
		return fail("wake belongs to session %q, event names %q", w.SessionID, h.SessionID)
	}
	switch e := ev.(type) {
	case *events.WakeClaimed:
		if at, ok := w.AvailableAt(); !ok || at > h.At {
			return fail("claim of a wake that is not available")
		}
		if err := claimRule("wake", w.Attempts, e.Attempt, e.LeaseToken, e.LeaseExpiresAt, h.At, fail); err != nil {
			return err
		}
		w.Attempts = e.Attempt
		w.LeaseToken = e.LeaseToken
		w.LeaseExpiresAt = e.LeaseExpiresAt
	case *events.WakeAcked:
		// A wake never claimed has attempt 0 and no token: an ack presenting exactly those
		// owns nothing.
		if w.Acked || !w.Claimed() || w.Attempts != e.Attempt || w.LeaseToken != e.LeaseToken {
			return fail("acknowledgment by a delivery that does not own the claim")
		}
		w.Acked = true
		w.AckedToken = e.LeaseToken
		w.LeaseToken, w.LeaseExpiresAt = "", 0
	case *events.WakeAckRejected:
		if err := rejectionRule(e.Attempt, w.Attempts, w.RejectedAttempt, fail); err != nil {
			return err
		}
		w.RejectedAttempt = e.Attempt
	default:
		return fail("unknown event")
	}
	w.UpdatedSeq = h.Seq
	return nil
}

// submitRule checks a submission against the state through r: the id is new, and so is the
// idempotency key.
func submitRule(r Reader, e *events.TaskSubmitted, fail failFunc) error {
	if e.TaskID == "" || e.Kind == "" {
		return fail("a task needs an id and a kind")
	}
	if t, err := r.Task(e.TaskID); err != nil {
		return err
	} else if t != nil {
		return fail("task id already used")
	}
	if e.IdempotencyKey != "" {
		id, err := r.TaskKey(e.SessionID, e.IdempotencyKey)
		if err != nil {
			return err
		}
		if id != "" {
			return fail("idempotency key %q already names %s", e.IdempotencyKey, id)
		}
	}
	return nil
}

// newTask fills t, a zero record, from its submission.
func newTask(t *Task, e *events.TaskSubmitted) {
	*t = Task{
		ID: e.TaskID, SessionID: e.SessionID, Kind: e.Kind, Input: e.Input,
		HasRunAt: e.HasRunAt, RunAt: e.RunAt, IdempotencyKey: e.IdempotencyKey,
		WakeOnCompletion: e.WakeOnCompletion, CreatedAt: e.At, ScheduledAt: e.ScheduledAt(),
		SubmitSeq: e.Seq, State: events.StatePending, UpdatedSeq: e.Seq,
	}
}

func applyTaskSubmitted(s State, e *events.TaskSubmitted, fail failFunc) error {
	if err := submitRule(s, e, fail); err != nil {
		return err
	}
	t := new(Task)
	newTask(t, e)
	if e.IdempotencyKey != "" {
		if err := s.PutTaskKey(e.SessionID, e.IdempotencyKey, e.TaskID); err != nil {
			return err
		}
	}
	if err := moveDue(s, 0, false, t); err != nil {
		return err
	}
	return s.PutTask(t)
}

// wakeRecordedRule checks a new wake against the state through r: the id is new; a direct
// wake's key is new; a completion wake names a terminal task of its session whose policy asks
// for it and that has none yet. For a completion wake it returns that task, as taskOf (r.Task,
// or Mem's own record) gave it.
func wakeRecordedRule(r Reader, e *events.WakeRecorded, fail failFunc, taskOf func(string) (*Task, error)) (*Task, error) {
	if e.WakeID == "" {
		return nil, fail("a wake needs an id")
	}
	if w, err := r.Wake(e.WakeID); err != nil {
		return nil, err
	} else if w != nil {
		return nil, fail("wake id already used")
	}
	switch e.Reason {
	case events.WakeRequested:
		if e.IdempotencyKey != "" {
			id, err := r.WakeKey(e.SessionID, e.IdempotencyKey)
			if err != nil {
				return nil, err
			}
			if id != "" {
				return nil, fail("idempotency key %q already names %s", e.IdempotencyKey, id)
			}
		}
		return nil, nil
	case events.WakeTaskFinished:
		t, err := taskOf(e.TaskID)
		if err != nil {
			return nil, err
		}
		switch {
		case t == nil:
			return nil, fail("completion wake for unknown task %s", e.TaskID)
		case t.SessionID != e.SessionID:
			return nil, fail("completion wake in another session than task %s", e.TaskID)
		case !t.WakeOnCompletion:
			return nil, fail("completion wake for task %s whose policy is never", e.TaskID)
		case !t.State.Terminal() || t.State != e.Outcome.State:
			return nil, fail("completion wake for task %s in state %s", e.TaskID, t.State)
		case t.CompletionWakeID != "":
			return nil, fail("second completion wake for task %s (first %s)", e.TaskID, t.CompletionWakeID)
		}
		return t, nil
	}
	return nil, fail("unknown wake reason %d", e.Reason)
}

// newWake fills w, a zero record, from the event that records it.
func newWake(w *Wake, e *events.WakeRecorded) {
	*w = Wake{
		ID: e.WakeID, SessionID: e.SessionID, Reason: e.Reason, Payload: e.Payload,
		IdempotencyKey: e.IdempotencyKey, TaskID: e.TaskID, Outcome: e.Outcome,
		CreatedAt: e.At, RecordSeq: e.Seq, UpdatedSeq: e.Seq,
	}
}

func applyWakeRecorded(s State, e *events.WakeRecorded, fail failFunc) error {
	task, err := wakeRecordedRule(s, e, fail, s.Task)
	if err != nil {
		return err
	}
	w := new(Wake)
	newWake(w, e)
	if task != nil {
		// A terminal task is in no index, before and after.
		task.CompletionWakeID = e.WakeID
		task.UpdatedSeq = e.Seq
		if err := s.PutTask(task); err != nil {
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

// moveDue moves t's due-index entry from where it was, (oldAt, oldIn) as EligibleAt said
// before the change, to where it is now.
func moveDue(s State, oldAt int64, oldIn bool, t *Task) error {
	newAt, newIn := t.EligibleAt()
	if oldIn {
		if newIn && oldAt == newAt {
			return nil // entry unchanged
		}
		if err := s.DeleteDue(IndexEntry{At: oldAt, Seq: t.SubmitSeq, ID: t.ID}); err != nil {
			return err
		}
	}
	if newIn {
		return s.PutDue(IndexEntry{At: newAt, Seq: t.SubmitSeq, ID: t.ID})
	}
	return nil
}

// moveWakeIndex is moveDue for the available-wake index.
func moveWakeIndex(s State, oldAt int64, oldIn bool, w *Wake) error {
	newAt, newIn := w.AvailableAt()
	if oldIn {
		if newIn && oldAt == newAt {
			return nil
		}
		if err := s.DeleteWakeIndex(IndexEntry{At: oldAt, Seq: w.RecordSeq, ID: w.ID}); err != nil {
			return err
		}
	}
	if newIn {
		return s.PutWakeIndex(IndexEntry{At: newAt, Seq: w.RecordSeq, ID: w.ID})
	}
	return nil
}
