package work

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// engine is the storage seam under the event-sourced backend: a log of events and the
// projection folded from it. The in-memory engine and the Pebble engine implement it; the
// decide code below is the same for both, so they behave alike by construction.
type engine interface {
	// update runs fn alone against the latest state. The events fn appends through tx are
	// applied to the projection as they are appended (so fn reads its own writes) and commit
	// atomically with it when fn returns nil: durably, for a durable engine, before update
	// returns. If fn returns an error nothing it appended is kept.
	update(ctx context.Context, fn func(tx txn) error) error
	// view runs fn against a consistent read of committed state.
	view(ctx context.Context, fn func(r projection.Reader) error) error
	// readLog calls fn for each event with seq >= from, in order, until fn returns an error.
	readLog(ctx context.Context, from uint64, fn func(events.Event) error) error
	// verify rebuilds the projection from the log and lists every difference from the
	// stored one; it also checks the log is gap-free and decodes.
	verify(ctx context.Context) ([]string, error)
	close() error
}

// txn is the write side of one command.
type txn interface {
	projection.Reader
	// append assigns the next sequence number to ev, applies it to the projection and adds it
	// to the command's batch.
	append(ev events.Event) error
}

// logBackend is worklog's event-sourced Backend: each command validates (in Queue), decides
// the events it causes from the current projection, appends them and applies them.
type logBackend struct {
	eng      engine
	ids      *idSource
	maxValue int
	clock    func() time.Time // only for the seed's clock-less AckWake; never used by decide
}

var _ Backend = (*logBackend)(nil)

// --- snapshots ---

func taskSnapshot(t *projection.Task) Task {
	out := Task{
		ID: t.ID, SessionID: t.SessionID, Kind: t.Kind,
		Input:          jsonValue(t.Input),
		State:          TaskState(t.State),
		IdempotencyKey: t.IdempotencyKey,
		ScheduledAt:    fromNanos(t.ScheduledAt),
		CreatedAt:      fromNanos(t.CreatedAt),
		Attempts:       t.Attempts,
	}
	if t.CancelRequested {
		out.CancelRequestedAt = fromNanos(t.CancelRequestedAt)
	}
	if t.State.Terminal() {
		out.FinishedAt = fromNanos(t.FinishedAt)
		o := outcomeFrom(t.Outcome)
		out.Outcome = &o
	}
	return out
}

// jsonValue is a stored JSON value as a copy for a snapshot; an empty one reads as null.
func jsonValue(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return bytes.Clone(b)
}

func outcomeFrom(o events.Outcome) Outcome {
	out := Outcome{State: TaskState(o.State), Summary: o.Summary, Error: o.Error}
	if o.State == events.StateSucceeded {
		out.Output = jsonValue(o.Output)
	}
	return out
}

func outcomeTo(o Outcome) events.Outcome {
	out := events.Outcome{State: events.TaskState(o.State), Summary: o.Summary, Error: o.Error}
	if o.State == TaskSucceeded {
		out.Output = ownJSON(o.Output)
	}
	return out
}

func sameOutcome(a events.Outcome, b events.Outcome) bool {
	return a.State == b.State && a.Summary == b.Summary && a.Error == b.Error &&
		(a.State != events.StateSucceeded || sameJSON(a.Output, b.Output))
}

func wakeSnapshot(w *projection.Wake) Wake {
	out := Wake{ID: w.ID, SessionID: w.SessionID, CreatedAt: fromNanos(w.CreatedAt), IdempotencyKey: w.IdempotencyKey}
	switch w.Reason {
	case events.WakeRequested:
		out.Reason = WakeReason{Kind: WakeRequested, Payload: jsonValue(w.Payload)}
	case events.WakeTaskFinished:
		o := outcomeFrom(w.Outcome)
		out.Reason = WakeReason{Kind: WakeTaskFinished, TaskID: w.TaskID, State: o.State, Outcome: &o}
	}
	return out
}

// sameTaskRequest is the seed's request equality: kind, input (as a JSON value), schedule,
// key and wake policy.
func sameTaskRequest(t *projection.Task, r *TaskRequest, runAt int64) bool {
	return t.Kind == r.Kind &&
		t.HasRunAt == !r.RunAt.IsZero() && (!t.HasRunAt || t.RunAt == runAt) &&
		t.IdempotencyKey == r.IdempotencyKey &&
		t.WakeOnCompletion == (r.Wake == WakeOnCompletion) &&
		sameJSON(t.Input, jsonOrNull(r.Input))
}

// --- commands ---

func (b *logBackend) Submit(ctx context.Context, sessionID string, r TaskRequest, now time.Time) (Task, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	var runAt int64
	if !r.RunAt.IsZero() {
		if runAt, verr = nanos("run_at", r.RunAt); verr != nil {
			return Task{}, verr
		}
	}
	// The new id is drawn before the command is queued: randomness stays off the single
	// writer's path. An idempotent repeat simply does not use it.
	newID, idErr := b.ids.id("task", at)
	if idErr != nil {
		return Task{}, backendErr(idErr)
	}
	var out Task
	var derr error
	err := b.eng.update(ctx, func(tx txn) error {
		if r.IdempotencyKey != "" {
			id, err := tx.TaskKey(sessionID, r.IdempotencyKey)
			if err != nil {
				return err
			}
			if id != "" {
				t, err := mustTask(tx, id)
				if err != nil {
					return err
				}
				if !sameTaskRequest(t, &r, runAt) {
					derr = conflict(r.IdempotencyKey)
					return nil
				}
				out = taskSnapshot(t)
				return nil
			}
		}
		id := newID
		ev := &events.TaskSubmitted{
			Header: events.Header{SessionID: sessionID, At: at},
			TaskID: id, Kind: r.Kind, Input: ownJSON(r.Input),
			HasRunAt: !r.RunAt.IsZero(), RunAt: runAt,
			IdempotencyKey: r.IdempotencyKey, WakeOnCompletion: r.Wake == WakeOnCompletion,
		}
		if err := tx.append(ev); err != nil {
			return err
		}
		t, err := mustTask(tx, id)
		if err != nil {
			return err
		}
		out = taskSnapshot(t)
		return nil
	})
	return result(out, derr, err)
}

func (b *logBackend) Task(ctx context.Context, sessionID, taskID string) (Task, bool, error) {
	var out Task
	var found bool
	err := b.eng.view(ctx, func(r projection.Reader) error {
		t, err := r.Task(taskID)
		if err != nil || t == nil || t.SessionID != sessionID {
			return err
		}
		out, found = taskSnapshot(t), true
		return nil
	})
	if err != nil {
		return Task{}, false, backendErr(err)
	}
	return out, found, nil
}

func (b *logBackend) Cancel(ctx context.Context, sessionID, taskID string, now time.Time) (Task, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	var out Task
	var derr error
	// A completion wake may be recorded: its id is drawn before the command is queued.
	wakeID, idErr := b.ids.id("wake", at)
	if idErr != nil {
		return Task{}, backendErr(idErr)
	}
	err := b.eng.update(ctx, func(tx txn) error {
		t, err := tx.Task(taskID)
		if err != nil {
			return err
		}
		if t == nil || t.SessionID != sessionID {
			derr = notFound(taskID)
			return nil
		}
		// A terminal task, or a running one whose cancel is already recorded, is unchanged:
		// the first request's time is kept and nothing is appended.
		if t.State.Terminal() || t.CancelRequested && t.State == events.StateRunning {
			out = taskSnapshot(t)
			return nil
		}
		wasPending := t.State == events.StatePending
		h := events.Header{SessionID: sessionID, At: at}
		if err := tx.append(&events.TaskCancelRequested{Header: h, TaskID: taskID}); err != nil {
			return err
		}
		if t, err = mustTask(tx, taskID); err != nil {
			return err
		}
		if wasPending && t.WakeOnCompletion {
			if err := completionWake(tx, wakeID, t, at); err != nil {
				return err
			}
		}
		out = taskSnapshot(t)
		return nil
	})
	return result(out, derr, err)
}

func completionWake(tx txn, id string, t *projection.Task, at int64) error {
	return tx.append(&events.WakeRecorded{
		Header: events.Header{SessionID: t.SessionID, At: at},
		WakeID: id, Reason: events.WakeTaskFinished, TaskID: t.ID, Outcome: t.Outcome,
	})
}

func (b *logBackend) ClaimDue(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return nil, verr
	}
	expires, verr := leaseExpiry(at, leaseFor)
	if verr != nil {
		return nil, verr
	}
	var out []TaskDelivery
	err := b.eng.update(ctx, func(tx txn) error {
		out = out[:0]
		ids, err := collect(tx.ScanDue, at, limit)
		if err != nil {
			return err
		}
		for _, id := range ids {
			t, err := mustTask(tx, id)
			if err != nil {
				return err
			}
			token, err := b.ids.token("lease")
			if err != nil {
				return err
			}
			ev := &events.TaskClaimed{
				Header: events.Header{SessionID: t.SessionID, At: at},
				TaskID: id, Attempt: t.Attempts + 1, LeaseToken: token, LeaseExpiresAt: expires,
			}
			if err := tx.append(ev); err != nil {
				return err
			}
			if t, err = mustTask(tx, id); err != nil {
				return err
			}
			out = append(out, NewTaskDelivery(taskSnapshot(t), ev.Attempt, fromNanos(expires), token))
		}
		return nil
	})
	if err != nil {
		return nil, backendErr(err)
	}
	return out, nil
}

// collect gathers up to limit ids from an eligibility index before any claim moves them.
func collect(scan func(int64, func(projection.IndexEntry) bool) error, at int64, limit int) ([]string, error) {
	var ids []string
	err := scan(at, func(e projection.IndexEntry) bool {
		ids = append(ids, e.ID)
		return len(ids) < limit
	})
	return ids, err
}

// rejectReason classifies a stale settlement for the audit record, and reports whether one
// may be recorded: at most one per presented attempt, in increasing attempt order, so a task
// never carries more rejection records than claims.
func rejectReason(claimed bool, attempts, recorded, presented uint32) (events.RejectReason, bool) {
	if presented == 0 || presented > attempts || presented <= recorded {
		return 0, false
	}
	switch {
	case !claimed:
		return events.RejectNotClaimed, true
	case presented < attempts:
		return events.RejectSuperseded, true
	default:
		return events.RejectTokenMismatch, true
	}
}

func (b *logBackend) Finish(ctx context.Context, d TaskDelivery, o Outcome, now time.Time) (Task, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	eo := outcomeTo(o)
	token := d.LeaseToken()
	var out Task
	var derr error
	// A completion wake may be recorded: its id is drawn before the command is queued.
	wakeID, idErr := b.ids.id("wake", at)
	if idErr != nil {
		return Task{}, backendErr(idErr)
	}
	err := b.eng.update(ctx, func(tx txn) error {
		t, err := tx.Task(d.Task.ID)
		if err != nil {
			return err
		}
		if t == nil {
			derr = notFound(d.Task.ID)
			return nil
		}
		if t.SettledToken != "" && t.SettledToken == token {
			if !sameOutcome(t.Outcome, eo) {
				derr = badTransition("the delivery was already settled with a different outcome")
				return nil
			}
			out = taskSnapshot(t)
			return nil
		}
		if t.State != events.StateRunning || t.Attempts != d.Attempt || t.LeaseToken != token {
			derr = stale(t.ID)
			reason, ok := rejectReason(t.State == events.StateRunning, t.Attempts, t.RejectedAttempt, d.Attempt)
			if !ok {
				return nil
			}
			return tx.append(&events.TaskSettleRejected{
				Header: events.Header{SessionID: t.SessionID, At: at},
				TaskID: t.ID, Attempt: d.Attempt, Reason: reason,
			})
		}
		ev := &events.TaskSettled{
			Header: events.Header{SessionID: t.SessionID, At: at},
			TaskID: t.ID, Attempt: d.Attempt, LeaseToken: token, Outcome: eo,
		}
		if err := tx.append(ev); err != nil {
			return err
		}
		if t, err = mustTask(tx, t.ID); err != nil {
			return err
		}
		if t.WakeOnCompletion {
			if err := completionWake(tx, wakeID, t, at); err != nil {
				return err
			}
		}
		out = taskSnapshot(t)
		return nil
	})
	return result(out, derr, err)
}

func (b *logBackend) RequestWake(ctx context.Context, sessionID string, r WakeRequest, now time.Time) (Wake, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Wake{}, verr
	}
	payload := ownJSON(r.Payload)
	var out Wake
	var derr error
	newID, idErr := b.ids.id("wake", at) // drawn off the writer; unused by a repeat
	if idErr != nil {
		return Wake{}, backendErr(idErr)
	}
	err := b.eng.update(ctx, func(tx txn) error {
		if r.IdempotencyKey != "" {
			id, err := tx.WakeKey(sessionID, r.IdempotencyKey)
			if err != nil {
				return err
			}
			if id != "" {
				w, err := mustWake(tx, id)
				if err != nil {
					return err
				}
				if !sameJSON(w.Payload, payload) {
					derr = conflict(r.IdempotencyKey)
					return nil
				}
				out = wakeSnapshot(w)
				return nil
			}
		}
		id := newID
		ev := &events.WakeRecorded{
			Header: events.Header{SessionID: sessionID, At: at},
			WakeID: id, Reason: events.WakeRequested, Payload: payload, IdempotencyKey: r.IdempotencyKey,
		}
		if err := tx.append(ev); err != nil {
			return err
		}
		w, err := mustWake(tx, id)
		if err != nil {
			return err
		}
		out = wakeSnapshot(w)
		return nil
	})
	return result(out, derr, err)
}

func (b *logBackend) ClaimWakes(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]WakeDelivery, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return nil, verr
	}
	expires, verr := leaseExpiry(at, leaseFor)
	if verr != nil {
		return nil, verr
	}
	var out []WakeDelivery
	err := b.eng.update(ctx, func(tx txn) error {
		out = out[:0]
		ids, err := collect(tx.ScanWakes, at, limit)
		if err != nil {
			return err
		}
		for _, id := range ids {
			w, err := mustWake(tx, id)
			if err != nil {
				return err
			}
			token, err := b.ids.token("wakelease")
			if err != nil {
				return err
			}
			ev := &events.WakeClaimed{
				Header: events.Header{SessionID: w.SessionID, At: at},
				WakeID: id, Attempt: w.Attempts + 1, LeaseToken: token, LeaseExpiresAt: expires,
			}
			if err := tx.append(ev); err != nil {
				return err
			}
			out = append(out, NewWakeDelivery(wakeSnapshot(w), ev.Attempt, fromNanos(expires), token))
		}
		return nil
	})
	if err != nil {
		return nil, backendErr(err)
	}
	return out, nil
}

// AckWake acknowledges with the wall-clock time: the Backend interface, like the seed, passes
// no time. Queue.AckWakeAt passes the caller's time to AckWakeAt instead.
func (b *logBackend) AckWake(ctx context.Context, d WakeDelivery) error {
	return b.AckWakeAt(ctx, d, b.clock())
}

func (b *logBackend) AckWakeAt(ctx context.Context, d WakeDelivery, now time.Time) error {
	at, verr := nanos("now", now)
	if verr != nil {
		return verr
	}
	token := d.LeaseToken()
	var derr error
	err := b.eng.update(ctx, func(tx txn) error {
		w, err := tx.Wake(d.Wake.ID)
		if err != nil {
			return err
		}
		if w == nil {
			derr = stale(d.Wake.ID)
			return nil
		}
		if w.Acked && w.AckedToken == token {
			return nil
		}
		if w.Acked || !w.Claimed() || w.Attempts != d.Attempt || w.LeaseToken != token {
			derr = stale(w.ID)
			reason, ok := rejectReason(!w.Acked && w.Claimed(), w.Attempts, w.RejectedAttempt, d.Attempt)
			if !ok {
				return nil
			}
			return tx.append(&events.WakeAckRejected{
				Header: events.Header{SessionID: w.SessionID, At: at},
				WakeID: w.ID, Attempt: d.Attempt, Reason: reason,
			})
		}
		return tx.append(&events.WakeAcked{
			Header: events.Header{SessionID: w.SessionID, At: at},
			WakeID: w.ID, Attempt: d.Attempt, LeaseToken: token,
		})
	})
	if err != nil {
		return backendErr(err)
	}
	return derr
}

func (b *logBackend) Close() error { return backendErr(b.eng.close()) }

// --- helpers ---

// errMissing reports a projection that lost a record it points to: an internal inconsistency.
var errMissing = errors.New("projection names a record that does not exist")

func mustTask(r projection.Reader, id string) (*projection.Task, error) {
	t, err := r.Task(id)
	if err == nil && t == nil {
		err = errors.Join(errMissing, errors.New("task "+id))
	}
	return t, err
}

func mustWake(r projection.Reader, id string) (*projection.Wake, error) {
	w, err := r.Wake(id)
	if err == nil && w == nil {
		err = errors.Join(errMissing, errors.New("wake "+id))
	}
	return w, err
}

func result[T any](out T, derr, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, backendErr(err)
	}
	if derr != nil {
		return zero, derr
	}
	return out, nil
}
