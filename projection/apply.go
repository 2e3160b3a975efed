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

// Apply folds one event into s. It checks every precondition first; an event it rejects
// leaves s unchanged and returns an *ApplyError.
func Apply(s State, ev events.Event) error {
	h := ev.Head()
	taskID, wakeID := ev.Subject()
	id := taskID + wakeID
	fail := func(format string, args ...any) error {
		return &ApplyError{Seq: h.Seq, Type: ev.Type(), ID: id, Rule: fmt.Sprintf(format, args...)}
	}
	last, err := s.LastSeq()
	if err != nil {
		return err
	}
	if h.Seq != last+1 {
		return fail("sequence %d does not follow %d", h.Seq, last)
	}
	if err := applyEvent(s, ev, h, fail); err != nil {
		return err
	}
	return s.SetLastSeq(h.Seq)
}

func applyEvent(s State, ev events.Event, h *events.Header, fail func(string, ...any) error) error {
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		return applyTaskSubmitted(s, e, fail)
	case *events.WakeRecorded:
		return applyWakeRecorded(s, e, fail)
	}

	if taskID, _ := ev.Subject(); taskID != "" {
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
		old := *t
		switch e := ev.(type) {
		case *events.TaskClaimed:
			at, ok := t.EligibleAt()
			if !ok || at > h.At {
				return fail("claim of a task that is not eligible (state %s)", t.State)
			}
			if t.Attempts == math.MaxUint32 {
				return fail("the task has been claimed %d times; attempts cannot grow", t.Attempts)
			}
			if e.Attempt != t.Attempts+1 {
				return fail("claim attempt %d, want %d", e.Attempt, t.Attempts+1)
			}
			if e.LeaseToken == "" || e.LeaseExpiresAt <= h.At {
				return fail("claim needs a token and a lease that ends after the claim")
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
			if e.Attempt == 0 || e.Attempt > t.Attempts || e.Attempt <= t.RejectedAttempt {
				return fail("rejection of attempt %d is not recordable (attempts %d, recorded %d)",
					e.Attempt, t.Attempts, t.RejectedAttempt)
			}
			t.RejectedAttempt = e.Attempt
		default:
			return fail("unknown event")
		}
		t.UpdatedSeq = h.Seq
		return putTask(s, &old, t)
	}

	_, wakeID := ev.Subject()
	w, err := s.Wake(wakeID)
	if err != nil {
		return err
	}
	if w == nil {
		return fail("no such wake")
	}
	if w.SessionID != h.SessionID {
		return fail("wake belongs to session %q, event names %q", w.SessionID, h.SessionID)
	}
	old := *w
	switch e := ev.(type) {
	case *events.WakeClaimed:
		at, ok := w.AvailableAt()
		if !ok || at > h.At {
			return fail("claim of a wake that is not available")
		}
		if w.Attempts == math.MaxUint32 {
			return fail("the wake has been claimed %d times; attempts cannot grow", w.Attempts)
		}
		if e.Attempt != w.Attempts+1 {
			return fail("claim attempt %d, want %d", e.Attempt, w.Attempts+1)
		}
		if e.LeaseToken == "" || e.LeaseExpiresAt <= h.At {
			return fail("claim needs a token and a lease that ends after the claim")
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
		if e.Attempt == 0 || e.Attempt > w.Attempts || e.Attempt <= w.RejectedAttempt {
			return fail("rejection of attempt %d is not recordable (attempts %d, recorded %d)",
				e.Attempt, w.Attempts, w.RejectedAttempt)
		}
		w.RejectedAttempt = e.Attempt
	default:
		return fail("unknown event")
	}
	w.UpdatedSeq = h.Seq
	return putWake(s, &old, w)
}

func applyTaskSubmitted(s State, e *events.TaskSubmitted, fail func(string, ...any) error) error {
	if e.TaskID == "" || e.Kind == "" {
		return fail("a task needs an id and a kind")
	}
	if t, err := s.Task(e.TaskID); err != nil {
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
	t := &Task{
		ID: e.TaskID, SessionID: e.SessionID, Kind: e.Kind, Input: e.Input,
		HasRunAt: e.HasRunAt, RunAt: e.RunAt, IdempotencyKey: e.IdempotencyKey,
		WakeOnCompletion: e.WakeOnCompletion, CreatedAt: e.At, ScheduledAt: e.ScheduledAt(),
		SubmitSeq: e.Seq, State: events.StatePending, UpdatedSeq: e.Seq,
	}
	if e.IdempotencyKey != "" {
		if err := s.PutTaskKey(e.SessionID, e.IdempotencyKey, e.TaskID); err != nil {
			return err
		}
	}
	return putTask(s, nil, t)
}

func applyWakeRecorded(s State, e *events.WakeRecorded, fail func(string, ...any) error) error {
	if e.WakeID == "" {
		return fail("a wake needs an id")
	}
	if w, err := s.Wake(e.WakeID); err != nil {
		return err
	} else if w != nil {
		return fail("wake id already used")
	}
	var task *Task
	switch e.Reason {
	case events.WakeRequested:
		if e.IdempotencyKey != "" {
			id, err := s.WakeKey(e.SessionID, e.IdempotencyKey)
			if err != nil {
				return err
			}
			if id != "" {
				return fail("idempotency key %q already names %s", e.IdempotencyKey, id)
			}
		}
	case events.WakeTaskFinished:
		t, err := s.Task(e.TaskID)
		if err != nil {
			return err
		}
		switch {
		case t == nil:
			return fail("completion wake for unknown task %s", e.TaskID)
		case t.SessionID != e.SessionID:
			return fail("completion wake in another session than task %s", e.TaskID)
		case !t.WakeOnCompletion:
			return fail("completion wake for task %s whose policy is never", e.TaskID)
		case !t.State.Terminal() || t.State != e.Outcome.State:
			return fail("completion wake for task %s in state %s", e.TaskID, t.State)
		case t.CompletionWakeID != "":
			return fail("second completion wake for task %s (first %s)", e.TaskID, t.CompletionWakeID)
		}
		task = t
	default:
		return fail("unknown wake reason %d", e.Reason)
	}
	w := &Wake{
		ID: e.WakeID, SessionID: e.SessionID, Reason: e.Reason, Payload: e.Payload,
		IdempotencyKey: e.IdempotencyKey, TaskID: e.TaskID, Outcome: e.Outcome,
		CreatedAt: e.At, RecordSeq: e.Seq, UpdatedSeq: e.Seq,
	}
	if task != nil {
		old := *task
		task.CompletionWakeID = e.WakeID
		task.UpdatedSeq = e.Seq
		if err := putTask(s, &old, task); err != nil {
			return err
		}
	}
	if e.Reason == events.WakeRequested && e.IdempotencyKey != "" {
		if err := s.PutWakeKey(e.SessionID, e.IdempotencyKey, e.WakeID); err != nil {
			return err
		}
	}
	return putWake(s, nil, w)
}

// putTask writes t and moves its due-index entry from where old had it.
func putTask(s State, old, t *Task) error {
	newAt, newIn := t.EligibleAt()
	if old != nil {
		if oldAt, oldIn := old.EligibleAt(); oldIn && (!newIn || oldAt != newAt) {
			if err := s.DeleteDue(IndexEntry{At: oldAt, Seq: t.SubmitSeq, ID: t.ID}); err != nil {
				return err
			}
		} else if oldIn && newIn {
			return s.PutTask(t) // entry unchanged
		}
	}
	if newIn {
		if err := s.PutDue(IndexEntry{At: newAt, Seq: t.SubmitSeq, ID: t.ID}); err != nil {
			return err
		}
	}
	return s.PutTask(t)
}

func putWake(s State, old, w *Wake) error {
	newAt, newIn := w.AvailableAt()
	if old != nil {
		if oldAt, oldIn := old.AvailableAt(); oldIn && (!newIn || oldAt != newAt) {
			if err := s.DeleteWakeIndex(IndexEntry{At: oldAt, Seq: w.RecordSeq, ID: w.ID}); err != nil {
				return err
			}
		} else if oldIn && newIn {
			return s.PutWake(w)
		}
	}
	if newIn {
		if err := s.PutWakeIndex(IndexEntry{At: newAt, Seq: w.RecordSeq, ID: w.ID}); err != nil {
			return err
		}
	}
	return s.PutWake(w)
}
