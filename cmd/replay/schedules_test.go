package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestScheduleHistory: replay shows a schedule's history and each tick's task, in the log
// line, the JSON, the session's timeline (which lists its schedules) and replay task.
func TestScheduleHistory(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	s := q.Session("sess_sched")
	sc := work.Schedule{Name: "nightly", Cron: "0 9 * * *", TimeZone: "Europe/Paris", Catchup: work.CatchupAll,
		Task: work.TaskRequest{Kind: "report", Input: json.RawMessage(`{"r":1}`)}}
	if err := s.SetScheduleAt(ctx, sc, t0); err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, t0.Add(50*time.Hour), time.Minute, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	if err := s.RemoveScheduleAt(ctx, "nightly", t0.Add(51*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	tick := ds[0].Task

	log := mustReplay(t, "log", dir)
	for _, want := range []string{"schedule_set", "schedule=nightly", `cron="0 9 * * *"`, "tz=Europe/Paris", "catchup=all",
		"tick=2026-06-01T07:00:00.000Z", "schedule_removed"} {
		if !strings.Contains(log, want) {
			t.Errorf("replay log lacks %q:\n%s", want, log)
		}
	}
	js := mustReplay(t, "log", dir, "--json")
	for _, want := range []string{`"event":"schedule_set"`, `"schedule":"nightly"`, `"tick":"2026-06-01T07:00:00Z"`, `"catchup":"all"`, `"event":"schedule_removed"`} {
		if !strings.Contains(js, want) {
			t.Errorf("replay log --json lacks %s:\n%s", want, js)
		}
	}
	tl := mustReplay(t, "timeline", dir, "--session", "sess_sched")
	for _, want := range []string{"schedule nightly: removed", `set: "0 9 * * *" in Europe/Paris`, "submitted as task " + tick.ID, "removed: no more ticks"} {
		if !strings.Contains(tl, want) {
			t.Errorf("replay timeline lacks %q:\n%s", want, tl)
		}
	}
	task := mustReplay(t, "task", dir, tick.ID)
	if !strings.Contains(task, "the tick 2026-06-01T07:00:00.000Z of schedule nightly") {
		t.Errorf("replay task of a tick's task does not say so:\n%s", task)
	}
}
