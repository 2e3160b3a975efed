package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// batchInserts names the tables the commit batch b inserts rows into.
func batchInserts(b *pgx.Batch) map[string]bool {
	out := map[string]bool{}
	for _, q := range b.QueuedQueries {
		if _, rest, ok := strings.Cut(q.SQL, "INSERT INTO "); ok { // task_keys': in a WITH (boundKeyInsert)
			table := strings.Fields(rest)[0]
			out[table[strings.LastIndexByte(table, '.')+1:]] = true
		}
	}
	return out
}

// TestSubmitManyCopies: a large group's new rows go by COPY (copy.go), not in the commit
// batch, and a small group's stay in the batch; both read back whole and verify. Before
// copy.go every group sent its rows in the commit batch.
func TestSubmitManyCopies(t *testing.T) {
	t.Parallel() // see TestMain
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	var inserts map[string]bool
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).commitBatch = func(b *pgx.Batch) { inserts = batchInserts(b) }
	bulk := []string{"events", "tasks", "session_tasks", "task_keys", "due", "kind_due"}
	for _, n := range []int{10, 3 * copyMin} {
		s := q.Session(fmt.Sprint("s", n))
		rs := taskRequests(n, "k", true)
		res, err := s.SubmitMany(ctx, rs)
		if err != nil {
			t.Fatal(err)
		}
		for _, table := range bulk {
			if want := n < copyMin; inserts[table] != want {
				t.Errorf("batch of %d: the commit batch inserts into %s: %v, want %v", n, table, inserts[table], want)
			}
		}
		checkSubmitted(t, s, rs, res)
	}
	tracing(e).commitBatch = nil
	e.ordinaryCommits = false
	if n := logLen(t, q); n != 10+3*copyMin {
		t.Errorf("the log has %d events, want %d", n, 10+3*copyMin)
	}
	ds, err := q.ClaimDue(ctx, 60e9, 3*copyMin+10)
	if err != nil || len(ds) != 3*copyMin+10 {
		t.Fatalf("claimed %d of the %d due tasks: %v", len(ds), 3*copyMin+10, err)
	}
	mustVerify(t, q)
}

// TestSubmitManyCopyFailureRecordsNothing: a COPY the server refuses (a session row that is
// in the way) fails the batch whole: ErrBackend, nothing of it in the log, its keys free, and
// the queue goes on (the same batch succeeds once the row is gone).
func TestSubmitManyCopyFailureRecordsNothing(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{e.schema}.Sanitize()+`.session_tasks VALUES ('s', $1, 'in-the-way')`, copyMin); err != nil {
		t.Fatal(err)
	}
	rs := taskRequests(2*copyMin, "k", true)
	res, err := s.SubmitMany(ctx, rs)
	if !errors.Is(err, work.ErrBackend) || res != nil || !strings.Contains(err.Error(), "COPY") {
		t.Fatalf("SubmitMany over a row in the way: %d results, %v; want ErrBackend from the COPY", len(res), err)
	}
	if n := logLen(t, q); n != 1 {
		t.Fatalf("the log has %d events after the failed batch, want the 1 before it", n)
	}
	if _, err := s.TaskByKey(ctx, "key-0"); !errors.Is(err, work.ErrTaskNotFound) {
		t.Errorf("TaskByKey after the failed batch: %v, want ErrTaskNotFound", err)
	}
	if _, err := e.pool.Exec(ctx, `DELETE FROM `+pgx.Identifier{e.schema}.Sanitize()+`.session_tasks WHERE task_id = 'in-the-way'`); err != nil {
		t.Fatal(err)
	}
	if res, err = s.SubmitMany(ctx, rs); err != nil || res[len(rs)-1].Err != nil {
		t.Fatalf("the batch again: %v", err)
	}
	mustVerify(t, q)
}

// TestSubmitManyCopiedThenLostRecordsNothing: a batch whose rows went by COPY and whose
// connection is then lost before the commit batch is not recorded: the COPYs were in its
// transaction, which died with the connection.
func TestSubmitManyCopiedThenLostRecordsNothing(t *testing.T) {
	t.Parallel() // see TestMain
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	var armed atomic.Bool
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(c *pgx.Conn) {
		if armed.CompareAndSwap(true, false) {
			dropConn(c)
		}
	}
	rs := taskRequests(2*copyMin, "k", true)
	armed.Store(true)
	if res, err := s.SubmitMany(ctx, rs); !errors.Is(err, work.ErrBackend) || res != nil {
		t.Fatalf("SubmitMany with the connection lost after its COPYs: %d results, %v; want ErrBackend and none", len(res), err)
	}
	tracing(e).beforeCommit = nil
	e.ordinaryCommits = false
	if n := logLen(t, q); n != 0 {
		t.Fatalf("the log has %d events after the lost batch, want none", n)
	}
	res, err := s.SubmitMany(ctx, rs)
	if err != nil {
		t.Fatalf("the batch again: %v", err)
	}
	checkSubmitted(t, s, rs, res)
	if n := logLen(t, q); n != len(rs) {
		t.Errorf("the log has %d events, want %d", n, len(rs))
	}
	mustVerify(t, q)
}

// TestSubmitManyCopiesOnTheFastPath: a large group the writer's cache answers (fast.go) is
// not put in one batch: its transaction begins in a round trip of its own, its rows go by
// COPY, and only the rest goes in the last batch. Before the fast path learnt it, a
// SubmitMany of a warm writer sent every row as a statement of that batch. Its new keys are
// taken as absent unread, and their COPY proves them (before, each was read under the lock,
// and the group ran the ordinary way).
func TestSubmitManyCopiesOnTheFastPath(t *testing.T) {
	t.Parallel() // see TestMain
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	for range 2 { // the cache exact, and alone, for the batch below
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "warm"}); err != nil {
			t.Fatal(err)
		}
	}
	var inserts map[string]bool
	var batches int
	tracing(e).fastBatch = func(_ *pgx.Conn, b *pgx.Batch) { inserts, batches = batchInserts(b), batches+1 }
	defer func() { tracing(e).fastBatch = nil }()
	fast := e.head.fast.Load()
	n := 3 * copyMin
	rs := taskRequests(n, "k", true)
	res, err := s.SubmitMany(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.head.fast.Load() - fast; got != 1 || batches != 1 {
		t.Fatalf("the batch took the fast path %d times in %d batches, want once: the case proves nothing", got, batches)
	}
	for _, table := range []string{"events", "tasks", "session_tasks", "task_keys", "due", "kind_due"} {
		if inserts[table] {
			t.Errorf("the fast path's batch inserts into %s: its rows should have gone by COPY", table)
		}
	}
	checkSubmitted(t, s, rs, res)
	if got := logLen(t, q); got != n+2 {
		t.Errorf("the log has %d events, want %d", got, n+2)
	}
	mustVerify(t, q)
}
