package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestCatchupAllRoundTrips (issue 23): a claim that submits a CatchupAll schedule's 1,000
// missed ticks holds the log head for a handful of round trips, not a few per tick: the
// ticks' keys are read in one statement (= ANY), the schedule once per group, and its
// writes go with the commit. It took 3,013 for 1,000 ticks (the schedule read twice and
// written once per tick, and each tick's key read alone), so at a 10 ms round trip the
// group outlived WriteTimeout and no claim of any kind succeeded (design §7.6).
func TestCatchupAllRoundTrips(t *testing.T) {
	_, q, tc := openCounted(t, pgtest.Schema(t))
	ctx := context.Background()
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	sc := work.Schedule{Name: "fast", Cron: "@every 1s", Task: work.TaskRequest{Kind: "k"}, Catchup: work.CatchupAll}
	if err := q.Session("s").SetScheduleAt(ctx, sc, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ClaimDueAt(ctx, t0, time.Minute, 1); err != nil { // prepares the claim's statements
		t.Fatal(err)
	}
	tc.n.Store(0)
	ds, err := q.ClaimDueAt(ctx, t0.Add(2000*time.Second), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %d deliveries, %v", len(ds), err)
	}
	trips := tc.n.Load()
	st, err := q.StatsAt(ctx, t0.Add(2000*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if st.Total.Pending+st.Total.Running != work.MaxTicksPerClaim {
		t.Fatalf("the claim submitted %d ticks, want %d", st.Total.Pending+st.Total.Running, work.MaxTicksPerClaim)
	}
	t.Logf("a claim submitting %d ticks: %d round trips", work.MaxTicksPerClaim, trips)
	if trips > 30 {
		t.Errorf("a claim submitting %d ticks took %d round trips, want a handful (at most 30)", work.MaxTicksPerClaim, trips)
	}
	mustVerify(t, q)
}
