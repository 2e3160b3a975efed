package postgres

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestServerClockDecides (issue 27 item 10): the plain methods of a queue from Open use the
// database server's clock, not the host's. Two queues on hosts whose clocks are 30 minutes
// fast and 30 minutes slow (localClock skewed) stamp their tasks with the server's time, and
// the fast one does not take a lease the slow one holds, which a fast host judging leases by
// its own clock would (fencing would hold, but the task would run twice).
func TestServerClockDecides(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	const skew = 30 * time.Minute
	open := func(skew time.Duration) *work.Queue {
		t.Helper()
		old := localClock
		localClock = func() time.Time { return time.Now().Add(skew) }
		defer func() { localClock = old }()
		q, err := Open(ctx, dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		return q
	}
	fast, slow := open(skew), open(-skew)

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	server := func() time.Time {
		t.Helper()
		var now time.Time
		if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}

	// A bound far below the skew, far above a measurement's error on a loaded machine.
	const slack = time.Minute
	before := server()
	a, err := fast.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := slow.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	after := server()
	for _, task := range []work.Task{a, b} {
		if task.CreatedAt.Before(before.Add(-slack)) || task.CreatedAt.After(after.Add(slack)) {
			t.Errorf("task %s created at %v, want the server's time, within [%v, %v]", task.ID, task.CreatedAt, before, after)
		}
	}

	// The slow host claims both for 10 minutes; the fast one, 30 minutes ahead by its own
	// clock, must find nothing due.
	ds, err := slow.ClaimDue(ctx, 10*time.Minute, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("slow host's claim: %d deliveries, %v; want both tasks", len(ds), err)
	}
	stolen, err := fast.ClaimDue(ctx, 10*time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(stolen) != 0 {
		t.Fatalf("the fast host claimed %d live leases: leases judged by the host's clock", len(stolen))
	}
	st, err := fast.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.At.Before(before.Add(-slack)) || st.At.After(server().Add(slack)) {
		t.Errorf("Stats at %v, want the server's time", st.At)
	}
}

// TestServerClockAnchorAndRefresh: serverClock without a server. Now is the measured server
// time plus the local monotonic time elapsed since, whatever the local wall clock says; an
// anchor older than clockRefresh starts one measurement in the background (Now does not
// wait for it), and a measurement with a longer round trip than the anchor's does not
// replace a fresh anchor.
func TestServerClockAnchorAndRefresh(t *testing.T) {
	ctx := context.Background()
	base := time.Now()
	var localAt atomic.Int64 // the fake local clock's offset from base
	serverAhead := time.Hour
	var queries atomic.Int32
	var delay atomic.Int64      // the next query's round trip, on the fake local clock
	gate := make(chan struct{}) // a query with a round trip waits for it
	old := localClock
	localClock = func() time.Time { return base.Add(time.Duration(localAt.Load())) }
	defer func() { localClock = old }()
	engineCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := newServerClock(ctx, engineCtx, func(context.Context) (time.Time, error) {
		queries.Add(1)
		d := time.Duration(delay.Load())
		if d > 0 {
			<-gate
		}
		localAt.Add(int64(d / 2))
		now := base.Add(time.Duration(localAt.Load())).Add(serverAhead)
		localAt.Add(int64(d - d/2))
		return now, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Now().Sub(localClock()); got != serverAhead {
		t.Fatalf("Now is %v ahead of the local clock, want the server's %v", got, serverAhead)
	}
	n := queries.Load()
	localAt.Add(int64(clockRefresh / 2))
	if got := c.Now().Sub(localClock()); got != serverAhead || queries.Load() != n {
		t.Fatalf("a fresh anchor: %v ahead, %d queries; want %v and no query", got, queries.Load()-n, serverAhead)
	}
	// Stale: one background measurement, whose slow round trip (1 s, against the anchor's
	// 0) is not kept while the anchor is younger than 3 refreshes.
	delay.Store(int64(time.Second))
	localAt.Add(int64(clockRefresh))
	if got := c.Now().Sub(localClock()); got != serverAhead {
		t.Fatalf("a stale anchor: %v ahead, want %v", got, serverAhead)
	}
	close(gate)
	deadline := time.Now().Add(time.Minute)
	for queries.Load() == n || c.measuring.Load() {
		if time.Now().After(deadline) {
			t.Fatal("a stale anchor started no measurement")
		}
		time.Sleep(time.Millisecond)
	}
	if s := c.cur.Load(); s.rtt != 0 {
		t.Fatalf("a slower measurement replaced a fresh anchor: rtt %v", s.rtt)
	}
}
