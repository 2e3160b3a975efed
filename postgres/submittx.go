package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// Submit inside the application's transaction, synchronously (docs/postgres.md "Submit
// inside the application's transaction").
//
// SubmitTx decides the submission in the application's transaction, as Submit would decide it
// at the commit: a keyed one inserts its key's row into task_keys (ON CONFLICT DO NOTHING: the
// one unique index both Submit and SubmitTx go through), and a key that names a task already
// is answered from that task; a new one is stored as a decided submit_inbox row (the
// task_submitted event, its id and time drawn) and, when a listener would hear it, a
// notification, both in tx. Nothing of the queue's writer or log head is touched. The
// writer takes every decided row into the log, in the group that first runs after the row's
// commit (begin: under the log head's lock, before the group's commands), and a group run
// before the lock (fast.go) commits only while the inbox holds none; a read (View) that finds
// one asks the writer to take it in first. So from the commit every claim and every read of a
// queue sees the task.

// inboxDDL creates the inbox tables when missing. Like commit_marks they came after format 1
// without changing it: Open (not OpenReadOnly) creates them, builds that do not know them
// ignore them, and they are not in tableNames. The session column is bytea, as every string
// column of the schema is (schema.go): Submit accepts any non-blank Go string as a session id,
// and text refuses NUL and invalid UTF-8 (SQLSTATE 22021), which aborted the application's
// transaction. Schemas made before hold text there: inboxBytea converts them. task_id is the
// task of a decided row (NULL: an older build's row, decided when taken in); inboxDecided
// adds it to a table made before.
const inboxDDL = `CREATE TABLE IF NOT EXISTS {s}.submit_inbox (id bigserial PRIMARY KEY, session bytea NOT NULL,
	request bytea NOT NULL, at timestamptz NOT NULL DEFAULT now(), task_id bytea UNIQUE);
CREATE TABLE IF NOT EXISTS {s}.submit_inbox_rejects (id bigint PRIMARY KEY, session bytea NOT NULL,
	request bytea NOT NULL, at timestamptz NOT NULL, error text NOT NULL, rejected_at timestamptz NOT NULL DEFAULT now())`

// inboxDecided adds the task_id column to an inbox table made before SubmitTx decided its
// submissions; the rows waiting keep NULL there and are decided when taken in, as before.
const inboxDecided = `ALTER TABLE {s}.submit_inbox ADD COLUMN task_id bytea UNIQUE`

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
	var decided int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = 'submit_inbox' AND a.attname = 'task_id' AND NOT a.attisdropped`,
		schema).Scan(&decided); err != nil {
		return err
	}
	if decided == 0 {
		if _, err := tx.Exec(ctx, strings.ReplaceAll(inboxDecided, "{s}", sid)); err != nil {
			return fmt.Errorf("adding task_id to the submit inbox in schema %q: %w", schema, err)
		}
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
	ins     string // SubmitTx's INSERT (and NOTIFY, inboxListened) of a submission without a key
	insKey  string // the same with its key's row first: nothing when the key is taken
	keyed   string // the task a taken key names: in the log (tasks) or decided (submit_inbox)
	waiting string // whether a decided row waits: a statement's snapshot, after the log head's lock
	takeDec string // the writer's take of the decided rows
	take    string // TakeInbox's DELETE ... RETURNING of an older build's undecided rows
	rej     string // the move of a row to submit_inbox_rejects
	rejRule string // the same, for a row that decodes but breaks a rule
	pending string // InboxPending's
	// awaitKeys' insert of the keys a group could not insert (keyBusyError)
	awaitKeys string
}

// inboxListened is whether a listener registered on the queue's channel holds a listener key
// (listeners.go): SubmitTx notifies only then (docs/postgres.md "Submit inside the
// application's transaction", 4). Every registered listener holds listener key 0 or 1 (a
// watcher holds every key but its slot's, a follower every key), so a listener holds one of
// them exactly when an exclusive try on one fails. The try is a session lock let go in the
// same expression, not a transaction lock: held until the application's transaction ended, it
// would make the concurrent SubmitTx calls' tries fail (and notify) and a listener's
// registration wait for the application. A try fails also for a moment while a writer group
// of the process owning slot 0 or 1 holds its key, or another SubmitTx tries: a NOTIFY then
// that no one needed. {k} is the parameter holding listener key 0.
const inboxListened = `(CASE WHEN pg_try_advisory_lock({k}::bigint) THEN NOT pg_advisory_unlock({k}::bigint) ELSE true END
	OR CASE WHEN pg_try_advisory_lock({k}::bigint + 1) THEN NOT pg_advisory_unlock({k}::bigint + 1) ELSE true END)`

// inboxWaiting is the condition that a decided submission waits in the inbox.
const inboxWaiting = `EXISTS (SELECT 1 FROM {s}.submit_inbox WHERE task_id IS NOT NULL)`

// takeDecidedMax is how many decided rows one statement of the writer's take-in deletes; it
// takes again until a statement finds fewer.
const takeDecidedMax = 1024

func newInbox(schema string) *inbox {
	s := pgx.Identifier{schema}.Sanitize()
	q := func(f string) string { return strings.ReplaceAll(f, "{s}", s) }
	// One row per row inserted (insKey's caller reads RowsAffected), the NOTIFY only when a
	// listener is registered (inboxListened).
	notify := func(key string) string {
		return `SELECT CASE WHEN ` + strings.ReplaceAll(inboxListened, "{k}", key) + ` THEN pg_notify($4, '` + inboxPayload + `') END FROM r`
	}
	return &inbox{
		ready: make(chan struct{}, 1),
		ins: q(`WITH r AS (INSERT INTO {s}.submit_inbox (session, request, task_id) VALUES ($1, $2, $3) RETURNING id) ` +
			notify("$5")),
		// ON CONFLICT DO NOTHING: a taken key inserts nothing and raises nothing (the
		// application's transaction goes on); a key being inserted by a transaction still
		// open is waited for, as any unique insert waits, and then taken or free.
		insKey: q(`WITH k AS (INSERT INTO {s}.task_keys (session, key, task_id) VALUES ($1, $5, $3)
			ON CONFLICT DO NOTHING RETURNING task_id),
			r AS (INSERT INTO {s}.submit_inbox (session, request, task_id) SELECT $1, $2, task_id FROM k RETURNING id) ` +
			notify("$6")),
		keyed: q(`SELECT k.task_id, t.rec, t.input, i.request FROM {s}.task_keys k
			LEFT JOIN {s}.tasks t ON t.id = k.task_id LEFT JOIN {s}.submit_inbox i ON i.task_id = k.task_id
			WHERE k.session = $1 AND k.key = $2`),
		waiting: q(`SELECT ` + inboxWaiting),
		takeDec: q(`DELETE FROM {s}.submit_inbox WHERE id IN (SELECT id FROM {s}.submit_inbox WHERE task_id IS NOT NULL
			ORDER BY id LIMIT $1) RETURNING id, session, request, at`),
		take: q(`DELETE FROM {s}.submit_inbox WHERE id IN (SELECT id FROM {s}.submit_inbox WHERE task_id IS NULL
			ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, session, request, at`),
		rej: q(`INSERT INTO {s}.submit_inbox_rejects (id, session, request, at, error) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (id) DO NOTHING`),
		pending: q(`SELECT EXISTS (SELECT 1 FROM {s}.submit_inbox)`),
		awaitKeys: q(`INSERT INTO {s}.task_keys SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[])
			ON CONFLICT DO NOTHING`),
		rejRule: q(`INSERT INTO {s}.submit_inbox_rejects (id, session, request, at, error) VALUES ($1, $2, $3, now(), $4)
			ON CONFLICT (id) DO NOTHING`),
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

// inboxRow is a row as taken from submit_inbox.
type inboxRow struct {
	id      int64
	session []byte
	req     []byte
	at      time.Time
}

// takeRows runs one of the inbox's DELETE ... RETURNING statements in t.
func (e *engine) takeRows(t *txn, sql string, n int) ([]inboxRow, error) {
	rows, err := t.conn.Query(t.ctx, sql, n)
	if err != nil {
		return nil, err
	}
	var got []inboxRow
	for rows.Next() {
		var r inboxRow
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
	return got, nil
}

// submitted decodes a taken row's event; one that does not decode (or is not its session's
// task_submitted, or decided is not what the row says) is moved to submit_inbox_rejects in t,
// and nil returned.
func (e *engine) submitted(t *txn, r inboxRow, decided bool) (*events.TaskSubmitted, error) {
	ev, derr := events.Decode(r.req, 0)
	var sub *events.TaskSubmitted
	if derr == nil {
		var ok bool
		if sub, ok = ev.(*events.TaskSubmitted); !ok {
			derr = fmt.Errorf("holds a %s event, not task_submitted", ev.Type())
		} else if sub.SessionID != string(r.session) {
			derr = fmt.Errorf("its request names session %q, the row %q", sub.SessionID, r.session)
		} else if decided == (sub.TaskID == "" || sub.TaskID == inboxTaskID) {
			derr = fmt.Errorf("its event names task %q", sub.TaskID)
		}
	}
	if derr == nil {
		return sub, nil
	}
	rerr := fmt.Errorf("%w: submit_inbox row %d (session %q): %w", ErrCorruptRow, r.id, string(r.session), derr)
	if _, err := t.conn.Exec(t.ctx, e.inbox.rej, r.id, r.session, r.req, r.at, rerr.Error()); err != nil {
		return nil, err
	}
	e.logger().Error("worklog: a submit_inbox row does not decode; moved to submit_inbox_rejects", "err", rerr)
	return nil, nil
}

// inboxTaskID is the placeholder task id of an older build's undecided row (work's).
const inboxTaskID = "inbox"

// takeDecided appends the task_submitted event of every decided row committed before its
// statement, oldest row first, in t: under the log head's lock (begin found one waiting),
// before the group's commands, so they read and claim the tasks as every later group does.
// The rows are deleted in t: they are gone exactly when their events commit.
func (e *engine) takeDecided(t *txn) error {
	for {
		got, err := e.takeRows(t, e.inbox.takeDec, takeDecidedMax)
		if err != nil {
			return err
		}
		for _, r := range got {
			sub, err := e.submitted(t, r, true)
			if err != nil {
				return err
			}
			if sub == nil {
				continue
			}
			if err := e.appendDecided(t, r, sub); err != nil {
				return err
			}
		}
		if len(got) < takeDecidedMax {
			return nil
		}
	}
}

// appendDecided appends a decided submission's event. Its key's row is already stored (the
// reservation SubmitTx inserted, naming this task): the fold's rule reads the key as absent
// (set in the cache), and its PutTaskKey queues no insert (txn.reserved). A fold that
// refuses the event (it cannot, but for a damaged row) moves the row aside and frees the key.
func (e *engine) appendDecided(t *txn, r inboxRow, sub *events.TaskSubmitted) error {
	k := skey{sub.SessionID, sub.IdempotencyKey}
	if sub.IdempotencyKey != "" {
		t.undo.key(t.c, false, k)
		t.c.taskKeys[k] = ""
		if t.reserved == nil {
			t.reserved = map[skey]string{}
		}
		t.reserved[k] = sub.TaskID
	}
	sub.Seq = 0 // Append numbers it
	err := t.Append(sub)
	var ae *projection.ApplyError
	if !errors.As(err, &ae) {
		t.tookIn = t.tookIn || err == nil
		return err
	}
	delete(t.reserved, k)
	rerr := fmt.Errorf("%w: submit_inbox row %d (session %q, task %s): %w", ErrCorruptRow, r.id, string(r.session), sub.TaskID, err)
	if _, err := t.conn.Exec(t.ctx, e.inbox.rej, r.id, r.session, r.req, r.at, rerr.Error()); err != nil {
		return err
	}
	if sub.IdempotencyKey != "" {
		if _, err := t.conn.Exec(t.ctx, e.st.delTaskKeys, [][]byte{[]byte(k.session)}, [][]byte{[]byte(k.key)}); err != nil {
			return err
		}
		delete(t.c.taskKeys, k)
	}
	e.logger().Error("worklog: a decided submit_inbox row cannot be taken in; moved to submit_inbox_rejects", "err", rerr)
	return nil
}

// TakeInbox takes the decided rows in (when begin did not: a row committed since), then
// deletes up to n undecided rows (an older build's) no other transaction holds, oldest first,
// in the writer's transaction, and returns those that decode; the others are moved to
// submit_inbox_rejects.
func (e *engine) TakeInbox(etx engineapi.Txn, n int) ([]engineapi.InboxEntry, error) {
	t, ok := etx.(*txn)
	if !ok {
		return nil, fmt.Errorf("postgres: TakeInbox called with a %T, not this engine's transaction", etx)
	}
	if t.optimistic {
		return nil, t.refuseRead() // under the lock only (fast.go)
	}
	if err := e.takeDecided(t); err != nil {
		return nil, err
	}
	got, err := e.takeRows(t, e.inbox.take, n)
	if err != nil {
		return nil, err
	}
	out := make([]engineapi.InboxEntry, 0, len(got))
	for _, r := range got {
		sub, err := e.submitted(t, r, false)
		if err != nil {
			return nil, err
		}
		if sub != nil {
			out = append(out, engineapi.InboxEntry{Row: r.id, Submitted: sub})
		}
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
// of q, a queue from Open, and answers what Submit would answer at tx's commit: a new pending
// task with its id; for an idempotency key that already names a task of the session with the
// same intent, that task; for another intent, ErrIdempotencyConflict (tx goes on: the caller
// may roll back). The task exists if and only if tx commits; from the commit every reader of
// the queue, in any process, sees it, and a claim takes it in order once it is due. Its
// task_submitted event enters the log after the commit, at a sequence after every event a
// reader could have seen before it.
//
// The key is optional. Every rule of Submit is checked before anything is written, with the
// same *work.Error, and a refused request leaves tx as it was. SubmitTx never waits on the
// queue's writer or log head; it waits only where any unique insert would: on another
// transaction inserting the same session and key, until that one ends. In a REPEATABLE READ
// or SERIALIZABLE tx, a key committed by another transaction after tx's snapshot is a
// serialization failure (SQLSTATE 40001), as PostgreSQL answers any such insert.
//
// q not from Open (or closed) is an error, and so is a tx on a database without q's schema.
func SubmitTx(ctx context.Context, tx pgx.Tx, q *work.Queue, sessionID string, r work.TaskRequest) (work.Task, error) {
	if tx == nil {
		return work.Task{}, &work.Error{Kind: work.ErrInvalidRequest, Field: "tx", Message: "must be the application's open transaction"}
	}
	v, ok := queues.Load(q)
	if !ok || q == nil {
		return work.Task{}, &work.Error{Kind: work.ErrInvalidRequest, Field: "queue",
			Message: "is not an open queue from postgres.Open (a closed one, or another backend's)"}
	}
	e := v.(*engine)
	if e.isClosed() {
		return work.Task{}, work.NewBackendError(errClosed())
	}
	e.inbox.mu.RLock()
	enc := e.inbox.enc
	e.inbox.mu.RUnlock()
	if enc == nil {
		return work.Task{}, work.NewBackendError(errors.New("postgres: SubmitTx: the queue has no inbox encoder"))
	}
	sub, err := enc(sessionID, &r)
	if err != nil {
		return work.Task{}, err // the *work.Error Submit would return, before anything is written
	}
	fail := func(err error) (work.Task, error) {
		if isUndefinedTable(err) {
			err = fmt.Errorf("postgres: SubmitTx: the transaction's database has no queue in schema %q "+
				"(tx must be on the queue's database): %w", e.schema, err)
		}
		return work.Task{}, work.NewBackendError(backendError(err))
	}
	session, id := []byte(sessionID), []byte(sub.Event.TaskID)
	if r.IdempotencyKey == "" {
		if _, err := tx.Exec(ctx, e.inbox.ins, session, sub.Body, id, e.channel, e.listenKeys.listen); err != nil {
			return fail(err)
		}
		return sub.Task.(work.Task), nil
	}
	// The key's row, or the task it names. A key found taken whose task is gone by the next
	// statement (pruned meanwhile, with its key) is free again: try again.
	for range 3 {
		tag, err := tx.Exec(ctx, e.inbox.insKey, session, sub.Body, id, e.channel, []byte(r.IdempotencyKey), e.listenKeys.listen)
		if err != nil {
			return fail(err)
		}
		if tag.RowsAffected() == 1 {
			return sub.Task.(work.Task), nil
		}
		var named, req []byte
		var row storedRow
		row.cols = make([][]byte, taskTable.cols)
		dest := []any{&named, &row.rec}
		for i := range row.cols {
			dest = append(dest, &row.cols[i])
		}
		err = tx.QueryRow(ctx, e.inbox.keyed, session, []byte(r.IdempotencyKey)).Scan(append(dest, &req)...)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return fail(err)
		}
		var t *projection.Task
		switch {
		case row.rec != nil:
			t, err = taskTable.decodeRow(string(named), row)
		case req != nil: // decided by a SubmitTx, not yet in the log
			var ev events.Event
			if ev, err = events.Decode(req, 0); err == nil {
				if s, ok := ev.(*events.TaskSubmitted); ok && s.TaskID == string(named) {
					t = projection.SubmittedTask(s)
				} else {
					err = fmt.Errorf("its submit_inbox row holds %s", ev.Type())
				}
			}
		default:
			err = errors.New("names no task, in the log or the inbox")
		}
		if err != nil {
			return fail(fmt.Errorf("%w: task_keys (%q, %q) → %s: %w", ErrCorruptRow, sessionID, r.IdempotencyKey, named, err))
		}
		out, err := sub.Existing(t)
		if err != nil {
			return work.Task{}, err
		}
		return out.(work.Task), nil
	}
	return fail(fmt.Errorf("postgres: SubmitTx: the key %q was freed and taken again three times", r.IdempotencyKey))
}

// A writer's insert of a key that a SubmitTx reserved in a transaction still open waits for
// that transaction, as any unique insert waits; under the log head's lock, that would stall
// every writer of every process for as long as the application keeps its transaction open.
// So a group's insert of its task keys waits at most keyWaitUnderHead (lock_timeout, set for
// that statement alone: boundKeyInsert, or around the COPY). Past it the server rolls the
// group back (55P03); the command, run again alone, fails the same way, and its caller (Update)
// waits for the keys outside the lock (awaitKeys: the same insert, in a transaction rolled back
// at once, on a pooled connection) and queues the command again. By then the reservation has
// committed (the next group's begin takes the submission in: the command finds its task) or
// rolled back (the key is free). Only an insert of the same key waits on a reservation, so a
// group without such a race pays two set_config calls in its insert's statement.
const keyWaitUnderHead = 5 * time.Millisecond

// boundKeyInsert is insert ("INSERT INTO t" and its rows: a SELECT or VALUES) as one statement
// that sets lock_timeout to keyWaitUnderHead before its first row and back to the queue's 0
// after its last: the rows are joined to the materialized setting, and the reset is selected
// from the count of the rows inserted, so the server runs them in that order. One statement,
// not a set_config on each side of the insert in the batch: those cost a keyed submit 22
// allocations more, this 2 (BenchmarkKeyedSubmit, one caller).
func boundKeyInsert(insert string) string {
	i := strings.Index(insert, " SELECT ")
	if j := strings.Index(insert, " VALUES "); i < 0 || (j >= 0 && j < i) {
		i = j
	}
	if i < 0 {
		panic(fmt.Sprintf("postgres: no rows in %q", insert))
	}
	return `WITH bound AS MATERIALIZED (` + boundKeyWait + `), ins AS (` + insert[:i] +
		` SELECT r.* FROM bound, (` + insert[i+1:] + `) AS r RETURNING 1) ` +
		unboundKeyWait + ` FROM (SELECT count(*) FROM ins) AS n`
}

var (
	boundKeyWait = fmt.Sprintf("SELECT set_config('lock_timeout', '%d', true)", keyWaitUnderHead.Milliseconds())
	// The queue's connections' own lock_timeout (Open sets it at connect).
	unboundKeyWait = "SELECT set_config('lock_timeout', '0', true)"
)

// keyBusyError is a command's group rolled back because a key it inserts is reserved by a
// transaction still open (keyBusy): Update waits for keys, then runs the command again.
type keyBusyError struct {
	keys []skey
	err  error
}

func (k *keyBusyError) Error() string {
	return fmt.Sprintf("a task key the command inserts is reserved by a transaction still open: %v", k.err)
}

func (k *keyBusyError) Unwrap() error { return k.err }

// keyBusy is err, the failure of t's group, as a *keyBusyError when it is the lock timeout of
// the group's insert of its task keys (the only statement that runs with one).
func (t *txn) keyBusy(err error) error {
	var pe *pgconn.PgError
	if len(t.newTaskKeys) == 0 || !errors.As(err, &pe) || pe.Code != "55P03" {
		return err
	}
	return &keyBusyError{keys: slices.Clone(t.newTaskKeys), err: err}
}

// boundKeyWait runs insert, a COPY of the group's task keys, with keyWaitUnderHead's bound.
func (t *txn) boundKeyWait(insert func() error) error {
	if _, err := t.conn.Exec(t.ctx, boundKeyWait); err != nil {
		return err
	}
	if err := insert(); err != nil {
		return err
	}
	_, err := t.conn.Exec(t.ctx, unboundKeyWait)
	return err
}

// awaitKeys waits, outside the log head's lock, until no open transaction inserts one of
// keys: it inserts them itself (nothing, for a key stored) in a transaction it rolls back.
func (e *engine) awaitKeys(ctx context.Context, keys []skey) error {
	ctx, stop := e.untilClose(ctx)
	defer stop()
	ss, ks, ids := make([][]byte, len(keys)), make([][]byte, len(keys)), make([][]byte, len(keys))
	for i, k := range keys {
		ss[i], ks[i], ids[i] = []byte(k.session), []byte(k.key), []byte{}
	}
	conn, err := e.onLive(ctx, func(c *pgxpool.Conn) error {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(e.inbox.awaitKeys, ss, ks, ids)
		b.Queue("ROLLBACK")
		return c.Conn().SendBatch(ctx, b).Close()
	}, rollback)
	if conn != nil {
		conn.Release()
	}
	return err
}

// keyReserved reports a commit refused on a task key's row: a key the group read as absent
// (the cache's, a hint's, or a key whose task was not yet in the log) that a SubmitTx
// committed before the group's insert. The insert waited for that transaction (any unique
// insert waits for the one inserting the same key), so it has committed, and the next
// group's begin takes its submission in: run again, the command finds the task.
func keyReserved(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.TableName == "task_keys"
}

// beginView begins a view's read-only, repeatable-read transaction on a live pooled
// connection, with every decided SubmitTx committed before its snapshot in the log. The
// snapshot is taken by the check, the transaction's first statement, sent with the BEGIN
// (one round trip, as a BEGIN alone). When a decided row waits, the writer takes it in
// (flushInbox) and the view begins again: everything committed before the first snapshot is
// in the log then (rows committed after it came after the read began, which need not see
// them; they may show as keys without their task, which the key reads skip).
func (e *engine) beginView(ctx context.Context) (*pgxpool.Conn, error) {
	for flushed := false; ; flushed = true {
		var waiting bool
		conn, err := e.onLive(ctx, func(c *pgxpool.Conn) error {
			b := &pgx.Batch{}
			b.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
			b.Queue(e.inbox.waiting).QueryRow(func(r pgx.Row) error { return r.Scan(&waiting) })
			return c.Conn().SendBatch(ctx, b).Close()
		}, rollback)
		if err != nil || !waiting || flushed {
			return conn, err
		}
		rollback(conn)
		conn.Release()
		if err := e.flushInbox(ctx); err != nil {
			return nil, err
		}
	}
}

// flushInbox runs a writer group that takes the decided submissions in: a command that
// needs the log head's lock, under which begin takes them in before it runs.
func (e *engine) flushInbox(ctx context.Context) error {
	return e.Update(ctx, func(etx engineapi.Txn) error {
		if t, ok := etx.(*txn); ok && t.optimistic {
			return t.refuseRead()
		}
		return nil
	})
}
