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

// TestPruned runs every command on a store pruned by Queue.Prune: a range at the start of
// the log (seqs 1-6) and one in the middle (8-10).
func TestPruned(t *testing.T) {
	dir, t0 := prunedStore(t, true)
	if v := mustReplay(t, "verify", dir); !strings.Contains(v, "ok") {
		t.Fatalf("verify: %s", v)
	}

	// log: the retained events, each pruned range marked where it was.
	lines := strings.Split(strings.TrimSpace(mustReplay(t, "log", dir)), "\n")
	want := []string{"seqs 1–6 pruned", "kind=c", "seqs 8–10 pruned", "kind=e"}
	if len(lines) != len(want) {
		t.Fatalf("log: %d lines, want %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("log line %d = %q, want it to hold %q", i, lines[i], w)
		}
	}
	if got := mustReplay(t, "log", dir, "--from", "9", "--to", "10"); strings.TrimSpace(got) != "…  seqs 8–10 pruned" {
		t.Errorf("log --from 9 --to 10 = %q, want the one range marked whole", got)
	}
	if got := mustReplay(t, "log", dir, "--session", "s1"); strings.Contains(got, "pruned") {
		t.Errorf("log --session marks pruned ranges of the whole log:\n%s", got)
	}
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(mustReplay(t, "log", "--json", dir)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log --json line %q: %v", l, err)
		}
		recs = append(recs, m)
	}
	if len(recs) != 4 || recs[0]["record"] != "pruned" || recs[0]["from"] != 1.0 || recs[0]["to"] != 6.0 || recs[0]["events"] != 6.0 ||
		recs[1]["seq"] != 7.0 || recs[2]["record"] != "pruned" || recs[2]["from"] != 8.0 || recs[2]["to"] != 10.0 || recs[3]["seq"] != 11.0 {
		t.Errorf("log --json: %v", recs)
	}

	// state: folds the retained events (pruned subjects are absent), by seq and by time,
	// with and without the snapshot cache; before the horizon it says where history begins.
	for _, args := range [][]string{{"--at-seq", "11"}, {"--at-seq", "8"}, {"--no-cache"}, {"--snapshot-every", "10"},
		{"--at", t0.Add(4 * time.Hour).Format(time.RFC3339)}, {"--session", "s1"}} {
		got := mustReplay(t, append([]string{"state", dir}, args...)...)
		if strings.Contains(got, " a ") || strings.Contains(got, " d ") {
			t.Errorf("state %v shows a pruned task:\n%s", args, got)
		}
		if !strings.Contains(got, " c ") {
			t.Errorf("state %v lacks the retained task c:\n%s", args, got)
		}
	}
	if got := mustReplay(t, "state", dir, "--at-seq", "7"); !strings.Contains(got, "1 task") {
		t.Errorf("state --at-seq 7 (the horizon):\n%s", got)
	}
	for _, args := range [][]string{{"--at-seq", "6"}, {"--at-seq", "0"}, {"--at", t0.Add(time.Hour).Format(time.RFC3339)}} {
		r := replay(t, append([]string{"state", dir}, args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, "history begins at seq 7") || r.stdout != "" {
			t.Errorf("state %v before the horizon: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}

	// timeline and task: across the gap; a pruned task is absent, and the error says why.
	if got := mustReplay(t, "timeline", dir, "--session", "s1"); !strings.Contains(got, "c") {
		t.Errorf("timeline:\n%s", got)
	}
	if r := replay(t, "timeline", dir, "--session", "s2"); r.code != exitError || !strings.Contains(r.stderr, "may have been pruned") {
		t.Errorf("timeline of a pruned session: exit %d, stderr %q", r.code, r.stderr)
	}
	id := strings.TrimPrefix(strings.Fields(lines[1])[4], "task=")
	if got := mustReplay(t, "task", dir, id); !strings.Contains(got, "task_submitted") {
		t.Errorf("task %s:\n%s", id, got)
	}
	if r := replay(t, "task", dir, "task_nosuch"); r.code != exitError || !strings.Contains(r.stderr, "history begins at seq 7") {
		t.Errorf("task of an unknown id: exit %d, stderr %q", r.code, r.stderr)
	}

	// stats: the horizon and what was pruned.
	st := mustReplay(t, "stats", dir)
	for _, w := range []string{"2 events, seq 7..11", "9 events in 2 ranges; history begins at seq 7"} {
		if !strings.Contains(st, w) {
			t.Errorf("stats lacks %q:\n%s", w, st)
		}
	}
	var sj struct {
		FirstSeq uint64 `json:"first_seq"`
		Pruned   *prunedStatsJSON
	}
	if err := json.Unmarshal([]byte(mustReplay(t, "stats", "--json", dir)), &sj); err != nil {
		t.Fatal(err)
	}
	if sj.FirstSeq != 7 || sj.Pruned == nil || *sj.Pruned != (prunedStatsJSON{Ranges: 2, Events: 9, Horizon: 7}) {
		t.Errorf("stats --json: first_seq %d, pruned %+v", sj.FirstSeq, sj.Pruned)
	}
}

// A store with nothing pruned reads as before: no marker, no pruned stats.
func TestUnprunedHasNoMarkers(t *testing.T) {
	dir := demoStore(t)
	if got := mustReplay(t, "log", dir); strings.Contains(got, "pruned") {
		t.Errorf("log of an unpruned store marks a pruned range")
	}
	if got := mustReplay(t, "stats", "--json", dir); strings.Contains(got, `"pruned"`) {
		t.Errorf("stats --json of an unpruned store has pruned:\n%s", got)
	}
}
