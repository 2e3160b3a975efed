package work

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
)

// The inbox: submissions committed by another transaction (postgres.SubmitTx, in the
// application's own transaction). docs/postgres.md "Submit inside the application's
// transaction".
//
// SubmitTx has the queue decide a submission as Submit decides a new task (encodeInbox: its
// id, its time, its task_submitted event; the answer when its key names a task), and the
// engine takes the decided event into the log itself. Rows an older build committed hold the
// request undecided (inboxEvent, TaskID and At placeholders): the ingest loop decides them
// when taken in, with Submit's rules at that time.

// inboxTaskID is the placeholder task id of an inbox row's event (the event codec requires a
// subject); never the id of a task.
const inboxTaskID = "inbox"

// inboxBatch is how many rows one ingest command takes.
const inboxBatch = 128

// inboxEvent is the task_submitted event an inbox row holds for r. Every field of
// TaskRequest goes into it, and requestOf reads each back (TestInboxRequestRoundTrip fails
// when a field is added to one and not the other).
func inboxEvent(sessionID string, r *TaskRequest, runAt int64) *events.TaskSubmitted {
	return &events.TaskSubmitted{
		Header: events.Header{Seq: 1, SessionID: sessionID},
		TaskID: inboxTaskID, Kind: r.Kind, Input: jsonOrNull(r.Input),
		HasRunAt: !r.RunAt.IsZero(), RunAt: runAt,
		IdempotencyKey: r.IdempotencyKey, WakeOnCompletion: r.Wake == WakeOnCompletion,
		Priority: int64(r.Priority), Headers: cloneHeaders(r.Headers),
	}
}

// requestOf is the request an inbox row's event holds: inboxEvent's inverse.
func requestOf(e *events.TaskSubmitted) TaskRequest {
	r := TaskRequest{Kind: e.Kind, Input: e.Input, IdempotencyKey: e.IdempotencyKey,
		Priority: int(e.Priority), Headers: cloneHeaders(e.Headers)}
	if e.HasRunAt {
		r.RunAt = time.Unix(0, e.RunAt).UTC()
	}
	if e.WakeOnCompletion {
		r.Wake = WakeOnCompletion
	}
	return r
}

// encodeInbox is the engine's InboxEncoder: Submit's validation (before anything is
// written), then the submission decided as Submit decides a new task, at the queue's clock's
// time: its id drawn, its task_submitted event (Seq a placeholder: the engine numbers it when
// it takes it into the log), the task it is, and the answer when its key already names one.
func (b *logBackend) encodeInbox(sessionID string, request any) (*engineapi.InboxSubmission, error) {
	r, ok := request.(*TaskRequest)
	if !ok {
		return nil, backendErr(fmt.Errorf("inbox: request is %T, not *work.TaskRequest", request))
	}
	if err := validateNonBlank("session_id", sessionID); err != nil {
		return nil, err
	}
	if err := validateTaskRequest(r, b.maxValue); err != nil {
		return nil, err
	}
	at, verr := nanos("now", b.clock())
	if verr != nil {
		return nil, verr
	}
	p, perr := b.prepareSubmit(r, at)
	if perr != nil {
		return nil, perr
	}
	ev := inboxEvent(sessionID, r, p.runAt)
	ev.TaskID, ev.At = p.newID, at
	body, err := events.Encode(ev)
	if err != nil {
		return nil, backendErr(err)
	}
	return &engineapi.InboxSubmission{
		Event: ev, Body: body,
		Task: b.taskSnapshot(projection.SubmittedTask(ev)),
		Existing: func(t *projection.Task) (any, error) {
			if field := taskRequestDiffers(t, r, p.runAt); field != "" {
				return nil, conflict(r.IdempotencyKey, field, t.ID)
			}
			return b.taskSnapshot(t), nil
		},
	}, nil
}

// startInbox starts the ingest loop of an engine with an inbox; the returned function stops
// it and waits for it (Queue.Close, before the engine closes).
func (b *logBackend) startInbox(logger *slog.Logger) (stop func()) {
	in := b.caps.inbox
	in.SetInboxEncoder(b.encodeInbox)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		retry := time.Duration(0) // after a failed pass: try again without a notification
		for {
			var timer <-chan time.Time
			if retry > 0 {
				timer = time.After(retry)
			}
			select {
			case <-ctx.Done():
				return
			case <-in.InboxReady():
			case <-timer:
			}
			if err := b.ingestAll(ctx); err != nil {
				if ctx.Err() != nil || errors.Is(err, ErrClosed) {
					return
				}
				retry = min(max(2*retry, 50*time.Millisecond), 5*time.Second)
				logger.Error("worklog: taking in the submit inbox failed; retrying", "err", err, "retry_in", retry)
				continue
			}
			retry = 0
		}
	}()
	return func() { cancel(); <-done }
}

// ingestAll takes in every row it finds, one command per inboxBatch rows.
func (b *logBackend) ingestAll(ctx context.Context) error {
	if pending, err := b.caps.inbox.InboxPending(ctx); err != nil || !pending {
		return err
	}
	for {
		n, err := b.ingest(ctx, inboxBatch)
		if err != nil || n < inboxBatch {
			return err
		}
	}
}

// ingest takes up to limit rows in one command: each is decided with Submit's rules at the
// queue's clock's time (a new task; nothing for a repeat of the same intent; a
// task_submit_rejected audit for another intent) and deleted in the same transaction, so it
// is taken in exactly once. It returns how many rows it took (rows moved aside included).
func (b *logBackend) ingest(ctx context.Context, limit int) (int, error) {
	at, verr := nanos("now", b.clock())
	if verr != nil {
		return 0, verr
	}
	// The ids are drawn as rows are found, and kept for a re-run of fn: an empty take (the
	// pass at start, a spurious notification) draws none, so a queue's ids are the same with
	// or without an inbox (Options.Entropy makes them reproducible).
	var ids []string
	var taken int
	err := b.update(ctx, func(tx txn) error {
		taken = 0 // fn may run twice (engine.update)
		rows, err := b.caps.inbox.TakeInbox(engineTxn(tx), limit)
		if err != nil {
			return err
		}
		taken = len(rows)
		for i, row := range rows {
			if i == len(ids) {
				id, err := b.ids.id("task", at)
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			if err := b.takeIn(tx, row, ids[i], at); err != nil {
				return err
			}
		}
		return nil
	})
	return taken, err
}

// takeIn decides one row inside the ingest command.
func (b *logBackend) takeIn(tx txn, row engineapi.InboxEntry, newID string, at int64) error {
	e := row.Submitted
	r := requestOf(e)
	if e.IdempotencyKey == "" {
		return b.caps.inbox.RejectInbox(engineTxn(tx), row, invalid("idempotency_key", "is required"))
	}
	if verr := validateTaskRequest(&r, b.maxValue); verr != nil {
		return b.caps.inbox.RejectInbox(engineTxn(tx), row, verr)
	}
	id, err := tx.TaskKey(e.SessionID, e.IdempotencyKey)
	if err != nil {
		return err
	}
	if id != "" {
		t, err := mustTask(tx, id)
		if err != nil {
			return err
		}
		field := taskRequestDiffers(t, &r, e.RunAt)
		if field == "" {
			return nil // the same intent: the existing task is the answer
		}
		return tx.Append(&events.TaskSubmitRejected{
			Header: events.Header{SessionID: e.SessionID, At: at},
			TaskID: id, IdempotencyKey: e.IdempotencyKey, Field: field, Kind: e.Kind,
		})
	}
	ev := *e // the row's event is the engine's to give; the task gets its own copy
	ev.Header = events.Header{SessionID: e.SessionID, At: at}
	ev.TaskID = newID
	return tx.Append(&ev)
}

// engineTxn is the engine's own transaction under the decide code's (update wraps it to
// signal the waiters), for the engine's optional interfaces: its inbox methods run
// statements on it, and its key prefetchers (schedules.go, submitmany.go) read with it.
func engineTxn(tx txn) txn {
	if w, ok := tx.(*watchCall); ok {
		return w.txn
	}
	return tx
}
