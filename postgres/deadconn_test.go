package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// Issue 25. Every idle connection of the pool has lost its server process (terminated while
// idle, as TestTerminateWriterUnderLoad's killer does to the writer's last connection, or an
// administrator, idle_session_timeout, a restart). The pool hands them out as if alive (it
// pings only those idle for more than a second: here never, so that the test does not depend
// on timing). Every read and a submit still succeed: their BEGIN, or the first statement of
// a read whose rows nobody has seen yet, failed on a dead connection, where nothing of them
// ran, so they run again on another one (onLive). They used to fail the caller ("FATAL:
// terminating connection due to administrator command"). Each row of the table is one way in
// to the pool — the queue's, the read-only Store's, the Importer's — and fails without the
// retry.
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
	store, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	im, err := OpenImporter(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	admin := connect(t, dsn)

	// killIdle terminates the server process of every idle connection of en's pool (with
	// three more than it had, so that a call meets several dead ones in a row) and waits for
	// them to exit.
	killIdle := func(t *testing.T, en *engine) {
		t.Helper()
		var held []*pgxpool.Conn
		for range 3 {
			c, err := en.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		for _, c := range held {
			c.Release()
		}
		var pids []int32
		for _, c := range en.pool.AcquireAllIdle(ctx) {
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
		if n := en.pool.Stat().IdleConns(); int(n) != len(pids) {
			t.Fatalf("%d idle connections after the terminations, want the %d dead ones", n, len(pids))
		}
	}
	// events counts what fn's read delivers, and checks it is every event.
	countEvents := func(read func(fn func(events.Event) error) error) error {
		n := 0
		if err := read(func(events.Event) error { n++; return nil }); err != nil {
			return err
		}
		if n < 2 {
			return errors.New("missing events")
		}
		return nil
	}

	for _, c := range []struct {
		name string
		e    *engine
		call func() error
	}{
		{"Submit", e, func() error {
			_, err := s.Submit(ctx, work.TaskRequest{Kind: "after"})
			return err
		}},
		{"View", e, func() error {
			ts, err := s.Tasks(ctx, work.TaskFilter{Limit: 10})
			if err == nil && len(ts) != 2 {
				return errors.New("not the two tasks")
			}
			return err
		}},
		{"Verify", e, func() error { return q.Verify(ctx) }},
		{"ReadLog", e, func() error {
			return countEvents(func(fn func(events.Event) error) error { return q.ReadLog(ctx, 0, fn) })
		}},
		{"server clock", e, func() error { _, err := e.serverTime(ctx); return err }},
		{"InboxPending", e, func() error { // the read before a take-in pass (inbox.go)
			pending, err := e.InboxPending(ctx)
			if err == nil && pending {
				return errors.New("an empty inbox reported pending")
			}
			return err
		}},
		{"Importer.LastSeq", im.e, func() error { _, err := im.LastSeq(ctx); return err }},
		{"Store.LastSeq", store.e, func() error { _, err := store.LastSeq(ctx); return err }},
		{"Store.ReadLog", store.e, func() error {
			return countEvents(func(fn func(events.Event) error) error { return store.ReadLog(ctx, 0, fn) })
		}},
		{"Store.Follow", store.e, func() error {
			fctx, cancel := context.WithCancel(ctx)
			defer cancel()
			n := 0
			err := store.Follow(fctx, 0, func(events.Event) error {
				if n++; n == 2 {
					cancel()
				}
				return nil
			})
			if n >= 2 && errors.Is(err, context.Canceled) {
				return nil
			}
			return errors.Join(err, errors.New("follow ended before the events"))
		}},
		{"Store.SessionLog", store.e, func() error {
			return countEvents(func(fn func(events.Event) error) error { return store.SessionLog(ctx, "s", 0, fn) })
		}},
		{"Store.Sessions", store.e, func() error {
			var got []string
			err := store.Sessions(ctx, func(s string) error { got = append(got, s); return nil })
			if err == nil && len(got) != 1 {
				return errors.New("not the one session")
			}
			return err
		}},
		{"Store.ScanTasks", store.e, func() error {
			return store.ScanTasks(ctx, func(*projection.Task) error { return nil })
		}},
		{"Store.ScanWakes", store.e, func() error {
			return store.ScanWakes(ctx, func(*projection.Wake) error { return nil })
		}},
		{"Store.PrunedRanges", store.e, func() error { _, err := store.PrunedRanges(ctx); return err }},
		{"Store.DiskUsage", store.e, func() error { _, err := store.DiskUsage(ctx); return err }},
		{"Store.View", store.e, func() error {
			return store.View(ctx, func(r projection.Reader) error { _, err := r.LastSeq(); return err })
		}},
		{"Store.Verify", store.e, func() error {
			p, err := store.Verify(ctx, VerifyOptions{})
			if err == nil && len(p) > 0 {
				return errors.New(p[0])
			}
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			killIdle(t, c.e)
			if err := c.call(); err != nil {
				t.Fatalf("%s on a pool of dead connections: %v", c.name, err)
			}
		})
	}
	if c := kindCounts(t, s); c["before"] != 1 || c["after"] != 1 {
		t.Errorf("tasks by kind: %v, want one before and one after", c)
	}
}
