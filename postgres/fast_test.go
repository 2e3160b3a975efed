package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// tripCounter counts the round trips of the queue's connections (a statement, a batch or a
// prepare each is one), but the listener's and the server clock's, which are not the
// writer's and run when they please, and the calls that failed before anything was sent
// because their context had ended (the fast path's refused reads: pgconn checks first).
// sentEnded counts the calls begun with an ended context that did not fail: never.
// batches counts the batches alone: the writer's round trips in a test without reads (the
// queue's other readers — the listener, the inbox's poll — send single statements).
type tripCounter struct {
	n, batches, sentEnded atomic.Int64
	inboxChecks           atomic.Int64 // the inbox's checks (InboxPending's statement, and its prepare)
	prepares              atomic.Int64 // the prepares among n: a statement new to its connection

	mu      sync.Mutex
	counted []string // what each counted round trip sent (the first 60 bytes; "batch"), for a failure's message
}

// trips returns what the counted round trips since the last reset sent, and resets the list.
func (c *tripCounter) trips() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.counted
	c.counted = nil
	return out
}

// background reports statements the queue sends on its own, not as a command's part: the
// clock's refresh (clock.go), the listener's LISTEN and its registration (listeners.go: it
// runs whenever the watcher connects, which a loaded machine may delay into a count), the
// watcher's taking and letting go of its keys (no waiter, no notification), and
// the inbox's check (work/inbox.go,
// InboxPending), which the listener's start and every recheck of a silent listener set off
// at any moment; the first on a connection is two round trips, its prepare and itself.
func background(sql string) bool {
	return strings.Contains(sql, "clock_timestamp") || strings.HasPrefix(sql, "LISTEN") ||
		sql == takeSlotSQL || sql == holdListenSQL || sql == releaseListenSQL || inboxCheck(sql)
}

// inboxCheck reports InboxPending's statement (submittx.go: SELECT EXISTS (… submit_inbox)).
func inboxCheck(sql string) bool { return strings.Contains(sql, "submit_inbox)") }

type traceKey struct{}

type traced struct {
	sql     string
	ended   bool
	batch   bool
	prepare bool
}

func (c *tripCounter) start(ctx context.Context, sql string, batch bool) context.Context {
	return context.WithValue(ctx, traceKey{}, traced{sql: sql, ended: ctx.Err() != nil, batch: batch})
}

func (c *tripCounter) end(ctx context.Context, err error) {
	tr, _ := ctx.Value(traceKey{}).(traced)
	if tr.ended && err == nil {
		c.sentEnded.Add(1)
	}
	if inboxCheck(tr.sql) {
		c.inboxChecks.Add(1)
	}
	if background(tr.sql) {
		return
	}
	if err != nil && errors.Is(err, context.Canceled) && pgconn.SafeToRetry(err) {
		return // nothing sent
	}
	c.n.Add(1)
	label := tr.sql
	switch {
	case tr.batch:
		c.batches.Add(1)
		label = "batch"
	case tr.prepare:
		c.prepares.Add(1)
		label = "prepare " + label
	}
	c.mu.Lock()
	if len(c.counted) < 1000 {
		c.counted = append(c.counted, label[:min(len(label), 60)])
	}
	c.mu.Unlock()
}

func (c *tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return c.start(ctx, d.SQL, false)
}
func (c *tripCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	c.end(ctx, d.Err)
}
func (c *tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return c.start(ctx, "", true)
}
func (c *tripCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *tripCounter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	c.end(ctx, d.Err)
}
func (c *tripCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	ctx = c.start(ctx, d.SQL, false)
	tr := ctx.Value(traceKey{}).(traced)
	tr.prepare = true
	return context.WithValue(ctx, traceKey{}, tr)
}
func (c *tripCounter) TracePrepareEnd(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	c.end(ctx, d.Err)
}

// openCounted opens an engine whose connections count their round trips.
func openCounted(t *testing.T, dsn string) (*engine, *work.Queue, *tripCounter) {
	tc := &tripCounter{}
	testConfigHook = func(c *pgxpool.Config) { c.ConnConfig.Tracer = tc }
	defer func() { testConfigHook = nil }()
	e, q := openEngine(t, dsn, nil)
	return e, q, tc
}

// TestSubmitIsOneRoundTrip (issue 24, W1 from one goroutine): a submit whose group the
// cache answers — a new task, no read — is one round trip: BEGIN, the lock, the head's
// check, the writes and COMMIT in one batch. It was two (the begin batch, then the commit
// batch), as it still is while another writer commits between the groups. (Counted as
// batches: every submit taking the fast path also proves it read nothing.)
func TestSubmitIsOneRoundTrip(t *testing.T) {
	e, q, tc := openCounted(t, pgtest.Schema(t))
	ctx := context.Background()
	s := q.Session("s")
	submit := func(r work.TaskRequest) {
		t.Helper()
		if _, err := s.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 { // the cache becomes exact and alone; every statement gets prepared
		submit(work.TaskRequest{Kind: "warm-up", Input: []byte(`{"n":0}`)})
	}
	const n = 20
	tc.batches.Store(0)
	fast := e.head.fast.Load()
	for i := range n {
		submit(work.TaskRequest{Kind: "k", Input: []byte(`{"n":1}`), Priority: i % 2})
	}
	if got := tc.batches.Load(); got != n {
		t.Errorf("%d submits from one goroutine took %d round trips, want %d", n, got, n)
	}
	if got := e.head.fast.Load() - fast; got != n {
		t.Errorf("%d of %d submits took the fast path", got, n)
	}
	// With idempotency keys (bench/'s W1): the run before the lock takes each new key
	// unread, and the batch's insert proves it: the writer's part is still one round trip
	// (TestNewKeyedSubmitIsOneRoundTrip counts every round trip: one in all).
	tc.batches.Store(0)
	fast = e.head.fast.Load()
	for i := range n {
		submit(work.TaskRequest{Kind: "k", Input: []byte(`{"n":1}`), IdempotencyKey: fmt.Sprint("key-", i)})
	}
	if got := tc.batches.Load(); got != n {
		t.Errorf("%d keyed submits from one goroutine took %d writer round trips, want %d", n, got, n)
	}
	if got := e.head.fast.Load() - fast; got != n {
		t.Errorf("%d of %d keyed submits took the fast path", got, n)
	}
	// With ordinaryCommits, the ordinary path: two round trips.
	e.ordinaryCommits = true
	submit(work.TaskRequest{Kind: "k"}) // prepares what the ordinary way sends
	tc.batches.Store(0)
	submit(work.TaskRequest{Kind: "k"})
	if got := tc.batches.Load(); got != 2 {
		t.Errorf("a submit the ordinary way took %d round trips, want 2", got)
	}
	e.ordinaryCommits = false
	mustVerify(t, q)
}

// TestFastPathNeedsARead: a claim of a kind under MaxRunning counts the kind's leases, a
// read neither the cache nor the last commit's reads for the next claim (claimpre.go) can
// answer. The group's run before the lock is given up before anything is sent — its
// statements fail on their ended context, none reaches the server — and the claim runs the
// ordinary way and claims what it should.
func TestFastPathNeedsARead(t *testing.T) {
	e, q, tc := openCounted(t, pgtest.Schema(t))
	ctx := context.Background()
	if err := q.SetKindPolicy(ctx, "k", work.KindPolicy{MaxRunning: 100}); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		read := e.head.fastRead.Load()
		ds, err := q.ClaimDue(ctx, time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %v, %v", ds, err)
		}
		if i > 0 && e.head.fastRead.Load() != read+1 { // the first follows the ordinary submits' last
			t.Errorf("claim %d did not try the fast path: the test proves nothing", i)
		}
	}
	if n := tc.sentEnded.Load(); n != 0 {
		t.Errorf("%d statements of the fast path's runs reached the server", n)
	}
	mustVerify(t, q)
}

// TestFastPathOtherWriterCommitted: writer B's cache is exact and alone when A commits; B's
// next submit runs before the lock on a stale cache, and its batch's check of the head
// fails: rolled back, the group runs the ordinary way (catching the cache up) and commits
// once, with sequence numbers after A's.
func TestFastPathOtherWriterCommitted(t *testing.T) {
	_, qa, b, qb := twoWriters(t)
	ctx := context.Background()
	for range 3 {
		if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "b"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := qa.Session("s").Submit(ctx, work.TaskRequest{Kind: "a", IdempotencyKey: "K"}); err != nil {
		t.Fatal(err)
	}
	stale := b.head.fastStale.Load()
	task, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if b.head.fastStale.Load() != stale+1 {
		t.Error("B's fast path did not find A's commit: the test proves nothing")
	}
	if got, found, err := qb.Session("s").Task(ctx, task.ID); err != nil || !found || got.Kind != "b" {
		t.Errorf("B's task: %+v, %v, %v", got, found, err)
	}
	if n := logLen(t, qb); n != 5 {
		t.Errorf("the log has %d events, want 5", n)
	}
	mustVerify(t, qb)
}

// TestFastBatchFailures: the one batch fails (a) before it is sent (the connection closed),
// (b) on an ERROR the server raises inside it, (c) with the connection lost after its COMMIT
// ran. Each submit succeeds, once: (a) and (b) ran the ordinary way after the fast path was
// taken back, (c) was resolved from the commit mark as committed, and not run again.
func TestFastBatchFailures(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	for range 3 {
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "warm-up"}); err != nil {
			t.Fatal(err)
		}
	}
	want := 3
	for _, c := range []struct {
		name string
		hook func(*pgx.Conn, *pgx.Batch)
	}{
		{"closed before sending", func(c *pgx.Conn, _ *pgx.Batch) { dropConn(c) }},
		{"an ERROR in the batch", func(_ *pgx.Conn, b *pgx.Batch) {
			// Before COMMIT: the statements after it are skipped, the transaction rolled back.
			b.QueuedQueries = append(b.QueuedQueries[:len(b.QueuedQueries)-1], &pgx.QueuedQuery{SQL: "SELECT 'x'::int"}, b.QueuedQueries[len(b.QueuedQueries)-1])
		}},
		{"lost after COMMIT", func(c *pgx.Conn, b *pgx.Batch) {
			b.Queue("SELECT pg_sleep(2)")
			go func() {
				time.Sleep(300 * time.Millisecond) // the server has run COMMIT
				dropConn(c)
			}()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var fired atomic.Int32
			tracing(e).fastBatch = func(conn *pgx.Conn, b *pgx.Batch) {
				if fired.Add(1) == 1 {
					c.hook(conn, b)
				}
			}
			defer func() { tracing(e).fastBatch = nil }()
			// Twice: the first makes the cache exact and alone again after the last case.
			for range 2 {
				task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: c.name + time.Now().String()})
				if err != nil && strings.Contains(err.Error(), "use of closed network connection") {
					t.Fatalf("submit: %v", err)
				}
				if err != nil {
					t.Fatalf("submit: %v", err)
				}
				want++
				if _, found, err := s.Task(ctx, task.ID); err != nil || !found {
					t.Fatalf("the acknowledged task: %v, %v", found, err)
				}
				if fired.Load() > 0 {
					break
				}
			}
			if fired.Load() == 0 {
				t.Fatal("the fast path was not taken: the case proves nothing")
			}
			if n := logLen(t, q); n != want {
				t.Errorf("the log has %d events, want %d", n, want)
			}
		})
	}
	mustVerify(t, q)
}

// TestFastPathDeadPooledConnections: the fast path's batch meets idle connections whose
// server processes ended (issue 25). Nothing of it can have committed (the commit mark says
// so), so the group runs the ordinary way, which begins on a live connection: the caller
// sees a success.
func TestFastPathDeadPooledConnections(t *testing.T) {
	dsn := pgtest.Schema(t)
	testConfigHook = func(c *pgxpool.Config) {
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	}
	t.Cleanup(func() { testConfigHook = nil })
	e, q := openEngine(t, dsn, nil)
	ctx := context.Background()
	s := q.Session("s")
	for range 3 {
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
			t.Fatal(err)
		}
	}
	admin := connect(t, dsn)
	// A pooled connection can escape the terminations (busy when they were listed, or
	// found closed and replaced by the pool before the batch), and then the submit proves
	// nothing: terminate and submit again until the fast path meets a dead one.
	submits, met := 3, false
	for attempt := 0; attempt < 10 && !met; attempt++ {
		terminateIdle(t, admin, e.pool, 1)
		other := e.head.fastOther.Load()
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "after"}); err != nil {
			t.Fatalf("submit on dead pooled connections: %v", err)
		}
		submits++
		met = e.head.fastOther.Load() != other
	}
	if !met {
		t.Fatal("the fast path did not meet a dead connection in 10 attempts: the test proves nothing")
	}
	if n := logLen(t, q); n != submits {
		t.Errorf("the log has %d events, want %d", n, submits)
	}
	mustVerify(t, q)
}

// TestFastPathAfterOtherWritersPrune: a prune moves the head's prunes, not its seq. Writer
// B's cache holds a failed task when A prunes it; B's retry of it, run before the lock,
// would write (a task_retried for a task no longer stored): its batch's check sees the
// prunes moved, and the retry runs the ordinary way, where the task is gone.
func TestFastPathAfterOtherWritersPrune(t *testing.T) {
	_, qa, b, qb := twoWriters(t)
	ctx := context.Background()
	base := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	s := qb.Session("s")
	task, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "old"}, base)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := qb.ClaimKindsAt(ctx, []string{"old"}, base.Add(time.Second), time.Hour, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	if _, err := qb.FinishAt(ctx, ds[0], work.Failure("boom"), base.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if res, err := qa.Prune(ctx, base.Add(time.Hour)); err != nil || res.Tasks != 1 {
		t.Fatalf("prune: %+v, %v; want the old task pruned", res, err)
	}
	stale := b.head.fastStale.Load()
	if _, err := s.Retry(ctx, task.ID, time.Time{}); !errors.Is(err, work.ErrTaskNotFound) {
		t.Errorf("B's retry of the task A pruned: %v, want ErrTaskNotFound", err)
	}
	if b.head.fastStale.Load() != stale+1 {
		t.Error("B's retry did not find the prune in its batch's check: the test proves nothing")
	}
	mustVerify(t, qb)
}
