package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// The session ids and refusals of SubmitTx against the application's transaction (issue 43
// item 5): whatever SubmitTx says, the application's transaction goes on.

// txAlive checks that tx still runs statements: a SELECT 1 (an aborted transaction answers
// SQLSTATE 25P02).
func txAlive(t *testing.T, tx pgx.Tx, after string) {
	t.Helper()
	var one int
	if err := tx.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after %s, the application's transaction is broken: SELECT 1 = %d, %v", after, one, err)
	}
}

// TestSubmitTxAnySessionID: a session id Submit accepts (NUL, invalid UTF-8, a backslash
// that bytea's text input would read as an escape) is accepted by SubmitTx too, the
// application's transaction goes on and commits, and the task is taken in under exactly that
// session. Before the inbox's session column was bytea, SubmitTx failed with ErrBackend
// (SQLSTATE 22021) and left the transaction aborted.
func TestSubmitTxAnySessionID(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	ctx := context.Background()
	for _, session := range []string{"nul\x00inside", "\xff\xfe not UTF-8", `back\x41slash\\`, "plain"} {
		r := work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "key-" + session}
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := postgres.SubmitTx(ctx, tx, q, session, r); err != nil {
			tx.Rollback(ctx)
			t.Fatalf("SubmitTx for session %q: %v (Submit accepts this id)", session, err)
		}
		txAlive(t, tx, "SubmitTx")
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("session %q: commit: %v", session, err)
		}
		ts := awaitTasks(t, q, session, 1)
		if ts[0].SessionID != session || ts[0].IdempotencyKey != r.IdempotencyKey {
			t.Fatalf("session %q: task %+v", session, ts[0])
		}
		// Submit of the same request is a repeat of the task SubmitTx made.
		again, err := q.Session(session).Submit(ctx, r)
		if err != nil || again.ID != ts[0].ID {
			t.Fatalf("session %q: Submit of the same request = %s, %v; want task %s", session, again.ID, err, ts[0].ID)
		}
	}
	if n := inboxRows(t, c, "submit_inbox_rejects"); n != 0 {
		t.Fatalf("%d rows moved to submit_inbox_rejects", n)
	}
	verifyClean(t, q)
}

// TestSubmitTxRefusedKeepsTheTransaction: every request SubmitTx refuses is refused before
// anything is sent on tx: after each refusal the application's transaction still runs a
// statement and commits its own write, and nothing of the refused request is stored (a
// valid SubmitTx committed after them all is the only task the log holds). It calls only
// postgres.SubmitTx, so it holds for any SubmitTx. A mutant that sends a statement that
// fails on tx before returning the validation error fails it.
func TestSubmitTxRefusedKeepsTheTransaction(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, &postgres.Options{MaxValueBytes: 64})
	ctx := context.Background()
	if _, err := c.Exec(ctx, "CREATE TABLE app_orders (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	const session = "s1"
	ok := func(r work.TaskRequest) work.TaskRequest { // a valid request, changed by the case
		if r.Kind == "" {
			r.Kind = "k"
		}
		if r.IdempotencyKey == "" {
			r.IdempotencyKey = "a"
		}
		return r
	}
	cases := []struct {
		name    string
		session string
		r       work.TaskRequest
		field   string
	}{
		{"blank key", session, ok(work.TaskRequest{IdempotencyKey: " \t"}), "idempotency_key"},
		{"key too long", session, ok(work.TaskRequest{IdempotencyKey: strings.Repeat("k", 64<<10+1)}), "idempotency_key"},
		{"a schedule's key", session, ok(work.TaskRequest{IdempotencyKey: "schedule:x"}), "idempotency_key"},
		{"blank kind", session, ok(work.TaskRequest{Kind: "  "}), "kind"},
		{"invalid JSON input", session, ok(work.TaskRequest{Input: json.RawMessage(`{"a":`)}), "input"},
		{"input too large", session, ok(work.TaskRequest{Input: json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)}), "input"},
		{"run_at out of range", session, ok(work.TaskRequest{RunAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}), "run_at"},
		{"priority out of range", session, ok(work.TaskRequest{Priority: 1 << 40}), "priority"},
		{"bad header", session, ok(work.TaskRequest{Headers: map[string]string{"": "v"}}), "headers"},
		{"blank session", " ", ok(work.TaskRequest{}), "session_id"},
		{"session too long", strings.Repeat("s", 64<<10+1), ok(work.TaskRequest{}), "session_id"},
	}
	for i, tc := range cases {
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO app_orders VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
		_, err = postgres.SubmitTx(ctx, tx, q, tc.session, tc.r)
		var we *work.Error
		if !errors.As(err, &we) || !errors.Is(err, work.ErrInvalidRequest) || we.Field != tc.field {
			tx.Rollback(ctx)
			t.Fatalf("%s: SubmitTx = %v, want ErrInvalidRequest naming %s", tc.name, err, tc.field)
		}
		txAlive(t, tx, tc.name+"'s refusal")
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("%s: the application's commit after the refusal: %v", tc.name, err)
		}
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM app_orders WHERE id = $1", i).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s: the application's own write was not committed (%d rows, %v)", tc.name, n, err)
		}
	}
	// A valid submission after them all: once it is a task, anything the refused ones had
	// stored would have been taken in before it.
	submitTx(t, c, q, session, ok(work.TaskRequest{IdempotencyKey: "after"}), true)
	awaitTasks(t, q, session, 1)
	var submitted, rejected int
	err := q.ReadLog(ctx, 1, func(ev events.Event) error {
		switch ev.(type) {
		case *events.TaskSubmitted:
			submitted++
		case *events.TaskSubmitRejected:
			rejected++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if submitted != 1 || rejected != 0 {
		t.Fatalf("the log holds %d submissions and %d rejections; want only the valid one", submitted, rejected)
	}
	if n := inboxRows(t, c, "submit_inbox_rejects"); n != 0 {
		t.Fatalf("%d refused requests stored in submit_inbox_rejects", n)
	}
	verifyClean(t, q)
}

// TestSubmitTxInboxSessionColumnConverted: a schema whose inbox was made before its session
// column was bytea (text) is converted by Open, keeping a row committed then, which is taken
// in; SubmitTx of a session id text refused works afterwards.
func TestSubmitTxInboxSessionColumnConverted(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	columnType := func(table string) string {
		var typ string
		err := c.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
			WHERE a.attrelid = $1::regclass AND a.attname = 'session'`, table).Scan(&typ)
		if err != nil {
			t.Fatal(err)
		}
		return typ
	}
	for _, table := range []string{"submit_inbox", "submit_inbox_rejects"} {
		if columnType(table) == "bytea" {
			if _, err := c.Exec(ctx, "ALTER TABLE "+table+" ALTER COLUMN session TYPE text USING convert_from(session, 'UTF8')"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A row as an older build's SubmitTx wrote it: the session as text, the request as the
	// body of a task_submitted event (work/inbox.go, inboxEvent).
	body, err := events.Encode(&events.TaskSubmitted{Header: events.Header{Seq: 1, SessionID: "séance"},
		TaskID: "inbox", Kind: "k", Input: json.RawMessage(`null`), IdempotencyKey: "old"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "INSERT INTO submit_inbox (session, request) VALUES ($1::text, $2)", "séance", body); err != nil {
		t.Fatal(err)
	}
	q2, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	for _, table := range []string{"submit_inbox", "submit_inbox_rejects"} {
		if typ := columnType(table); typ != "bytea" {
			t.Fatalf("after Open, %s.session is %s, want bytea", table, typ)
		}
	}
	if ts := awaitTasks(t, q2, "séance", 1); ts[0].IdempotencyKey != "old" {
		t.Fatalf("the row committed before the conversion became %+v", ts[0])
	}
	submitTx(t, c, q2, "nul\x00", work.TaskRequest{Kind: "k", IdempotencyKey: "new"}, true)
	awaitTasks(t, q2, "nul\x00", 1)
	if n := inboxRows(t, c, "submit_inbox_rejects"); n != 0 {
		t.Fatalf("%d rows moved to submit_inbox_rejects", n)
	}
	verifyClean(t, q2)
}
