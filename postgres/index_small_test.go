package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestSmallIndexDeletionUsesTheKey: the commit's deletion from kind_leases, whose table is a
// few rows whenever a connection plans it, runs over its primary key (seqScanOff), not as a
// sequential scan of every dead row since the last vacuum. Counted by the server's own
// statistics of the table (pg_stat_user_tables), which the backends report when they exit.
func TestSmallIndexDeletionUsesTheKey(t *testing.T) {
	schema := pgtest.Schema(t)
	_, q := openEngine(t, schema, nil)
	ctx := context.Background()
	s := q.Session("s")
	// Rounds as the runner's: each settles the last round's 32 tasks, deleting their 32
	// leases in one statement, and claims 32 more. With one lease a deletion, the plan is an
	// index probe anyway; with 32, planned on a table of a few rows, it was a hash join over
	// a sequential scan.
	const batch, rounds = 32, 12
	const n = batch * rounds
	if _, err := s.SubmitMany(ctx, taskRequests(n, "k", false)); err != nil {
		t.Fatal(err)
	}
	var settles []work.Settle
	for range rounds + 1 {
		_, ds, err := q.SettleAndClaim(ctx, settles, nil, time.Minute, batch)
		if err != nil {
			t.Fatal(err)
		}
		settles = settles[:0]
		for _, d := range ds {
			o := work.Success(nil)
			settles = append(settles, work.Settle{Delivery: d, Outcome: &o})
		}
	}
	if len(settles) != 0 {
		t.Fatalf("%d tasks left after %d rounds", len(settles), rounds)
	}
	mustVerify(t, q)
	q.Close() // its backends exit and report their statistics
	conn, err := pgx.Connect(ctx, schema)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var seq, idx int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		err := conn.QueryRow(ctx, `SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_user_tables
			WHERE schemaname = current_schema() AND relname = 'kind_leases'`).Scan(&seq, &idx)
		if err != nil {
			t.Fatal(err)
		}
		if idx+seq >= rounds || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("kind_leases: %d sequential scans, %d index scans", seq, idx)
	if seq >= rounds/2 || idx < rounds {
		t.Errorf("kind_leases was read by %d sequential scans and %d index scans for %d deletions of %d leases: want the deletions by the key", seq, idx, rounds, batch)
	}
}
