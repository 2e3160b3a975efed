package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// prunedStore builds a store whose oldest work was pruned by Queue.Prune: task a (s1) is
// submitted, claimed and finished at t0 (seqs 1-3), task b (s2) is submitted at t0+1h and
// finished at t0+1h (seqs 4-6), c (s1) stays pending (seq 7), d (s2) is finished at t0+2h
// (seqs 8-10) and e (s1) submitted at t0+3h (seq 11). Prune before t0+90m removes a and b:
// the log begins at seq 7. It returns the store and t0.
func prunedStore(t *testing.T, middle bool) (string, time.Time) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	ctx := context.Background()
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	run := func(session, kind string, at time.Time) {
		t.Helper()
		if _, err := q.Session(session).SubmitAt(ctx, work.TaskRequest{Kind: kind, Input: json.RawMessage(`{}`)}, at); err != nil {
			t.Fatal(err)
		}
		ds, err := q.ClaimDueAt(ctx, at, time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim %s: %v %v", kind, ds, err)
		}
		if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), at); err != nil {
			t.Fatal(err)
		}
	}
	submit := func(session, kind string, at time.Time) {
		t.Helper()
		if _, err := q.Session(session).SubmitAt(ctx, work.TaskRequest{Kind: kind, Input: json.RawMessage(`{}`), RunAt: at.Add(24 * time.Hour)}, at); err != nil {
			t.Fatal(err)
		}
	}
	run("s1", "a", t0)
	run("s2", "b", t0.Add(time.Hour))
	submit("s1", "c", t0.Add(time.Hour+time.Minute))
	run("s2", "d", t0.Add(2*time.Hour))
	submit("s1", "e", t0.Add(3*time.Hour))
	before := t0.Add(90 * time.Minute)
	if middle {
		before = t0.Add(150 * time.Minute) // d too: a gap in the middle, seqs 8-10
	}
	if _, err := q.Prune(ctx, before); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, t0
}

func TestPrunedLog(t *testing.T) {
	dir, _ := prunedStore(t, true)
	out := mustReplay(t, "log", dir)
	t.Log(out)
	out = mustReplay(t, "log", "--json", dir)
	t.Log(out)
	out = mustReplay(t, "stats", dir)
	t.Log(out)
	out = mustReplay(t, "state", dir, "--at-seq", "11")
	t.Log(out)
	out = mustReplay(t, "timeline", dir)
	t.Log(out)
	_ = strings.Contains
}
