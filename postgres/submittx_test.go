package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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

// Tests of postgres.SubmitTx (docs/postgres.md "Submit inside the application's
// transaction"), on the real throwaway server.

// ingestWait bounds how long an older build's undecided row may take to be taken in here.
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

// submitTx runs SubmitTx in a transaction of c and commits it (or rolls it back), returning
// its answer; a transaction whose SubmitTx failed is rolled back.
func submitTx(t *testing.T, c *pgx.Conn, q *work.Queue, session string, r work.TaskRequest, commit bool) (work.Task, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	task, serr := postgres.SubmitTx(ctx, tx, q, session, r)
	if serr != nil || !commit {
		err = tx.Rollback(ctx)
	} else {
		err = tx.Commit(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	return task, serr
}

// mustSubmitTx is submitTx that must succeed.
func mustSubmitTx(t *testing.T, c *pgx.Conn, q *work.Queue, session string, r work.TaskRequest, commit bool) work.Task {
	t.Helper()
	task, err := submitTx(t, c, q, session, r, commit)
	if err != nil {
		t.Fatalf("SubmitTx: %v", err)
	}
	return task
}

func sessionTasks(t *testing.T, q *work.Queue, session string) []work.Task {
	t.Helper()
	ts, err := q.Session(session).Tasks(context.Background(), work.TaskFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// awaitTasks waits until the session lists n tasks, and returns them (an older build's
// undecided rows are taken in in the background).
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

// A committed submission is answered in the transaction with its task, and from the commit a
// queue of another process (a second Open) reads it and claims it, at once: no waiting.
func TestSubmitTxCommitted(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	other, _ := openTx(t, dsn, nil)
	ctx := context.Background()
	runAt := time.Date(2031, 5, 6, 7, 8, 9, 123456000, time.UTC)
	r := work.TaskRequest{Kind: "email", Input: json.RawMessage(`{"to":"a@b"}`), RunAt: runAt,
		IdempotencyKey: "order-1", Wake: work.WakeOnCompletion, Priority: 3, Headers: map[string]string{"h": "v"}}
	task := mustSubmitTx(t, c, q, "s1", r, true)
	if task.ID == "" || task.Kind != "email" || string(task.Input) != `{"to":"a@b"}` || !task.ScheduledAt.Equal(runAt) ||
		task.IdempotencyKey != "order-1" || task.State != work.TaskPending || task.SessionID != "s1" || task.Priority != 3 ||
		task.Headers["h"] != "v" || task.CreatedAt.IsZero() {
		t.Fatalf("SubmitTx answered %+v for %+v", task, r)
	}
	got, found, err := other.Session("s1").Task(ctx, task.ID)
	if err != nil || !found {
		t.Fatalf("another queue's Task right after the commit: %v, found %v", err, found)
	}
	if !reflect.DeepEqual(got, task) {
		t.Fatalf("another queue reads\n%+v\nSubmitTx answered\n%+v", got, task)
	}
	byKey, err := other.Session("s1").TaskByKey(ctx, "order-1")
	if err != nil || byKey.ID != task.ID {
		t.Fatalf("TaskByKey = %s, %v; want %s", byKey.ID, err, task.ID)
	}
	again, err := q.Session("s1").Submit(ctx, r)
	if err != nil || again.ID != task.ID {
		t.Fatalf("Submit of the same request = %v, %v; want task %s", again.ID, err, task.ID)
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 0 {
		t.Fatalf("%d inbox rows left", n)
	}
	verifyClean(t, q)
}

// Readers and claims of another queue see a committed SubmitTx at once, round after round,
// whether or not a take-in ran since the commit: a read takes the waiting rows in first
// (beginView), a claim's group too (begin, and the fast path's check). Claims take SubmitTx
// and Submit tasks in submission order.
func TestSubmitTxSeenAtOnce(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	reader, _ := openTx(t, dsn, nil)
	ctx := context.Background()
	for i := range 30 {
		s := fmt.Sprintf("s%d", i)
		a := mustSubmitTx(t, c, q, s, work.TaskRequest{Kind: "k"}, true)
		var st work.QueueStats
		var err error
		switch i % 4 {
		case 0:
			var found bool
			_, found, err = reader.Session(s).Task(ctx, a.ID)
			if err == nil && !found {
				t.Fatalf("round %d: Task of a committed SubmitTx not found", i)
			}
		case 1:
			var ts []work.Task
			ts, err = reader.Session(s).Tasks(ctx, work.TaskFilter{Limit: 10})
			if err == nil && len(ts) != 1 {
				t.Fatalf("round %d: Tasks lists %d tasks right after the commit, want 1", i, len(ts))
			}
		case 2:
			st, err = reader.Stats(ctx)
			if err == nil && st.Total.Pending != 1 {
				t.Fatalf("round %d: Stats counts %d pending right after the commit, want 1", i, st.Total.Pending)
			}
		case 3:
			k := mustSubmitTx(t, c, q, s, work.TaskRequest{Kind: "k", IdempotencyKey: "key"}, true)
			var got work.Task
			got, err = reader.Session(s).TaskByKey(ctx, "key")
			if err == nil && got.ID != k.ID {
				t.Fatalf("round %d: TaskByKey = %s, want %s", i, got.ID, k.ID)
			}
		}
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		// Submit through the SubmitTx's queue: one clock, so creation order is (at, seq) order
		// (another process's clock agrees to within its anchor's error).
		b, err := q.Session(s).Submit(ctx, work.TaskRequest{Kind: "k"})
		if err != nil {
			t.Fatal(err)
		}
		cc := mustSubmitTx(t, c, q, s, work.TaskRequest{Kind: "k"}, true)
		want := []string{a.ID, b.ID, cc.ID}
		if i%4 == 3 {
			want = nil // the keyed one too: claim them all, in order
		}
		// A second later than now: each queue's clock is the server's as its own anchor
		// measured it, so another queue may find a task made a moment ago not yet due.
		ds, err := reader.ClaimDueAt(ctx, time.Now().Add(time.Second), time.Minute, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range ds {
			got = append(got, d.Task.ID)
		}
		if want != nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: claimed %v right after the commits, want %v (SubmitTx, Submit, SubmitTx)", i, got, want)
		}
		if want == nil && (len(got) != 4 || got[0] != a.ID || got[2] != b.ID || got[3] != cc.ID) {
			t.Fatalf("round %d: claimed %v, want 4 in submission order: %s, the keyed one, %s, %s", i, got, a.ID, b.ID, cc.ID)
		}
		for _, d := range ds {
			if _, err := reader.Finish(ctx, d, work.Outcome{State: work.TaskSucceeded}); err != nil {
				t.Fatal(err)
			}
		}
	}
	verifyClean(t, reader)
}

// A rolled-back submission is nothing, and frees its key.
func TestSubmitTxRolledBack(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	ctx := context.Background()
	gone := mustSubmitTx(t, c, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "gone"}, false)
	if _, found, err := q.Session("s1").Task(ctx, gone.ID); err != nil || found {
		t.Fatalf("the rolled-back task: found %v, %v", found, err)
	}
	if _, err := q.Session("s1").TaskByKey(ctx, "gone"); !errors.Is(err, work.ErrTaskNotFound) {
		t.Fatalf("TaskByKey of a rolled-back submission: %v", err)
	}
	again, err := q.Session("s1").Submit(ctx, work.TaskRequest{Kind: "other", IdempotencyKey: "gone"})
	if err != nil || again.ID == gone.ID {
		t.Fatalf("Submit under the rolled-back key: %v, %v", again.ID, err)
	}
	if ts := sessionTasks(t, q, "s1"); len(ts) != 1 {
		t.Fatalf("%d tasks, want 1", len(ts))
	}
	if n := inboxRows(t, c, "submit_inbox"); n != 0 {
		t.Fatalf("%d inbox rows left", n)
	}
	verifyClean(t, q)
}

// The same key with the same intent, committed by Submit or by SubmitTx, is that task; another
// intent is ErrIdempotencyConflict inside the transaction, which goes on and commits its own
// writes; the same key twice in one transaction is one task.
func TestSubmitTxIdempotency(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	ctx := context.Background()
	if _, err := c.Exec(ctx, "CREATE TABLE app_orders (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	r := work.TaskRequest{Kind: "charge", Input: json.RawMessage(`{"cents": 100}`), IdempotencyKey: "pay-1"}
	first := mustSubmitTx(t, c, q, "s1", r, true)
	same := mustSubmitTx(t, c, q, "s1", work.TaskRequest{Kind: "charge", Input: json.RawMessage(`{ "cents":100 }`), IdempotencyKey: "pay-1"}, true)
	if same.ID != first.ID || !reflect.DeepEqual(same, first) {
		t.Fatalf("the same intent again answered %+v, want %+v", same, first)
	}
	bySubmit, err := q.Session("s1").Submit(ctx, work.TaskRequest{Kind: "refund", IdempotencyKey: "ref-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustSubmitTx(t, c, q, "s1", work.TaskRequest{Kind: "refund", IdempotencyKey: "ref-1"}, true); got.ID != bySubmit.ID {
		t.Fatalf("SubmitTx of Submit's key = %s, want %s", got.ID, bySubmit.ID)
	}
	for i, tc := range []struct {
		r     work.TaskRequest
		field string
		id    string
	}{
		{work.TaskRequest{Kind: "charge", Input: json.RawMessage(`{"cents": 200}`), IdempotencyKey: "pay-1"}, "input", first.ID},
		{work.TaskRequest{Kind: "charge", Input: r.Input, IdempotencyKey: "pay-1", Priority: 2}, "priority", first.ID},
		{work.TaskRequest{Kind: "other", IdempotencyKey: "ref-1"}, "kind", bySubmit.ID},
	} {
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = postgres.SubmitTx(ctx, tx, q, "s1", tc.r)
		var we *work.Error
		if !errors.As(err, &we) || !errors.Is(err, work.ErrIdempotencyConflict) || we.Field != tc.field || we.ID != tc.id {
			tx.Rollback(ctx)
			t.Fatalf("case %d: SubmitTx = %v, want the conflict naming %s and %s", i, err, tc.field, tc.id)
		}
		txAlive(t, tx, "the conflict")
		if _, err := tx.Exec(ctx, "INSERT INTO app_orders VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("case %d: commit after the conflict: %v", i, err)
		}
	}
	var orders int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM app_orders").Scan(&orders); err != nil || orders != 3 {
		t.Fatalf("the application's writes: %d, %v", orders, err)
	}
	// Twice in one transaction: one task.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, err1 := postgres.SubmitTx(ctx, tx, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "twice"})
	b, err2 := postgres.SubmitTx(ctx, tx, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "twice"})
	_, err3 := postgres.SubmitTx(ctx, tx, q, "s1", work.TaskRequest{Kind: "k2", IdempotencyKey: "twice"})
	if err1 != nil || err2 != nil || a.ID != b.ID || !errors.Is(err3, work.ErrIdempotencyConflict) {
		t.Fatalf("twice in one transaction: %s, %v; %s, %v; %v", a.ID, err1, b.ID, err2, err3)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ts := sessionTasks(t, q, "s1"); len(ts) != 3 || rejections(t, q) != nil {
		t.Fatalf("%d tasks, want 3", len(ts))
	}
	verifyClean(t, q)
}

// Two transactions submitting one key: the second waits for the first (as a unique insert
// does), then gets the winner's task (same intent) or the conflict (another); if the first
// rolls back, the second's own task. Submit through the writer racing an open SubmitTx of its
// key waits likewise, and answers with the SubmitTx's task.
func TestSubmitTxConcurrentSameKey(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	ctx := context.Background()
	c2, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	type answer struct {
		task work.Task
		err  error
	}
	for i, tc := range []struct {
		name         string
		second       work.TaskRequest
		commitFirst  bool
		viaSubmit    bool
		wantConflict bool
	}{
		{"same intent, first commits", work.TaskRequest{Kind: "k"}, true, false, false},
		{"other intent, first commits", work.TaskRequest{Kind: "k2"}, true, false, true},
		{"first rolls back", work.TaskRequest{Kind: "k2"}, false, false, false},
		{"Submit, first commits", work.TaskRequest{Kind: "k"}, true, true, false},
		{"Submit of another intent, first commits", work.TaskRequest{Kind: "k2"}, true, true, true},
		{"Submit, first rolls back", work.TaskRequest{Kind: "k2"}, false, true, false},
	} {
		key := fmt.Sprintf("race-%d", i)
		tc.second.IdempotencyKey = key
		tx1, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first, err := postgres.SubmitTx(ctx, tx1, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: key})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan answer, 1)
		// Submit through a queue just opened: its writer is not alone (no cache yet), so its
		// group reads the key under the lock, finds it absent (tx1's row is not committed),
		// and its commit meets tx1's row: refused once tx1 commits, then run again.
		sq, _ := openTx(t, dsn, nil)
		go func() {
			if tc.viaSubmit {
				task, err := sq.Session("s1").Submit(ctx, tc.second)
				done <- answer{task, err}
				return
			}
			tx2, err := c2.Begin(ctx)
			if err != nil {
				done <- answer{err: err}
				return
			}
			task, err := postgres.SubmitTx(ctx, tx2, q, "s1", tc.second)
			if err == nil {
				err = tx2.Commit(ctx)
			} else {
				tx2.Rollback(ctx)
			}
			done <- answer{task, err}
		}()
		select {
		case a := <-done:
			t.Fatalf("%s: the second answered %+v, %v while the first was open", tc.name, a.task, a.err)
		case <-time.After(200 * time.Millisecond):
		}
		if tc.commitFirst {
			err = tx1.Commit(ctx)
		} else {
			err = tx1.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		var a answer
		select {
		case a = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the second never answered", tc.name)
		}
		switch {
		case tc.wantConflict:
			var we *work.Error
			if !errors.As(a.err, &we) || !errors.Is(a.err, work.ErrIdempotencyConflict) || we.ID != first.ID {
				t.Fatalf("%s: %v, want the conflict naming %s", tc.name, a.err, first.ID)
			}
		case a.err != nil:
			t.Fatalf("%s: %v", tc.name, a.err)
		case tc.commitFirst && a.task.ID != first.ID:
			t.Fatalf("%s: the second answered %s, want the first's %s", tc.name, a.task.ID, first.ID)
		case !tc.commitFirst && (a.task.ID == first.ID || a.task.Kind != "k2"):
			t.Fatalf("%s: the second answered %+v, want its own task", tc.name, a.task)
		}
		byKey, err := q.Session("s1").TaskByKey(ctx, key)
		want := first.ID
		if !tc.commitFirst {
			want = a.task.ID
		}
		if err != nil || byKey.ID != want {
			t.Fatalf("%s: TaskByKey = %s, %v; want %s", tc.name, byKey.ID, err, want)
		}
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
	var task work.Task
	go func() {
		tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		tx, err := c.Begin(tctx)
		if err == nil {
			task, err = postgres.SubmitTx(tctx, tx, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "held"})
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
	ts := sessionTasks(t, q, "s1")
	if len(ts) != 1 || ts[0].ID != task.ID {
		t.Fatalf("tasks %+v, want the SubmitTx's %s", ts, task.ID)
	}
}

// A submission committed while no queue takes it in (its queue was closed before it could)
// is read by the next Open at once.
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
	// Hold the log head, so q1's take-in cannot commit; commit the submission; close q1.
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
	task := mustSubmitTx(t, app, q1, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "survives"}, true)
	time.Sleep(200 * time.Millisecond) // q1's take-in now waits on the head
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
	ts := sessionTasks(t, q2, "s1")
	if len(ts) != 1 || ts[0].ID != task.ID {
		t.Fatalf("tasks %+v, want %s", ts, task.ID)
	}
	verifyClean(t, q2)
}

// Two queues on one schema, three connections submitting through either: every submission
// one task, taken into the log once.
func TestSubmitTxTwoQueuesTakeEachRowOnce(t *testing.T) {
	dsn := pgtest.Schema(t)
	q1, c := openTx(t, dsn, nil)
	q2, _ := openTx(t, dsn, nil)
	const n = 60
	var mu sync.Mutex
	answered := map[string]string{}
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
				key := fmt.Sprintf("key-%d", i)
				task, err := submitTx(t, conn, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: key}, true)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				answered[key] = task.ID
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	ts := sessionTasks(t, q1, "s1")
	if len(ts) != n {
		t.Fatalf("%d tasks, want %d", len(ts), n)
	}
	for _, tk := range ts {
		if answered[tk.IdempotencyKey] != tk.ID {
			t.Fatalf("key %s is task %s, SubmitTx answered %s", tk.IdempotencyKey, tk.ID, answered[tk.IdempotencyKey])
		}
	}
	if ts := sessionTasks(t, q2, "s1"); len(ts) != n {
		t.Fatalf("%d tasks, want %d", len(ts), n)
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
		{"blank key", q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "  "}, "idempotency_key"},
		{"blank kind", q, "s1", work.TaskRequest{Kind: " ", IdempotencyKey: "a"}, "kind"},
		{"bad input", q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a", Input: json.RawMessage(`{`)}, "input"},
		{"input too large", q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a",
			Input: json.RawMessage(`"` + strings.Repeat("x", 100) + `"`)}, "input"},
		{"blank session", q, " ", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}, "session_id"},
		{"in-memory queue", mem, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}, "queue"},
		{"nil queue", nil, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}, "queue"},
	} {
		_, err := postgres.SubmitTx(ctx, tx, tc.q, tc.session, tc.r)
		var we *work.Error
		if !errors.As(err, &we) || !errors.Is(err, work.ErrInvalidRequest) || we.Field != tc.field {
			t.Errorf("%s: SubmitTx = %v, want ErrInvalidRequest naming %s", tc.name, err, tc.field)
		}
		txAlive(t, tx, tc.name)
	}
	if _, err := postgres.SubmitTx(ctx, nil, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}); !errors.Is(err, work.ErrInvalidRequest) {
		t.Errorf("nil tx: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := inboxRows(t, c, "submit_inbox") + inboxRows(t, c, "task_keys"); n != 0 {
		t.Fatalf("%d inbox or key rows written by refused requests", n)
	}
	// A closed queue is refused.
	q.Close()
	tx2, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	if _, err := postgres.SubmitTx(ctx, tx2, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "a"}); err == nil {
		t.Fatal("SubmitTx on a closed queue succeeded")
	}
}

// undecidedRow is an inbox row as an older build's SubmitTx committed it: the request as a
// task_submitted event with the placeholder task id, decided when taken in.
func undecidedRow(t *testing.T, session string, r work.TaskRequest) []byte {
	t.Helper()
	body, err := events.Encode(&events.TaskSubmitted{Header: events.Header{Seq: 1, SessionID: session},
		TaskID: "inbox", Kind: r.Kind, Input: r.Input, IdempotencyKey: r.IdempotencyKey})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// Rows an older build left undecided are decided when taken in, with Submit's rules then: a
// new task, nothing for the same intent, a task_submit_rejected for another.
func TestSubmitTxUndecidedRowsOfAnOlderBuild(t *testing.T) {
	t.Parallel() // see TestMain
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	ctx := context.Background()
	r := work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "old"}
	other := r
	other.Input = json.RawMessage(`{"n":2}`)
	for _, r := range []work.TaskRequest{r, r, other} {
		if _, err := c.Exec(ctx, `INSERT INTO submit_inbox (session, request) VALUES ('s1', $1)`, undecidedRow(t, "s1", r)); err != nil {
			t.Fatal(err)
		}
	}
	mustSubmitTx(t, c, q, "s2", work.TaskRequest{Kind: "wake the take-in"}, true) // its notification
	ts := awaitTasks(t, q, "s1", 1)
	deadline := time.Now().Add(ingestWait)
	for len(rejections(t, q)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no task_submit_rejected in the log")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rej := rejections(t, q); len(rej) != 1 || rej[0].TaskID != ts[0].ID || rej[0].Field != "input" {
		t.Fatalf("rejections %+v, want one naming %s and input", rej, ts[0].ID)
	}
	verifyClean(t, q)
}

// A corrupt inbox row, undecided or decided, is kept (moved aside) and reported by Verify,
// not dropped; the rows after it are still taken in.
func TestSubmitTxCorruptRowReported(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	ctx := context.Background()
	if _, err := c.Exec(ctx, `INSERT INTO submit_inbox (session, request) VALUES ('s1', '\xdeadbeef'::bytea)`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO submit_inbox (session, request, task_id) VALUES ('s1', '\xdeadbeef'::bytea, 'x')`); err != nil {
		t.Fatal(err)
	}
	after := mustSubmitTx(t, c, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "after"}, true)
	if ts := sessionTasks(t, q, "s1"); len(ts) != 1 || ts[0].ID != after.ID {
		t.Fatalf("tasks %+v, want %s", ts, after.ID)
	}
	deadline := time.Now().Add(ingestWait)
	for inboxRows(t, c, "submit_inbox_rejects") != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows in submit_inbox_rejects, want both corrupt ones", inboxRows(t, c, "submit_inbox_rejects"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	var req []byte
	var msg string
	if err := c.QueryRow(ctx, "SELECT request, error FROM submit_inbox_rejects ORDER BY id LIMIT 1").Scan(&req, &msg); err != nil {
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

// A claim right after a SubmitTx's commit takes its task, also when the claiming writer is
// alone and runs its group before the lock on the reads of its last commit (fast.go): that
// group's check refuses to commit while a decided row waits, and the group runs under the
// lock, which takes the row in first. Round after round: claim, commit, claim at once.
func TestSubmitTxClaimedByAWriterAlone(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	claimer, _ := openTx(t, dsn, nil)
	ctx := context.Background()
	missed := 0
	for i := range 40 {
		task := mustSubmitTx(t, c, q, "s1", work.TaskRequest{Kind: "k"}, true)
		ds, err := claimer.ClaimDueAt(ctx, time.Now().Add(time.Second), time.Minute, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 1 || ds[0].Task.ID != task.ID {
			missed++
			t.Errorf("round %d: claimed %d tasks right after the commit, want %s", i, len(ds), task.ID)
		}
		for _, d := range ds {
			if _, err := claimer.Finish(ctx, d, work.Outcome{State: work.TaskSucceeded}); err != nil {
				t.Fatal(err)
			}
		}
		if missed > 3 {
			t.FailNow()
		}
	}
}

// A Submit of a key that a SubmitTx of a transaction still open reserved waits for that
// transaction, as a unique insert does, but not under the log head's lock: meanwhile the
// writers of every process go on (the same queue's and another's, each submitting another
// key). Once the transaction commits, the Submit answers with its task; after a rollback,
// with its own. The same for a SubmitMany large enough to insert its keys by COPY.
func TestSubmitTxReservedKeyDoesNotHoldTheHead(t *testing.T) {
	dsn := pgtest.Schema(t)
	q, c := openTx(t, dsn, nil)
	other, mon := openTx(t, dsn, nil)
	ctx := context.Background()
	type answer struct {
		task work.Task
		err  error
	}
	for _, tc := range []struct{ commit, many bool }{{true, false}, {false, false}, {true, true}} {
		commit := tc.commit
		key := fmt.Sprintf("held-%v-%v", commit, tc.many)
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first, err := postgres.SubmitTx(ctx, tx, q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: key})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan answer, 1)
		go func() {
			if !tc.many {
				task, err := q.Session("s1").Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: key})
				done <- answer{task, err}
				return
			}
			rs := make([]work.TaskRequest, 1100) // above copyMin keys: inserted by COPY
			for i := range rs {
				rs[i] = work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprintf("%s-many-%d", key, i)}
			}
			rs[0].IdempotencyKey = key
			ts, err := q.Session("s1").SubmitMany(ctx, rs)
			if err != nil {
				done <- answer{err: err}
				return
			}
			done <- answer{ts[0].Task, ts[0].Err}
		}()
		// The Submit's insert meets the reservation: some backend waits on tx's transaction.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var n int
			if err := mon.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no backend ever waited on the reservation's transaction")
			}
		}
		for i, w := range []*work.Queue{q, other} {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := w.Session("s2").Submit(wctx, work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprintf("%s-%d", key, i)})
			cancel()
			if err != nil {
				t.Fatalf("%+v: a Submit of another key on queue %d while the reservation's transaction is open: %v", tc, i, err)
			}
		}
		select {
		case a := <-done:
			t.Fatalf("%+v: the Submit of the reserved key answered %+v, %v while the transaction was open", tc, a.task, a.err)
		default:
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		var a answer
		select {
		case a = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%+v: the Submit of the reserved key never answered", tc)
		}
		switch {
		case a.err != nil:
			t.Fatalf("%+v: %v", tc, a.err)
		case commit && a.task.ID != first.ID:
			t.Fatalf("the Submit answered %s, want the committed SubmitTx's %s", a.task.ID, first.ID)
		case !commit && a.task.ID == first.ID:
			t.Fatalf("the Submit answered the rolled-back SubmitTx's %s", first.ID)
		}
		if byKey, err := other.Session("s1").TaskByKey(ctx, key); err != nil || byKey.ID != a.task.ID {
			t.Fatalf("%+v: TaskByKey = %s, %v; want %s", tc, byKey.ID, err, a.task.ID)
		}
	}
	verifyClean(t, q)
}
