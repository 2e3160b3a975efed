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

// TestStatsListsPoliciesAndSchedules: replay stats lists the kind policies (kind, paused,
// MaxRunning, rate and burst) and the live schedules (session, name, rule, zone, next tick),
// in text and in --json, through the real binary.
func TestStatsListsPoliciesAndSchedules(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	for kind, p := range map[string]work.KindPolicy{
		"export":       {MaxRunning: 5},
		"sms.send":     {Rate: 10, Burst: 20},
		"billing.sync": {Paused: true},
	} {
		if err := q.SetKindPolicyAt(ctx, kind, p, t0); err != nil {
			t.Fatal(err)
		}
	}
	s := q.Session("sess_sched")
	for _, sc := range []work.Schedule{
		{Name: "nightly", Cron: "0 9 * * *", TimeZone: "America/New_York", Task: work.TaskRequest{Kind: "report"}},
		{Name: "often", Cron: "@every 1h", Catchup: work.CatchupAll, Task: work.TaskRequest{Kind: "ping"}},
		{Name: "gone", Cron: "@every 1h", Task: work.TaskRequest{Kind: "ping"}},
	} {
		if err := s.SetScheduleAt(ctx, sc, t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RemoveScheduleAt(ctx, "gone", t0); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	var st struct {
		Policies []struct {
			Kind       string  `json:"kind"`
			Paused     bool    `json:"paused"`
			MaxRunning int64   `json:"max_running"`
			Rate       float64 `json:"rate"`
			Burst      int64   `json:"burst"`
		} `json:"kind_policies"`
		Schedules []struct {
			Session, Name, Cron, Kind, Catchup, Next string
			TimeZone                                 string `json:"time_zone"`
		} `json:"schedules"`
	}
	if err := json.Unmarshal([]byte(mustReplay(t, "stats", dir, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Policies) != 3 || st.Policies[0].Kind != "billing.sync" || !st.Policies[0].Paused ||
		st.Policies[1].Kind != "export" || st.Policies[1].MaxRunning != 5 ||
		st.Policies[2].Kind != "sms.send" || st.Policies[2].Rate != 10 || st.Policies[2].Burst != 20 {
		t.Errorf("stats --json kind_policies = %+v", st.Policies)
	}
	if len(st.Schedules) != 2 {
		t.Fatalf("stats --json schedules = %+v, want nightly and often (gone was removed)", st.Schedules)
	}
	n, o := st.Schedules[0], st.Schedules[1]
	if n.Session != "sess_sched" || n.Name != "nightly" || n.Cron != "0 9 * * *" || n.TimeZone != "America/New_York" ||
		n.Kind != "report" || n.Catchup != "latest" || n.Next != "2026-06-01T13:00:00Z" {
		t.Errorf("stats --json nightly = %+v", n)
	}
	if o.Name != "often" || o.Catchup != "all" || o.TimeZone != "" || o.Next != "2026-06-01T01:00:00Z" {
		t.Errorf("stats --json often = %+v", o)
	}

	text := mustReplay(t, "stats", dir)
	for _, want := range []string{"Kind policies: 3", "billing.sync  paused", "export        max running 5",
		"sms.send      rate 10/s, burst 20", "Schedules: 2", `"0 9 * * *" in America/New_York`, "next 2026-06-01T13:00:00Z",
		`"@every 1h" in UTC`, "catchup all"} {
		if !strings.Contains(text, want) {
			t.Errorf("replay stats lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "gone") {
		t.Errorf("replay stats lists the removed schedule:\n%s", text)
	}
}

// TestStatsListsPerSessionPolicy: replay stats shows a policy's FairSessions and
// MaxRunningPerSession, and the slots each session holds at the log's last event; replay log
// shows both fields of the event, in text and in --json.
func TestStatsListsPerSessionPolicy(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	if err := q.SetKindPolicyAt(ctx, "turn", work.KindPolicy{FairSessions: true, MaxRunningPerSession: 2}, t0); err != nil {
		t.Fatal(err)
	}
	for i, sess := range []string{"sess_a", "sess_a", "sess_a", "sess_b"} {
		if _, err := q.Session(sess).SubmitAt(ctx, work.TaskRequest{Kind: "turn"}, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if ds, err := q.ClaimDueAt(ctx, t0.Add(time.Minute), time.Hour, 10); err != nil || len(ds) != 3 {
		t.Fatalf("claim: %d, %v; want sess_a's two and sess_b's one", len(ds), err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	var st struct {
		Policies []struct {
			Kind                 string           `json:"kind"`
			FairSessions         bool             `json:"fair_sessions"`
			MaxRunningPerSession int64            `json:"max_running_per_session"`
			RunningBySession     map[string]int64 `json:"running_by_session"`
		} `json:"kind_policies"`
	}
	if err := json.Unmarshal([]byte(mustReplay(t, "stats", dir, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Policies) != 1 || !st.Policies[0].FairSessions || st.Policies[0].MaxRunningPerSession != 2 ||
		st.Policies[0].RunningBySession["sess_a"] != 2 || st.Policies[0].RunningBySession["sess_b"] != 1 {
		t.Errorf("stats --json kind_policies = %+v", st.Policies)
	}
	text := mustReplay(t, "stats", dir)
	if want := "turn  fair sessions, max running per session 2, sess_a holds 2, sess_b holds 1"; !strings.Contains(text, want) {
		t.Errorf("replay stats lacks %q:\n%s", want, text)
	}
	log := mustReplay(t, "log", dir)
	if !strings.Contains(log, "fair_sessions  max_running_per_session=2") {
		t.Errorf("replay log lacks the policy's per-session fields:\n%s", log)
	}
	js := mustReplay(t, "log", dir, "--json")
	if !strings.Contains(js, `"fair_sessions":true,"max_running_per_session":2`) {
		t.Errorf("replay log --json lacks the policy's per-session fields:\n%s", js)
	}
}
