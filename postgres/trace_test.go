package postgres

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// testTrace is the tests' tracer (engine.trace): each func, when set, is called at its event.
// Setting one changes nothing the engine does; a test that fails the ordinary commit batch
// also sets engine.ordinaryCommits, or its group may take the fast path.
type testTrace struct {
	commitBatch     func(*pgx.Batch)            // the ordinary commit batch, about to be sent: may queue statements after COMMIT
	beforeCommit    func(*pgx.Conn)             // after commitBatch
	afterCommitSent func(*pgx.Conn)             // the ordinary commit batch is sent, its answers not read
	fastBatch       func(*pgx.Conn, *pgx.Batch) // the fast path's one batch, about to be sent
	recordRead      func()                      // a group reads a record from the server
	keyRead         func(context.Context, int)  // a round of key reads (its context, its reads) is sent
}

func (t *testTrace) sendingCommit(c *pgx.Conn, b *pgx.Batch, fast bool) {
	if fast {
		if t.fastBatch != nil {
			t.fastBatch(c, b)
		}
		return
	}
	if t.commitBatch != nil {
		t.commitBatch(b)
	}
	if t.beforeCommit != nil {
		t.beforeCommit(c)
	}
}

func (t *testTrace) sentCommit(c *pgx.Conn) {
	if t.afterCommitSent != nil {
		t.afterCommitSent(c)
	}
}

func (t *testTrace) readRecord() {
	if t.recordRead != nil {
		t.recordRead()
	}
}

func (t *testTrace) readKeys(ctx context.Context, n int) {
	if t.keyRead != nil {
		t.keyRead(ctx, n)
	}
}

// tracing is e's testTrace, set up the first time.
func tracing(e *engine) *testTrace {
	if e.trace == nil {
		e.trace = &testTrace{}
	}
	return e.trace.(*testTrace)
}

// TestTracerChangesNothing: a tracer sees every commit batch, and setting one keeps the fast
// path (the test hooks it replaced switched it off); only ordinaryCommits does.
func TestTracerChangesNothing(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	submit := func(n int) {
		t.Helper()
		for range n {
			if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	submit(3) // the cache becomes exact and alone
	var fastBatches, ordinary atomic.Int32
	tr := tracing(e)
	tr.fastBatch = func(*pgx.Conn, *pgx.Batch) { fastBatches.Add(1) }
	tr.commitBatch = func(*pgx.Batch) { ordinary.Add(1) }
	const n = 5
	fast := e.head.fast.Load()
	submit(n)
	if got := e.head.fast.Load() - fast; got != n || fastBatches.Load() != n || ordinary.Load() != 0 {
		t.Errorf("traced: %d of %d submits took the fast path; the tracer saw %d fast batches, %d ordinary", got, n, fastBatches.Load(), ordinary.Load())
	}
	e.ordinaryCommits = true
	fast = e.head.fast.Load()
	submit(n)
	e.ordinaryCommits = false
	if got := e.head.fast.Load() - fast; got != 0 || ordinary.Load() != n {
		t.Errorf("ordinaryCommits: %d submits took the fast path; the tracer saw %d ordinary batches of %d", got, ordinary.Load(), n)
	}
	mustVerify(t, q)
}
