package postgres_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestMain starts the package's server. The package's tests mostly wait on it, so its
// longest tests run in parallel (t.Parallel, after the sequential ones, two at a time by
// default): the conformance suites and the tests of a second or longer that change no
// package-level state (no setFor, no hook variable: those stay sequential) and neither
// stop nor freeze the shared server. At a load average of 18 the package once ran past
// the default 10-minute -timeout with them sequential.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, "postgres")) }

// harness runs the conformance suite on postgres.Open, one fresh schema per queue. Reopen
// closes the queue and opens its schema again; after every test the schema is opened once
// more and verified, as the durable harness does with its directories.
func harness(opts *postgres.Options) worktest.Harness { return harnessWith(opts, nil) }

// harnessWith is harness, calling first (when not nil) with each fresh schema's DSN before
// the queue is opened on it.
func harnessWith(opts *postgres.Options, first func(t *testing.T, dsn string)) worktest.Harness {
	var mu sync.Mutex
	dsns := map[*work.Queue]string{}
	open := func(t *testing.T, dsn string) *work.Queue {
		t.Helper()
		q, err := postgres.Open(context.Background(), dsn, opts)
		if err != nil {
			t.Fatalf("postgres.Open: %v", err)
		}
		mu.Lock()
		dsns[q] = dsn
		mu.Unlock()
		return q
	}
	h := worktest.Harness{
		New: func(t *testing.T) *work.Queue {
			dsn := pgtest.Schema(t)
			if first != nil {
				first(t, dsn)
			}
			t.Cleanup(func() {
				q, err := postgres.Open(context.Background(), dsn, opts)
				if err != nil {
					t.Errorf("reopening after the test: %v", err)
					return
				}
				defer q.Close()
				if err := q.Verify(context.Background()); err != nil {
					t.Errorf("Verify of the reopened queue after the test: %v", err)
				}
			})
			return open(t, dsn)
		},
		Reopen: func(t *testing.T, q *work.Queue) *work.Queue {
			mu.Lock()
			dsn, ok := dsns[q]
			mu.Unlock()
			if !ok {
				t.Fatal("Reopen of a queue the harness did not open")
			}
			if err := q.Close(); err != nil {
				t.Fatalf("Close before reopening: %v", err)
			}
			return open(t, dsn)
		},
		SubmitTx: func(t *testing.T, q *work.Queue, session string, r work.TaskRequest, commit bool) (work.Task, error) {
			mu.Lock()
			dsn := dsns[q]
			mu.Unlock()
			c, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			return submitTx(t, c, q, session, r, commit)
		},
	}
	if opts != nil {
		h.MaxValueBytes = opts.MaxValueBytes
	}
	return h
}

// conformanceWriteTimeout is the writer's WriteTimeout in the conformance suite: longer than
// any test binary's -timeout, so that the suite asserts states, never a speed. Some of its
// groups are large by design, to check a limit: submit_many/validation submits
// work.MaxSubmitMany tasks in one group, schedules/catchup_all_bounded submits
// work.MaxTicksPerClaim ticks in one claim (three round trips each under the log head's lock:
// 3,013 in the group). Unloaded they take 0.5–0.9 s; at a load average of 35 on 2 cores one
// took over the default 30 s and failed the case with "work backend failed: timeout"
// (design §7.6). What WriteTimeout bounds, a server that stops answering, is tested with
// timeouts of its own (frozen_test.go, closebound_test.go, failover_test.go); a hang here is
// reported by the test binary's -timeout, with every goroutine's stack.
const conformanceWriteTimeout = time.Hour

// TestConformance runs work/worktest's whole suite on PostgreSQL (in parallel: see
// TestMain; each case has its own schema).
func TestConformance(t *testing.T) {
	t.Parallel()
	worktest.Run(t, harness(&postgres.Options{WriteTimeout: conformanceWriteTimeout}))
}

// TestConformanceSharedWriter runs the suite on a queue whose rounds (SettleAndClaim) another
// queue of the same schema runs (Options.SharedWriter): that queue is elected first, and
// the suite's queue sends it every round while it lives (sharedwriter.go).
func TestConformanceSharedWriter(t *testing.T) {
	t.Parallel()
	opts := &postgres.Options{WriteTimeout: conformanceWriteTimeout, SharedWriter: true}
	var served atomic.Int64 // rounds the elected queues ran for the suite's
	h := harnessWith(opts, func(t *testing.T, dsn string) {
		leader := openShared(t, dsn)
		t.Cleanup(func() {
			_, _, _, n := postgres.SharedWriterState(leader)
			served.Add(n)
			leader.Close()
		})
		waitElected(t, leader, true)
	})
	newQueue, reopen := h.New, h.Reopen
	h.New = func(t *testing.T) *work.Queue {
		q := newQueue(t)
		waitElected(t, q, false)
		return q
	}
	h.Reopen = func(t *testing.T, q *work.Queue) *work.Queue {
		q = reopen(t, q)
		waitElected(t, q, false)
		return q
	}
	worktest.Run(t, h)
	if served.Load() == 0 {
		t.Fatal("no round of the suite went to an elected queue")
	}
	t.Logf("%d rounds of the suite ran in an elected queue", served.Load())
}
