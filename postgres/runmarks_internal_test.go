package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// Every claim read of the package's tests also counts the marks it used with a stored entry
// below them (runmarks.go); TestMain fails the run when any was (RunMarkViolations).
func init() { checkRunMarks = true }

// noRunMarkCheck turns the checker off for a benchmark (and the worker processes of one):
// it adds a statement to every claim read that the product never sends (0.4 ms a group in
// BenchmarkProcesses, 2026-12-05), so a figure with it on is not the product's.
func noRunMarkCheck(tb testing.TB) {
	was := checkRunMarks
	checkRunMarks = false
	tb.Cleanup(func() { checkRunMarks = was })
}

// NoRunMarkCheck is noRunMarkCheck, for the benchmarks of package postgres_test.
func NoRunMarkCheck(tb testing.TB) { noRunMarkCheck(tb) }

// RunMarkViolations is the count of marks found above a stored entry in this test binary.
func RunMarkViolations() int64 { return runMarkViolations.Load() }

// settleAndClaimLoop settles what the last call claimed and claims up to 16 of kind k,
// rounds times, and returns what the last call claimed.
func settleAndClaimLoop(t *testing.T, q *work.Queue, rounds int) []work.TaskDelivery {
	t.Helper()
	ctx := context.Background()
	var held []work.TaskDelivery
	for range rounds {
		ss := make([]work.Settle, len(held))
		for i, d := range held {
			o := work.Success(nil)
			ss[i] = work.Settle{Delivery: d, Outcome: &o}
		}
		res, ds, err := q.SettleAndClaim(ctx, ss, []string{"k"}, time.Minute, 16)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		held = ds
	}
	return held
}

// TestClaimReadsFromItsMark: after a run of claims, the writer's mark for the run is at most
// the run's first stored entry, and a claim read given the mark steps over the entries of
// the claims before it (deleted, kept by the index until VACUUM) where the same read from
// the run's start visits each of them. Measured in buffers, with autovacuum off for the
// tables: the read from the run's start grows with the claims made, the read from the mark
// does not.
func TestClaimReadsFromItsMark(t *testing.T) {
	const tasks, rounds = 6000, 300 // 4,800 claimed
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	e, q := openEngine(t, dsn, nil)
	c := connect(t, dsn)
	for _, tbl := range []string{"due", "kind_due"} {
		if _, err := c.Exec(ctx, "ALTER TABLE "+pgx.Identifier{e.schema, tbl}.Sanitize()+" SET (autovacuum_enabled = off)"); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < tasks; i += work.MaxSubmitMany {
		rs := make([]work.TaskRequest, min(work.MaxSubmitMany, tasks-i))
		for j := range rs {
			rs[j] = work.TaskRequest{Kind: "k", Input: json.RawMessage(fmt.Sprint(i + j))}
		}
		if _, err := q.Session("s").SubmitMany(ctx, rs); err != nil {
			t.Fatal(err)
		}
	}
	held := settleAndClaimLoop(t, q, rounds)
	if len(held) != 16 {
		t.Fatalf("the last claim took %d tasks, want 16", len(held))
	}
	mk := markKey{projection.IndexKindDue, "k", 0}
	m, ok := e.cache.marks[mk]
	if !ok {
		t.Fatalf("no mark for the run after %d claims: marks %v", rounds, e.cache.marks)
	}
	// The first stored pending entry of the run, and how many stored entries lie below the mark.
	var firstAt, firstSeq, below int64
	kindDue := pgx.Identifier{e.schema, "kind_due"}.Sanitize()
	if err := c.QueryRow(ctx, "SELECT at, seq FROM "+kindDue+" WHERE kind = 'k' AND priority = 0 ORDER BY at, seq LIMIT 1").Scan(&firstAt, &firstSeq); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "SELECT count(*) FROM "+kindDue+" WHERE kind = 'k' AND priority = 0 AND (at, seq) < ($1, $2)", m.at, int64(m.seq)).Scan(&below); err != nil {
		t.Fatal(err)
	}
	if below != 0 {
		t.Fatalf("%d stored entries lie below the mark (%d, %d)", below, m.at, m.seq)
	}
	if m.below(firstAt, uint64(firstSeq)) {
		t.Fatalf("the mark (%d, %d) is above the run's first entry (%d, %d)", m.at, m.seq, firstAt, firstSeq)
	}
	// The read as the writer sends it, with the mark (the cache's head) and from the run's
	// start (a head that does not match: the marks are not used), in buffers.
	var last []byte
	var seq, prunes int64
	if err := c.QueryRow(ctx, e.st.headNow).Scan(&seq, &prunes, &last); err != nil {
		t.Fatal(err)
	}
	if uint64(seq) != e.cache.seq || !bytes.Equal(last, e.cache.last) {
		t.Fatalf("the stored head (%d) is not the cache's (%d)", seq, e.cache.seq)
	}
	i, page := prePageFor(16)
	pris, ats, seqs := markArgs(e.cache.marks, preKey{projection.IndexKindDue, "k"})
	// buffers are the read's buffers in kind_due's indexes (the probe, the page), and its rows.
	// The statement is prepared with its generic plan forced: the plan the server keeps
	// for the writer's prepared statement after a few executions (TestPreScanKeepsItsGenericPlan).
	// (with the statistics of a partition of one priority, whose plans went wrong before:
	// TestPreScanSkipsTheEndOfTheWalk).
	for _, sql := range []string{
		"ANALYZE " + kindDue,
		"SET plan_cache_mode = force_generic_plan",
		"PREPARE scan(bytea, bigint[], bigint[], bigint[], bigint, bigint, bytea) AS " + e.st.pre.scan[projection.IndexKindDue][i],
	} {
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	buffers := func(head headOf) (hits float64, rows float64) {
		t.Helper()
		// EXECUTE takes its values as literals.
		lit := func(v any) string {
			switch v := v.(type) {
			case []byte:
				return fmt.Sprintf(`'\x%x'`, v)
			case []int64:
				return "'{" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(v)), ","), "[]") + "}'"
			}
			return fmt.Sprint(v)
		}
		var vals []string
		for _, v := range append([]any{[]byte("k"), pris, ats, seqs}, head.guardArgs()...) {
			vals = append(vals, lit(v))
		}
		var out []byte
		if err := c.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE scan("+strings.Join(vals, ", ")+")").Scan(&out); err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan map[string]any }
		if err := json.Unmarshal(out, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("plan %s: %v", out, err)
		}
		var walk func(n map[string]any)
		walk = func(n map[string]any) {
			if n["Relation Name"] == "kind_due" {
				h, _ := n["Shared Hit Blocks"].(float64)
				r, _ := n["Shared Read Blocks"].(float64)
				hits += h + r
			}
			kids, _ := n["Plans"].([]any)
			for _, k := range kids {
				if m, ok := k.(map[string]any); ok {
					walk(m)
				}
			}
		}
		walk(plan[0].Plan)
		rows, _ = plan[0].Plan["Actual Rows"].(float64)
		return hits, rows
	}
	fromMark, rowsMark := buffers(headOf{uint64(seq), uint64(prunes), last})
	fromStart, rowsStart := buffers(headOf{})
	if rowsMark != float64(page) || rowsStart != float64(page) {
		t.Fatalf("the reads returned %v (from the mark) and %v (from the start) rows, want a page of %d", rowsMark, rowsStart, page)
	}
	t.Logf("a claim read after %d claims: %.0f buffers of kind_due from the mark, %.0f from the run's start", rounds*16, fromMark, fromStart)
	if fromMark > 16 || fromStart < 3*fromMark {
		t.Errorf("the read from the mark took %.0f buffers of kind_due, from the run's start %.0f: want at most 16, and a third of the read from the start", fromMark, fromStart)
	}
}

// TestRunMarksDroppedWhenAnotherWriterCommits: another writer's put below a run's mark is
// seen by the next claim of the run, though the claim's group did not read the run when it
// found that writer's commit. The writer's marks are of its cache's head; a begin that finds
// another writer's commit drops them all, not only those of the runs it reads then (kept, the
// claim at the end reads kind b from the old mark and takes the 33rd task of the backlog,
// not the one the other writer submitted due an hour before).
func TestRunMarksDroppedWhenAnotherWriterCommits(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	e, q := openEngine(t, dsn, nil)
	_, other := openEngine(t, dsn, nil)
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var rs []work.TaskRequest
	for i := range 200 {
		rs = append(rs, work.TaskRequest{Kind: []string{"a", "b"}[i%2], Input: json.RawMessage(fmt.Sprint(i))})
	}
	if _, err := q.Session("s").SubmitManyAt(ctx, rs, t0); err != nil {
		t.Fatal(err)
	}
	claim := func(kind string, now time.Time, limit int) []work.TaskDelivery {
		t.Helper()
		ds, err := q.ClaimKindsAt(ctx, []string{kind}, now, time.Hour, limit)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	claim("b", t0, 16) // from the server: the plan is {b} after it
	claim("b", t0, 16) // the begin reads b: its mark
	if _, ok := e.cache.marks[markKey{projection.IndexKindDue, "b", 0}]; !ok {
		t.Fatalf("no mark for kind b after two claims: %v", e.cache.marks)
	}
	claim("a", t0, 16) // the plan is {a} after it
	early, err := other.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "b", Input: json.RawMessage(`"early"`), RunAt: t0.Add(-time.Hour)}, t0)
	if err != nil {
		t.Fatal(err)
	}
	claim("a", t0, 16)                                            // finds the other writer's commit; reads a alone
	if ds := claim("b", t0.Add(-2*time.Hour), 16); len(ds) != 0 { // nothing due yet; the plan is {b} after it
		t.Fatalf("claimed %d tasks due before any was", len(ds))
	}
	ds := claim("b", t0, 1) // reads b in the begin, from its mark if it kept one
	if len(ds) != 1 || ds[0].Task.ID != early.ID {
		var got string
		if len(ds) == 1 {
			got = string(ds[0].Task.Input)
		}
		t.Fatalf("the claim of kind b took %q, want the task the other writer submitted due an hour before the backlog", got)
	}
}
