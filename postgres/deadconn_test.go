package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// Issue 25. Every idle connection of the pool has lost its server process (terminated while
// idle, as TestTerminateWriterUnderLoad's killer does to the writer's last connection, or an
// administrator, idle_session_timeout, a restart). The pool hands them out as if alive (it
// pings only those idle for more than a second: here never, so that the test does not depend
// on timing). A read and a submit still succeed: their BEGIN failed on a dead connection,
// where nothing of them ran, so they begin again on another one. They used to fail the caller
// ("FATAL: terminating connection due to administrator command"); Verify's read too.
func TestDeadPooledConnections(t *testing.T) {
	dsn := pgtest.Schema(t)
	testConfigHook = func(c *pgxpool.Config) {
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	}
	t.Cleanup(func() { testConfigHook = nil })
	e, q := openEngine(t, dsn, nil)
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	admin := connect(t, dsn)
	// killIdle terminates the server process of every idle connection of the pool (with
	// three more than it had, so that a BEGIN meets several dead ones in a row) and waits
	// for them to exit.
	killIdle := func() {
		t.Helper()
		var held []*pgxpool.Conn
		for range 3 {
			c, err := e.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		for _, c := range held {
			c.Release()
		}
		var pids []int32
		for _, c := range e.pool.AcquireAllIdle(ctx) {
			pids = append(pids, int32(c.Conn().PgConn().PID()))
			c.Release()
		}
		if len(pids) < 3 {
			t.Fatalf("%d idle connections, want at least 3", len(pids))
		}
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(p) FROM unnest($1::int[]) AS p", pids); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the terminated server processes to exit", func() bool {
			var n int
			err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids).Scan(&n)
			return err == nil && n == 0
		})
		if n := e.pool.Stat().IdleConns(); int(n) != len(pids) {
			t.Fatalf("%d idle connections after the terminations, want the %d dead ones", n, len(pids))
		}
	}

	killIdle()
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "after"}); err != nil {
		t.Fatalf("Submit on a pool of dead connections: %v", err)
	}
	killIdle()
	if ts, err := s.Tasks(ctx, work.TaskFilter{Limit: 10}); err != nil || len(ts) != 2 {
		t.Fatalf("Tasks on a pool of dead connections = %d tasks, %v; want the two", len(ts), err)
	}
	killIdle()
	mustVerify(t, q)
	// The inbox's read before a take-in pass (InboxPending) asks again on another connection.
	killIdle()
	if pending, err := e.InboxPending(ctx); err != nil || pending {
		t.Fatalf("InboxPending on a pool of dead connections = %v, %v; want an empty inbox", pending, err)
	}
	if c := kindCounts(t, s); c["before"] != 1 || c["after"] != 1 {
		t.Errorf("tasks by kind: %v, want one before and one after", c)
	}
}
