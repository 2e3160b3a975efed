package postgres

import (
	"context"
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
