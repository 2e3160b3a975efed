package work

import (
	"context"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// SessionBackend is what a Backend implements for the session methods of part 3 of the API:
// finding a task by its idempotency key, retrying a finished task and submitting a batch.
// worklog's own backends implement it; a custom Backend given to New that does not makes
// those methods fail with ErrBackend naming it.
type SessionBackend interface {
	// TaskByKey returns the session's task whose idempotency key is key (false: none).
	TaskByKey(ctx context.Context, sessionID, key string) (Task, bool, error)
	// Retry makes a failed or canceled task of the session pending again at runAt (already
	// max(runAt, now) and validated by the Session).
	Retry(ctx context.Context, sessionID, taskID string, runAt, now time.Time) (Task, error)
	// SubmitMany submits rs (each already validated) one after another in one durable
	// step: one result per request, in order (Session.SubmitManyAt).
	SubmitMany(ctx context.Context, sessionID string, rs []TaskRequest, now time.Time) ([]SubmitResult, error)
}

var _ SessionBackend = (*logBackend)(nil)

// sessionOps is the backend's SessionBackend, or the ErrBackend error naming it.
func (q *Queue) sessionOps() (SessionBackend, error) {
	if q.caps.session == nil {
		return nil, unsupported("this method", "SessionBackend")
	}
	return q.caps.session, nil
}

// TaskByKey returns this session's task whose idempotency key is key, in whatever state it
// is now: the task a submit with that key made (or would return). None, because the key was
// never used in this session or its task was pruned, is ErrTaskNotFound (Error.ID is the
// key); a blank key is ErrInvalidRequest (idempotency_key). It reads; it records nothing.
func (s *Session) TaskByKey(ctx context.Context, key string) (Task, error) {
	if err := s.q.begin(ctx); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("idempotency_key", key); err != nil {
		return Task{}, err
	}
	sb, serr := s.q.sessionOps()
	if serr != nil {
		return Task{}, serr
	}
	t, ok, err := sb.TaskByKey(ctx, s.id, key)
	if err != nil {
		return Task{}, wrap(err)
	}
	if !ok {
		return Task{}, notFound(key)
	}
	return t, nil
}

// Retry retries a finished task at the queue's clock's time.
func (s *Session) Retry(ctx context.Context, taskID string, runAt time.Time) (Task, error) {
	return s.RetryAt(ctx, taskID, runAt, s.q.now())
}

// RetryAt makes a failed or canceled task of this session pending again, at runAt when that
// is after now, else at now (a zero runAt: at once). Its outcome, finish time and cancel
// request are cleared; its id, kind, input, idempotency key and wake policy are kept, and so
// is its history: Attempts is kept (attempt numbers never repeat in the log) and
// Task.AttemptsAtRetry records it, from which the runner's MaxAttempts counts again. When it
// finishes again it records a new completion wake if its policy says so. One event,
// task_retried.
//
// The earlier finish's completion wake, acknowledged or not, stays recorded and keeps its
// outcome; not acknowledged yet, it stays deliverable (ClaimWakes, AckWake) as before the
// retry, and retention keeps the task while it is unacknowledged (Queue.Prune prunes neither
// before its acknowledgment; docs/projection.md §4.4). A task in any other state is
// ErrInvalidTransition (a succeeded task is done: submit new work instead). Another
// session's, an unknown or a pruned task is ErrTaskNotFound.
func (s *Session) RetryAt(ctx context.Context, taskID string, runAt, now time.Time) (Task, error) {
	if err := s.q.begin(ctx); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("task_id", taskID); err != nil {
		return Task{}, err
	}
	if _, err := nanos("now", now); err != nil {
		return Task{}, err
	}
	if !runAt.IsZero() {
		if _, err := nanos("run_at", runAt); err != nil {
			return Task{}, err
		}
	}
	if !runAt.After(now) {
		runAt = now
	}
	sb, serr := s.q.sessionOps()
	if serr != nil {
		return Task{}, serr
	}
	t, err := sb.Retry(ctx, s.id, taskID, runAt, now)
	return t, wrap(err)
}

func (b *logBackend) TaskByKey(ctx context.Context, sessionID, key string) (Task, bool, error) {
	var out Task
	var found bool
	err := b.eng.View(ctx, func(r projection.Reader) error {
		id, err := r.TaskKey(sessionID, key)
		if err != nil || id == "" {
			return err
		}
		t, err := mustTask(r, id)
		if err != nil {
			return err
		}
		out, found = b.taskSnapshotOf(t, true), true
		return nil
	})
	if err != nil {
		return Task{}, false, backendErr(err)
	}
	return out, found, nil
}

func (b *logBackend) Retry(ctx context.Context, sessionID, taskID string, runAt, now time.Time) (Task, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	until, verr := nanos("run_at", runAt)
	if verr != nil {
		return Task{}, verr
	}
	until = max(until, at)
	var out Task
	var derr error
	err := b.update(ctx, func(tx txn) error {
		out, derr = Task{}, nil // fn may run twice (engine.update)
		t, err := tx.Task(taskID)
		if err != nil {
			return err
		}
		if t == nil || t.SessionID != sessionID {
			derr = notFound(taskID)
			return nil
		}
		if !t.Retryable() {
			derr = badTransition("only a failed or canceled task can be retried; the task is " + TaskState(t.State).String())
			return nil
		}
		ev := &events.TaskRetried{
			Header: events.Header{SessionID: sessionID, At: at},
			TaskID: taskID, Attempts: t.Attempts, RunAt: until,
		}
		if err := tx.Append(ev); err != nil {
			return err
		}
		if t, err = mustTask(tx, taskID); err != nil {
			return err
		}
		out = b.taskSnapshot(t)
		return nil
	})
	return result(out, derr, err)
}
