package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// readFirstAlways makes every keyed request of e read its key first (readFirst), as it does
// after a repeat was seen.
func readFirstAlways(e *engine) {
	e.readFirst.left[0].Store(1 << 40)
	e.readFirst.left[1].Store(1 << 40)
}

// TestRepeatIsARead (issue 15, W3): an idempotent repeat of Submit or RequestWake, equal or
// conflicting, is answered from committed rows without the writer: it returns while another
// transaction holds the log head, which every writing group must lock first. A new key waits.
func TestRepeatIsARead(t *testing.T) {
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	readFirstAlways(e) // as after a repeat (the writer's cache would answer these too)
	ctx := context.Background()
	s := q.Session("s")
	task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(`{"a":1}`), IdempotencyKey: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	wake, err := s.Wake(ctx, work.WakeRequest{Payload: []byte(`"p"`), IdempotencyKey: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	before := logLen(t, q)

	// Another client holds the head lock: no group of the writer can start.
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT seq FROM log_head WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := s.Submit(rctx, work.TaskRequest{Kind: "k", Input: []byte(`{"a": 1}`), IdempotencyKey: "t1"})
	if err != nil || got.ID != task.ID || string(got.Input) != `{"a":1}` {
		t.Errorf("repeated submit while the head is locked: %+v, %v; want task %s", got, err, task.ID)
	}
	if _, err := s.Submit(rctx, work.TaskRequest{Kind: "other", IdempotencyKey: "t1"}); !errors.Is(err, work.ErrIdempotencyConflict) {
		t.Errorf("conflicting submit while the head is locked: %v, want ErrConflict", err)
	}
	gw, err := s.Wake(rctx, work.WakeRequest{Payload: []byte(`"p"`), IdempotencyKey: "w1"})
	if err != nil || gw.ID != wake.ID {
		t.Errorf("repeated wake request while the head is locked: %+v, %v; want wake %s", gw, err, wake.ID)
	}
	if _, err := s.Wake(rctx, work.WakeRequest{Payload: []byte(`"q"`), IdempotencyKey: "w1"}); !errors.Is(err, work.ErrIdempotencyConflict) {
		t.Errorf("conflicting wake request while the head is locked: %v, want ErrConflict", err)
	}

	// A new key needs the writer: it waits for the head.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := s.Submit(short, work.TaskRequest{Kind: "k", IdempotencyKey: "t2"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("new key while the head is locked: %v, want the caller's deadline", err)
	}
	holder.Rollback(ctx)
	if n := logLen(t, q); n != before && n != before+1 { // t2's group may have committed after its caller left
		t.Errorf("log has %d events, want %d or %d: a repeat wrote", n, before, before+1)
	}
	mustVerify(t, q)
}

// TestEmptyGroupDoesNotCommit: a group that appended nothing (a claim that found nothing)
// releases the head lock with a ROLLBACK, without the commit batch and its WAL flush.
func TestEmptyGroupDoesNotCommit(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	var commits atomic.Int32
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(*pgx.Conn) { commits.Add(1) }
	if ds, err := q.ClaimDue(ctx, time.Minute, 4); err != nil || len(ds) != 0 {
		t.Fatalf("claim on an empty queue: %v, %v", ds, err)
	}
	if n := commits.Load(); n != 0 {
		t.Errorf("an empty claim sent %d commit batches, want none", n)
	}
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if n := commits.Load(); n != 1 {
		t.Errorf("a submit sent %d commit batches, want 1", n)
	}
	// The writer goes on with a valid state after the rollback.
	if ds, err := q.ClaimDue(ctx, time.Minute, 4); err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v; want the task", ds, err)
	}
	tracing(e).beforeCommit = nil
	e.ordinaryCommits = false
	mustVerify(t, q)
}

// TestKeyHintFromBeforeAnotherProcessWrote: read-first's miss of a key is a hint the writer
// may take instead of reading the key again, but only while its cache is exact since the
// read. Another queue on the same schema submits the key after the miss: the writer's next
// group must find it (its cache started over at the new head, older than no hint).
func TestKeyHintFromBeforeAnotherProcessWrote(t *testing.T) {
	dsn := pgtest.Schema(t)
	a, qa := openEngine(t, dsn, nil)
	_, qb := openEngine(t, dsn, nil)
	ctx := context.Background()
	if _, err := qa.Session("s").Submit(ctx, work.TaskRequest{Kind: "warm-up"}); err != nil {
		t.Fatal(err)
	}
	missed := func(key string) {
		t.Helper()
		if _, err := a.ViewDurable(ctx, func(r projection.Reader) error {
			id, err := r.TaskKey("s", key)
			if err == nil && id != "" {
				err = fmt.Errorf("key %s names %s before it was submitted", key, id)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	keyInWriter := func(key string) string {
		t.Helper()
		var id string
		if err := a.Update(ctx, func(tx engineapi.Txn) error {
			var err error
			id, err = tx.TaskKey("s", key)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}

	missed("K")
	tb, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "K"})
	if err != nil {
		t.Fatal(err)
	}
	if id := keyInWriter("K"); id != tb.ID {
		t.Errorf("the writer reads key K as %q after another queue submitted it as %s", id, tb.ID)
	}

	// Its own submits keep the cache exact: a hint from before them is taken, and a key the
	// writer itself wrote since is in its cache.
	missed("L")
	missed("M")
	tm, err := qa.Session("s").Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "M"})
	if err != nil {
		t.Fatal(err)
	}
	if id := keyInWriter("M"); id != tm.ID {
		t.Errorf("the writer reads key M as %q after it submitted it as %s", id, tm.ID)
	}
	if id := keyInWriter("L"); id != "" {
		t.Errorf("the writer reads key L as %q: never submitted", id)
	}
	mustVerify(t, qa)
}

// TestInboxRepeatCommitsItsTake: an older build's undecided inbox row that repeats a task
// already stored appends nothing, but its take deletes the row: the group wrote
// (txn.sideWrites) and must commit, not roll back as a group that wrote nothing does
// (TestEmptyGroupDoesNotCommit). Rolled back, the row would stay in the inbox and be taken
// again and again. (Today's SubmitTx answers a repeat in the transaction and writes no row.)
func TestInboxRepeatCommitsItsTake(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q, err := Open(ctx, dsn, nil) // SubmitTx takes a queue from Open
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r := work.TaskRequest{Kind: "k", Input: []byte(`{"a":1}`), IdempotencyKey: "K"}
	task, err := q.Session("s").Submit(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	before := logLen(t, q)
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	old, err := events.Encode(&events.TaskSubmitted{Header: events.Header{Seq: 1, SessionID: "s"}, TaskID: "inbox",
		Kind: r.Kind, Input: r.Input, IdempotencyKey: r.IdempotencyKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO submit_inbox (session, request) VALUES ('s', $1)`, old); err != nil {
		t.Fatal(err)
	}
	v, _ := queues.Load(q)
	if _, err := c.Exec(ctx, `SELECT pg_notify($1, 'inbox')`, v.(*engine).channel); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the inbox row to be taken", func() bool {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM submit_inbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if n := logLen(t, q); n != before {
		t.Errorf("the log grew from %d to %d events: the repeat appended", before, n)
	}
	ts, err := q.Session("s").Tasks(ctx, work.TaskFilter{Limit: 10})
	if err != nil || len(ts) != 1 || ts[0].ID != task.ID {
		t.Errorf("session lists %+v, %v; want only %s", ts, err, task.ID)
	}
	mustVerify(t, q)
}
