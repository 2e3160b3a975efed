package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

	// killIdle leaves at least 3 idle connections in en's pool, every one of them dead, so
	// that a call meets several dead ones in a row.
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
		terminateIdle(t, admin, en.pool, 3)
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
			// Bounded: a follower waiting for an event never committed (the Submit row
			// failed) fails the row rather than hang the binary.
			fctx, cancel := context.WithTimeout(ctx, time.Minute)
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
			return errors.Join(err, fmt.Errorf("follow ended after %d of the 2 events", n))
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
		ok := t.Run(c.name, func(t *testing.T) {
			killIdle(t, c.e)
			if err := c.call(); err != nil {
				t.Fatalf("%s on a pool of dead connections: %v", c.name, err)
			}
		})
		if !ok && c.name == "Submit" {
			t.Fatal("every later row reads the submitted task: not run")
		}
	}
	if c := kindCounts(t, s); c["before"] != 1 || c["after"] != 1 {
		t.Errorf("tasks by kind: %v, want one before and one after", c)
	}
}

// terminateIdle terminates the server process of every idle connection of pool, waits for
// the processes to exit, and returns once every idle connection is one of those (dead), and
// at least atLeast (a caller that wants several makes them first). The queue's own
// background reads (the inbox's, the clock's) may take or make a connection meanwhile: one
// made while the terminations ran is alive, so it is terminated in the next round (issue
// 25: TestDeadPooledConnections checked the count once, failed its Submit row when such a
// connection appeared, and its Store.Follow row then waited for the unsubmitted event
// forever). The terminated pids are returned.
func terminateIdle(t *testing.T, admin *pgx.Conn, pool *pgxpool.Pool, atLeast int) []int32 {
	t.Helper()
	ctx := context.Background()
	dead := map[int32]bool{}
	var all []int32
	for round := 0; ; round++ {
		var idle, live []int32
		for _, c := range pool.AcquireAllIdle(ctx) {
			pid := c.Conn().PgConn().PID()
			idle = append(idle, int32(pid))
			if !dead[int32(pid)] {
				live = append(live, int32(pid))
			}
			c.Release()
		}
		if len(live) == 0 && len(idle) >= atLeast {
			return all
		}
		if round == 10 {
			t.Fatalf("after %d rounds of terminations the pool has %d idle connections, %d of them alive; want at least %d, all dead",
				round, len(idle), len(live), atLeast)
		}
		if len(live) == 0 {
			// Fewer than atLeast: a background read used up dead ones, or holds one. The new
			// connections are made while every idle one is held: an Acquire beside an idle
			// connection takes it (a dead one, unpinged) rather than make one, and this loop
			// went its ten rounds without a new connection (2 of 30 runs, unloaded).
			held := pool.AcquireAllIdle(ctx)
			for range atLeast - len(held) {
				c, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
			}
			for _, c := range held {
				c.Release()
			}
			continue
		}
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(p) FROM unnest($1::int[]) AS p", live); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the terminated server processes to exit", func() bool {
			var n int
			err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", live).Scan(&n)
			return err == nil && n == 0
		})
		for _, pid := range live {
			dead[pid] = true
		}
		all = append(all, live...)
		if terminateIdleMeanwhile != nil {
			terminateIdleMeanwhile()
		}
	}
}

// terminateIdleMeanwhile, when set, runs after each round of terminateIdle's terminations:
// the test's stand-in for a background read that makes a connection meanwhile.
var terminateIdleMeanwhile func()

// terminateIdle's rounds: a connection made while the terminations ran (here by the hook,
// at the point a background read of the queue's made one) is alive and idle beside the
// dead ones. TestDeadPooledConnections' check before (the idle count equals the count
// terminated) failed its Submit row in this state, 1 run in about 100 under load (4 idle
// connections after the terminations, want the 3 dead ones), and the rows after it counted
// events never submitted: its Store.Follow row waited for one forever. terminateIdle
// terminates the newcomer in a second round.
//
// The hook's state depends on what the queue's background reads do meanwhile (one that
// returns a connection to the pool between the hook's two acquisitions lets the second take
// it rather than make one; one that takes a connection adds a round): a scenario that did
// not reach the state the old check refused is run again on a new queue, at most five
// times (it failed its guard once in 20 whole-package runs under stress).
func TestTerminateIdleConnectionMadeMeanwhile(t *testing.T) {
	for attempt := 1; ; attempt++ {
		if terminateIdleMadeMeanwhile(t) {
			return
		}
		if attempt == 5 {
			t.Fatalf("in %d scenarios the hook never made a connection the old check would refuse", attempt)
		}
		t.Logf("scenario %d: the background reads moved the pool's connections under the hook; again", attempt)
	}
}

// terminateIdleMadeMeanwhile is one scenario of TestTerminateIdleConnectionMadeMeanwhile; it
// reports false, having checked nothing, when the hook did not make the state it is for.
func terminateIdleMadeMeanwhile(t *testing.T) bool {
	dsn := pgtest.Schema(t)
	testConfigHook = func(c *pgxpool.Config) {
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	}
	defer func() { testConfigHook = nil }()
	e, q := openEngine(t, dsn, nil)
	defer q.Close()
	ctx := context.Background()
	admin := connect(t, dsn)
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
	rounds, oldCheck, newcomer := 0, true, int32(0)
	terminateIdleMeanwhile = func() {
		if rounds++; rounds > 1 {
			return
		}
		// Every idle connection is taken (as a pass over them does), so a new one is made.
		idle := e.pool.AcquireAllIdle(ctx)
		c, err := e.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		newcomer = int32(c.Conn().PgConn().PID())
		c.Release()
		for _, c := range idle {
			c.Release()
		}
		oldCheck = int(e.pool.Stat().IdleConns()) == len(idle)
	}
	defer func() { terminateIdleMeanwhile = nil }()
	pids := terminateIdle(t, admin, e.pool, 3)
	if oldCheck || rounds < 2 {
		return false
	}
	var idle []int32
	for _, c := range e.pool.AcquireAllIdle(ctx) {
		idle = append(idle, int32(c.Conn().PgConn().PID()))
		c.Release()
	}
	var alive int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", idle).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	// A background read may have taken a dead connection out of the pool meanwhile (it
	// fails and is closed), so the idle ones are at least terminateIdle's 3, not always the
	// 3 and the newcomer; the newcomer was terminated with the others.
	if alive != 0 || len(idle) < 3 || !slices.Contains(pids, newcomer) {
		t.Fatalf("after terminateIdle: %d idle connections (%d alive), %d terminated (%v), the newcomer %d; want 3 or more, none alive, the newcomer terminated",
			len(idle), alive, len(pids), pids, newcomer)
	}
	for _, pid := range idle {
		if !slices.Contains(pids, pid) {
			t.Fatalf("idle connection %d was not terminated (terminated %v)", pid, pids)
		}
	}
	return true
}
