package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/work"
)

// Submit inside the application's transaction (docs/design.md §9 "Submit inside the
// application's transaction").
//
// SubmitTx writes one row into the queue schema's submit_inbox table and queues a
// notification, both in the application's transaction: nothing of the queue's writer, log
// head or tables is touched, so the application's transaction never waits on the queue. The
// row exists exactly when that transaction commits, and the notification is delivered only
// then. Each queue over the schema listens; its ingest loop (package work, inbox.go) takes rows
// inside a writer command (TakeInbox: DELETE ... FOR UPDATE SKIP LOCKED ... RETURNING) and
// decides each with Submit's rules in the same transaction, so a row is taken in exactly once,
// by one queue, atomically with its outcome. A row that does not decode (or breaks a rule
// when it is taken in) is moved to submit_inbox_rejects with the reason, in the same
// transaction: kept for an operator, logged, and listed by Verify; never dropped.

// inboxDDL creates the inbox tables when missing. Like commit_marks they came after format 1
// without changing it: Open (not OpenReadOnly) creates them, builds that do not know them
// ignore them, and they are not in tableNames. The session column is bytea, as every string
// column of the schema is (schema.go): Submit accepts any non-blank Go string as a session id,
// and text refuses NUL and invalid UTF-8 (SQLSTATE 22021), which aborted the application's
// transaction. Schemas made before hold text there: inboxBytea converts them.
const inboxDDL = `CREATE TABLE IF NOT EXISTS {s}.submit_inbox (id bigserial PRIMARY KEY, session bytea NOT NULL,
	request bytea NOT NULL, at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS {s}.submit_inbox_rejects (id bigint PRIMARY KEY, session bytea NOT NULL,
	request bytea NOT NULL, at timestamptz NOT NULL, error text NOT NULL, rejected_at timestamptz NOT NULL DEFAULT now())`

// inboxBytea converts the session columns of inbox tables made before they were bytea. The
// rows keep their values: a text value is the UTF-8 of a Go string, and convert_to gives back
// those bytes whatever the database's encoding. The check comes first, so an Open of a queue
// already converted takes no table lock (ALTER TABLE would, even when it changes nothing).
const inboxBytea = `ALTER TABLE {s}.submit_inbox ALTER COLUMN session TYPE bytea USING convert_to(session, 'UTF8');
ALTER TABLE {s}.submit_inbox_rejects ALTER COLUMN session TYPE bytea USING convert_to(session, 'UTF8')`

// inboxPayload is the payload of the notification SubmitTx queues on the queue's channel:
// the listener then wakes the ingest loop (an empty payload is a commit of the log).
const inboxPayload = "inbox"

func ensureInbox(ctx context.Context, tx pgx.Tx, schema string) error {
	sid := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, strings.ReplaceAll(inboxDDL, "{s}", sid)); err != nil {
		return fmt.Errorf("creating the submit inbox tables in schema %q: %w", schema, err)
	}
	var text int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname IN ('submit_inbox', 'submit_inbox_rejects') AND a.attname = 'session'
		AND NOT a.attisdropped AND a.atttypid <> 'bytea'::regtype`, schema).Scan(&text)
	if err != nil || text == 0 {
		return err
	}
	if _, err := tx.Exec(ctx, strings.ReplaceAll(inboxBytea, "{s}", sid)); err != nil {
		return fmt.Errorf("converting the submit inbox's session column to bytea in schema %q: %w", schema, err)
	}
	return nil
}

// inbox is an engine's side of the inbox.
type inbox struct {
	ready   chan struct{} // InboxReady
	mu      sync.RWMutex  // enc
	enc     engineapi.InboxEncoder
	ins     string // the INSERT and NOTIFY of SubmitTx, in one statement
	take    string // TakeInbox's DELETE ... RETURNING
	rej     string // the move of a row to submit_inbox_rejects
	rejRule string // the same, for a row that decodes but breaks a rule
	pending string // InboxPending's
}

func newInbox(schema string) *inbox {
	s := pgx.Identifier{schema}.Sanitize()
	return &inbox{
		ready: make(chan struct{}, 1),
		ins: `WITH r AS (INSERT INTO ` + s + `.submit_inbox (session, request) VALUES ($1, $2) RETURNING id)
			SELECT pg_notify($3, '` + inboxPayload + `') FROM r`,
		take: `DELETE FROM ` + s + `.submit_inbox WHERE id IN (SELECT id FROM ` + s + `.submit_inbox
			ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, session, request, at`,
		rej: `INSERT INTO ` + s + `.submit_inbox_rejects (id, session, request, at, error) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (id) DO NOTHING`,
		pending: `SELECT EXISTS (SELECT 1 FROM ` + s + `.submit_inbox)`,
		rejRule: `INSERT INTO ` + s + `.submit_inbox_rejects (id, session, request, at, error) VALUES ($1, $2, $3, now(), $4)
			ON CONFLICT (id) DO NOTHING`,
	}
}

var _ engineapi.Inbox = (*engine)(nil)

// SetInboxEncoder is engineapi.Inbox's: the queue's validation and encoding of a request.
func (e *engine) SetInboxEncoder(enc engineapi.InboxEncoder) {
	e.inbox.mu.Lock()
	e.inbox.enc = enc
	e.inbox.mu.Unlock()
}

// InboxReady receives a value after a SubmitTx of any process committed, and when the
// listener (re)connects (it may have missed some).
func (e *engine) InboxReady() <-chan struct{} { return e.inbox.ready }

func (e *engine) signalInbox() {
	select {
	case e.inbox.ready <- struct{}{}:
	default:
	}
}

// InboxPending reads whether submit_inbox holds a row, on a connection of the pool (not the
// writer's).
func (e *engine) InboxPending(ctx context.Context) (bool, error) {
	if e.isClosed() {
		return false, errClosed()
	}
	ctx, stop := e.untilClose(ctx)
	defer stop()
	// A read that changes nothing: on a pooled connection found dead it is asked again on
	// another (deadconn.go). The take-in loop asks with a context that lasts until Close, so
	// the read is bounded as a read of the log is (readStuckWait): on a pooled connection
	// whose server process stopped with the socket open, it would wait forever, and no
	// SubmitTx would be taken in again. Its error makes the loop ask again after a wait, on
	// another connection (pgx closed this one).
	rctx, cancel := context.WithTimeout(ctx, e.readStuck())
	defer cancel()
	var ok bool
	err := queryRow(rctx, e, e.inbox.pending, nil, &ok)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		err = fmt.Errorf("postgres: the submit inbox's check got no answer in %v: %w", e.readStuck(), rctx.Err())
	}
	return ok, err
}

// TakeInbox deletes up to n rows no other transaction holds, oldest first, in the writer's
// transaction, and returns those that decode; the others are moved to submit_inbox_rejects.
func (e *engine) TakeInbox(etx engineapi.Txn, n int) ([]engineapi.InboxEntry, error) {
	t, ok := etx.(*txn)
	if !ok {
		return nil, fmt.Errorf("postgres: TakeInbox called with a %T, not this engine's transaction", etx)
	}
	rows, err := t.conn.Query(t.ctx, e.inbox.take, n)
	if err != nil {
		return nil, err
	}
	type raw struct {
		id      int64
		session []byte
		req     []byte
		at      time.Time
	}
	var got []raw
	for rows.Next() {
		var r raw
		if err := rows.Scan(&r.id, &r.session, &r.req, &r.at); err != nil {
			rows.Close()
			return nil, err
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	t.sideWrites = t.sideWrites || len(got) > 0 // the rows are deleted: the group must commit
	out := make([]engineapi.InboxEntry, 0, len(got))
	for _, r := range got {
		ev, derr := events.Decode(r.req, 0)
		var sub *events.TaskSubmitted
		if derr == nil {
			if sub, ok = ev.(*events.TaskSubmitted); !ok {
				derr = fmt.Errorf("holds a %s event, not task_submitted", ev.Type())
			} else if sub.SessionID != string(r.session) {
				derr = fmt.Errorf("its request names session %q, the row %q", sub.SessionID, r.session)
			}
		}
		if derr != nil {
			rerr := fmt.Errorf("%w: submit_inbox row %d (session %q): %w", ErrCorruptRow, r.id, string(r.session), derr)
			if _, err := t.conn.Exec(t.ctx, e.inbox.rej, r.id, r.session, r.req, r.at, rerr.Error()); err != nil {
				return nil, err
			}
			e.logger().Error("worklog: a submit_inbox row does not decode; moved to submit_inbox_rejects", "err", rerr)
			continue
		}
		out = append(out, engineapi.InboxEntry{Row: r.id, Submitted: sub})
	}
	return out, nil
}

// RejectInbox moves a taken row that breaks a rule to submit_inbox_rejects, in tx.
func (e *engine) RejectInbox(etx engineapi.Txn, en engineapi.InboxEntry, reason error) error {
	t, ok := etx.(*txn)
	if !ok {
		return fmt.Errorf("postgres: RejectInbox called with a %T, not this engine's transaction", etx)
	}
	body, err := events.Encode(en.Submitted)
	if err != nil {
		return err
	}
	rerr := fmt.Errorf("submit_inbox row %d (session %q) cannot be taken in: %w", en.Row, en.Submitted.SessionID, reason)
	if _, err := t.conn.Exec(t.ctx, e.inbox.rejRule, en.Row, []byte(en.Submitted.SessionID), body, rerr.Error()); err != nil {
		return err
	}
	t.sideWrites = true
	e.logger().Error("worklog: a submit_inbox row breaks a rule; moved to submit_inbox_rejects", "err", rerr)
	return nil
}

func (e *engine) logger() *slog.Logger {
	if e.opts.Logger != nil {
		return e.opts.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// inboxProblems lists the rows of submit_inbox_rejects, for Verify.
func (e *engine) inboxProblems(ctx context.Context, tx pgx.Tx) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT error FROM `+pgx.Identifier{e.schema}.Sanitize()+`.submit_inbox_rejects ORDER BY id`)
	if err != nil {
		if isUndefinedTable(err) {
			return nil, nil
		}
		return nil, err
	}
	msgs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for i, m := range msgs {
		msgs[i] = "submit_inbox_rejects: " + m + " (kept for an operator: fix and re-submit, then delete the row)"
	}
	return msgs, nil
}

// queues maps each open queue of Open to its engine, for SubmitTx; Close removes it.
var queues sync.Map // *work.Queue → *engine

// SubmitTx submits r for sessionID inside the application's transaction tx, on the database
// of q, a queue from Open: the submission exists if and only if tx commits. r.IdempotencyKey
// is required (ErrInvalidRequest naming idempotency_key), and every other rule of Submit is
// checked before anything is written, with the same *work.Error. SubmitTx writes one row into
// the queue schema's submit_inbox table and queues a notification, both in tx: it never waits
// on the queue's writer or log head, whatever the queue is doing.
//
// After the commit, a queue on the schema (of this process or another) takes the submission
// in, in the background, with Submit's rules at that time and the server's clock: a new task;
// for a key that already names a task of the session with the same intent, that task
// (nothing new); with another intent, no task, and a task_submit_rejected event in the log
// (replay shows it). Session.TaskByKey finds the result. A submission committed while no
// queue runs is taken in by the next Open.
//
// q not from Open (or closed) is an error, and so is a tx on a database without q's schema.
func SubmitTx(ctx context.Context, tx pgx.Tx, q *work.Queue, sessionID string, r work.TaskRequest) error {
	if tx == nil {
		return &work.Error{Kind: work.ErrInvalidRequest, Field: "tx", Message: "must be the application's open transaction"}
	}
	v, ok := queues.Load(q)
	if !ok || q == nil {
		return &work.Error{Kind: work.ErrInvalidRequest, Field: "queue",
			Message: "is not an open queue from postgres.Open (a closed one, or another backend's)"}
	}
	e := v.(*engine)
	if e.isClosed() {
		return work.NewBackendError(errClosed())
	}
	e.inbox.mu.RLock()
	enc := e.inbox.enc
	e.inbox.mu.RUnlock()
	if enc == nil {
		return work.NewBackendError(errors.New("postgres: SubmitTx: the queue has no inbox encoder"))
	}
	body, err := enc(sessionID, &r)
	if err != nil {
		return err // the *work.Error Submit would return, before anything is written
	}
	if _, err := tx.Exec(ctx, e.inbox.ins, []byte(sessionID), body, e.channel); err != nil {
		if isUndefinedTable(err) {
			return work.NewBackendError(fmt.Errorf("postgres: SubmitTx: the transaction's database has no queue in schema %q "+
				"(tx must be on the queue's database): %w", e.schema, err))
		}
		return work.NewBackendError(backendError(err))
	}
	return nil
}
