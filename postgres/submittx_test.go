package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// Tests of postgres.SubmitTx (docs/design.md §9 "Submit inside the application's
// transaction"), on the real throwaway server.

// ingestWait bounds how long a committed submission may take to be taken in here: far above
// the 100 ms target (BenchmarkSubmitTxTakenIn measures it), because the machine is shared.
const ingestWait = 30 * time.Second

func openTx(t *testing.T, dsn string, opts *postgres.Options) (*work.Queue, *pgx.Conn) {
	t.Helper()
	q, err := postgres.Open(context.Background(), dsn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return q, c
}

// submitTx runs SubmitTx in a transaction of c and commits it (or rolls it back).
func submitTx(t *testing.T, c *pgx.Conn, q *work.Queue, session string, r work.TaskRequest, commit bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.SubmitTx(ctx, tx, q, session, r); err != nil {
		tx.Rollback(ctx)
		t.Fatalf("SubmitTx: %v", err)
	}
	if commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func sessionTasks(t *testing.T, q *work.Queue, session string) []work.Task {
	t.Helper()
	ts, err := q.Session(session).Tasks(context.Background(), work.TaskFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// awaitTasks waits until the session lists n tasks, and returns them.
func awaitTasks(t *testing.T, q *work.Queue, session string, n int) []work.Task {
	t.Helper()
	deadline := time.Now().Add(ingestWait)
	for {
		ts := sessionTasks(t, q, session)
		if len(ts) == n {
			return ts
		}
		if len(ts) > n {
			t.Fatalf("session %s lists %d tasks, want %d: %+v", session, len(ts), n, ts)
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s lists %d tasks after %v, want %d", session, len(ts), ingestWait, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func inboxRows(t *testing.T, c *pgx.Conn, table string) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func rejections(t *testing.T, q *work.Queue) []*events.TaskSubmitRejected {
	t.Helper()
	var out []*events.TaskSubmitRejected
	err := q.ReadLog(context.Background(), 1, func(ev events.Event) error {
		if r, ok := ev.(*events.TaskSubmitRejected); ok {
			c := *r
			out = append(out, &c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func verifyClean(t *testing.T, q *work.Queue) {
	t.Helper()
	if err := q.Verify(context.Background()); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

// A committed submission becomes a task with the request's fields.
func TestSubmitTxCommitted(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	runAt := time.Date(2031, 5, 6, 7, 8, 9, 123456000, time.UTC)
	r := work.TaskRequest{Kind: "email", Input: json.RawMessage(`{"to":"a@b"}`), RunAt: runAt,
		IdempotencyKey: "order-1", Wake: work.WakeOnCompletion}
	submitTx(t, c, q, "s1", r, true)
	ts := awaitTasks(t, q, "s1", 1)
	got := ts[0]
	if got.Kind != "email" || string(got.Input) != `{"to":"a@b"}` || !got.ScheduledAt.Equal(runAt) ||
		got.IdempotencyKey != "order-1" || got.State != work.TaskPending || got.SessionID != "s1" {
		t.Fatalf("task %+v does not carry the request %+v", got, r)
	}
	// The same request by Submit is a repeat: the key names the task SubmitTx made.
	again, err := q.Session("s1").Submit(context.Background(), r)
	if err != nil || again.ID != got.ID {
		t.Fatalf("Submit of the same request = %v, %v; want task %s", again.ID, err, got.ID)
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 0 {
		t.Fatalf("%d inbox rows left", n)
	}
	verifyClean(t, q)
}

// A rolled-back submission is never taken in.
func TestSubmitTxRolledBack(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	submitTx(t, c, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "gone"}, false)
	// A later committed one is taken in: the queue has looked at the inbox since.
	submitTx(t, c, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "kept"}, true)
	ts := awaitTasks(t, q, "s1", 1)
	if ts[0].IdempotencyKey != "kept" {
		t.Fatalf("the task taken in is %q, want kept", ts[0].IdempotencyKey)
	}
	time.Sleep(100 * time.Millisecond)
	if ts := sessionTasks(t, q, "s1"); len(ts) != 1 {
		t.Fatalf("%d tasks after a rollback and a commit, want 1", len(ts))
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 0 {
		t.Fatalf("%d inbox rows left", n)
	}
}

// The same key committed twice with the same intent is one task; another intent is an
// audited rejection and no second task.
func TestSubmitTxIdempotency(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	r := work.TaskRequest{Kind: "charge", Input: json.RawMessage(`{"cents": 100}`), IdempotencyKey: "pay-1"}
	submitTx(t, c, q, "s1", r, true)
	submitTx(t, c, q, "s1", work.TaskRequest{Kind: "charge", Input: json.RawMessage(`{ "cents":100 }`), IdempotencyKey: "pay-1"}, true)
	first := awaitTasks(t, q, "s1", 1)[0]

	other := r
	other.Input = json.RawMessage(`{"cents": 200}`)
	submitTx(t, c, q, "s1", other, true)
	var rej []*events.TaskSubmitRejected
	deadline := time.Now().Add(ingestWait)
	for len(rej) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no task_submit_rejected in the log")
		}
		time.Sleep(5 * time.Millisecond)
		rej = rejections(t, q)
	}
	if len(rej) != 1 {
		t.Fatalf("%d rejections, want 1", len(rej))
	}
	if got := rej[0]; got.TaskID != first.ID || got.IdempotencyKey != "pay-1" || got.Field != "input" ||
		got.Kind != "charge" || got.SessionID != "s1" {
		t.Fatalf("rejection %+v, want task %s, key pay-1, field input, kind charge", got, first.ID)
	}
	if ts := sessionTasks(t, q, "s1"); len(ts) != 1 {
		t.Fatalf("%d tasks, want 1", len(ts))
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 0 {
		t.Fatalf("%d inbox rows left", n)
	}
	verifyClean(t, q)
}

// SubmitTx and the application's COMMIT do not wait for the log head: a transaction holding
// it (as a writer in the middle of a group does) does not hold them.
func TestSubmitTxDoesNotWaitOnTheWriter(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	holder, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	ctx := context.Background()
	htx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := htx.Exec(ctx, "SELECT seq FROM log_head FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	// A plain Submit now waits for the head: proof that it is held.
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = q.Session("s1").Submit(sctx, work.TaskRequest{Kind: "k"})
	cancel()
	if err == nil {
		t.Fatal("Submit committed while the log head was held: the test holds nothing")
	}
	done := make(chan error, 1)
	go func() {
		tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		tx, err := c.Begin(tctx)
		if err == nil {
			err = postgres.SubmitTx(tctx, tx, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "held"})
			if err == nil {
				err = tx.Commit(tctx)
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("SubmitTx + COMMIT while the head is held: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SubmitTx + COMMIT waited on the held log head")
	}
	if err := htx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	ts := awaitTasks(t, q, "s1", 1)
	if ts[0].IdempotencyKey != "held" {
		t.Fatalf("task %+v", ts[0])
	}
}

// A submission committed while no queue takes it in (its queue was closed before it could)
// is taken in by the next Open.
func TestSubmitTxTakenInByTheNextOpen(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	q1, err := postgres.Open(ctx, dsn, &postgres.Options{CloseTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Hold the log head, so q1's ingest cannot commit; commit the submission; close q1.
	htx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := htx.Exec(ctx, "SELECT seq FROM log_head FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	app, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	submitTx(t, app, q1, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "survives"}, true)
	time.Sleep(200 * time.Millisecond) // q1's ingest now waits on the head
	q1.Close()
	if err := htx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 1 {
		t.Fatalf("%d inbox rows after the queue closed, want the 1 committed", n)
	}
	q2, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	ts := awaitTasks(t, q2, "s1", 1)
	if ts[0].IdempotencyKey != "survives" {
		t.Fatalf("task %+v", ts[0])
	}
	verifyClean(t, q2)
}

// Two queues on one schema take each row in once.
func TestSubmitTxTwoQueuesTakeEachRowOnce(t *testing.T) {
	dsn := pgtest.Schema(t)
	q1, c := openTx(t, dsn, nil)
	q2, _ := openTx(t, dsn, nil)
	const n = 60
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(context.Background())
			for i := w; i < n; i += 3 {
				q := q1
				if i%2 == 1 {
					q = q2
				}
				tx, err := conn.Begin(context.Background())
				if err == nil {
					err = postgres.SubmitTx(context.Background(), tx, q, "s1",
						work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprintf("key-%d", i)})
					if err == nil {
						err = tx.Commit(context.Background())
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	ts := awaitTasks(t, q1, "s1", n)
	keys := map[string]bool{}
	for _, tk := range ts {
		if keys[tk.IdempotencyKey] {
			t.Fatalf("key %s taken in twice", tk.IdempotencyKey)
		}
		keys[tk.IdempotencyKey] = true
	}
	time.Sleep(100 * time.Millisecond)
	if ts := sessionTasks(t, q2, "s1"); len(ts) != n {
		t.Fatalf("%d tasks, want %d", len(ts), n)
	}
	if rej := rejections(t, q1); len(rej) != 0 {
		t.Fatalf("rejections: %v", rej)
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 0 {
		t.Fatalf("%d inbox rows left", n)
	}
	verifyClean(t, q1)
}

// Bad requests are the *work.Error Submit returns, naming the field, and write nothing.
func TestSubmitTxValidation(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, &postgres.Options{MaxValueBytes: 64})
	mem := work.NewInMemory()
	defer mem.Close()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		q       *work.Queue
		session string
		r       work.TaskRequest
		field   string
	}{
		{"no key", q, "s1", work.TaskRequest{Kind: "k"}, "idempotency_key"},
		{"blank key", q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "  "}, "idempotency_key"},
		{"blank kind", q, "s1", work.TaskRequest{Kind: " ", IdempotencyKey: "a"}, "kind"},
		{"bad input", q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a", Input: json.RawMessage(`{`)}, "input"},
		{"input too large", q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a",
			Input: json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)}, "input"},
		{"blank session", q, " ", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}, "session_id"},
		{"in-memory queue", mem, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}, "queue"},
		{"nil queue", nil, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}, "queue"},
	} {
		err := postgres.SubmitTx(ctx, tx, tc.q, tc.session, tc.r)
		var we *work.Error
		if !errors.As(err, &we) || !errors.Is(err, work.ErrInvalidRequest) || we.Field != tc.field {
			t.Errorf("%s: SubmitTx = %v, want ErrInvalidRequest naming %s", tc.name, err, tc.field)
		}
	}
	if err := postgres.SubmitTx(ctx, nil, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}); !errors.Is(err, work.ErrInvalidRequest) {
		t.Errorf("nil tx: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 0 {
		t.Fatalf("%d inbox rows written by refused requests", n)
	}
	// A closed queue is refused.
	q.Close()
	tx2, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	if err := postgres.SubmitTx(ctx, tx2, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}); err == nil {
		t.Fatal("SubmitTx on a closed queue succeeded")
	}
}

// A corrupt inbox row is kept (moved aside) and reported by Verify, not dropped; the rows
// after it are still taken in.
func TestSubmitTxCorruptRowReported(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	ctx := context.Background()
	if _, err := c.Exec(ctx, `INSERT INTO submit_inbox (session, request) VALUES ('s1', '\xdeadbeef'::bytea)`); err != nil {
		t.Fatal(err)
	}
	submitTx(t, c, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "after"}, true)
	awaitTasks(t, q, "s1", 1)
	if n := inboxRows(t, c, "submit_inbox_rejects"); n != 1 {
		t.Fatalf("%d rows in submit_inbox_rejects, want the corrupt one", n)
	}
	var req []byte
	var msg string
	if err := c.QueryRow(ctx, "SELECT request, error FROM submit_inbox_rejects").Scan(&req, &msg); err != nil {
		t.Fatal(err)
	}
	if string(req) != "\xde\xad\xbe\xef" || !strings.Contains(msg, "submit_inbox row") {
		t.Fatalf("kept row %x, %q", req, msg)
	}
	err := q.Verify(ctx)
	var ve *work.VerifyError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "submit_inbox_rejects") {
		t.Fatalf("Verify = %v, want the kept row reported", err)
	}
	if !strings.Contains(err.Error(), postgres.ErrCorruptRow.Error()) {
		t.Fatalf("Verify = %v, want it named a corrupt row", err)
	}
}
