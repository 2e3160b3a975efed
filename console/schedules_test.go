package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

type apiSchedule struct {
	Session, Name, Cron, Kind, Next, Catchup string
	TimeZone                                 string   `json:"time_zone"`
	Following                                []string `json:"next_ticks"`
	LastTick                                 string   `json:"last_tick"`
	LastTask                                 string   `json:"last_task"`
	Ticks                                    uint64
	Removed                                  bool
}

func schedulesOf(t *testing.T, srv *httptest.Server, u string) []apiSchedule {
	t.Helper()
	var out struct{ Schedules []apiSchedule }
	if c := getJSON(t, srv, u, &out); c != 200 {
		t.Fatalf("GET %s: %d", u, c)
	}
	return out.Schedules
}

// TestSchedulesPage: every schedule of every session with its rule, zone, next tick, the
// ticks after it (in its zone) and its last submitted tick with that tick's task; a past seq
// shows the schedule as it was (before its tick); remove is one schedule_removed, offered
// only with actions on and now.
func TestSchedulesPage(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	a, b := q.Session("billing"), q.Session("reports")
	if err := a.SetScheduleAt(ctx, work.Schedule{Name: "hourly", Cron: "0 * * * *", Task: work.TaskRequest{Kind: "invoice"}}, t0); err != nil {
		t.Fatal(err)
	}
	if err := b.SetScheduleAt(ctx, work.Schedule{Name: "nightly", Cron: "30 2 * * *", TimeZone: "America/New_York", Task: work.TaskRequest{Kind: "report"}, Catchup: work.CatchupAll}, t0); err != nil {
		t.Fatal(err)
	}
	setSeq := func() uint64 { return headSeq(t, q) }()
	// A claim an hour and a half later submits the 10:00 tick of "hourly".
	if _, err := q.ClaimKindsAt(ctx, []string{"none"}, t0.Add(90*time.Minute), time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, q, withActions())
	rows := schedulesOf(t, srv, srv.URL+"/api/schedules")
	if len(rows) != 2 {
		t.Fatalf("%d schedules: %+v", len(rows), rows)
	}
	h, n := rows[0], rows[1]
	if h.Session != "billing" || h.Name != "hourly" || h.Cron != "0 * * * *" || h.TimeZone != "UTC" || h.Kind != "invoice" ||
		h.LastTick != "2026-03-02T10:00:00Z" || h.Ticks != 1 || h.LastTask == "" || h.Next != "2026-03-02T11:00:00Z" ||
		strings.Join(h.Following, ",") != "2026-03-02T12:00:00Z,2026-03-02T13:00:00Z,2026-03-02T14:00:00Z" {
		t.Fatalf("hourly: %+v", h)
	}
	if tk := taskState(t, q, "billing", h.LastTask); tk != work.TaskPending {
		t.Errorf("the last tick's task: %v", tk)
	}
	// 02:30 in New York is 07:30 UTC (EST, before the March change).
	if n.Next != "2026-03-03T07:30:00Z" || n.Following[0] != "2026-03-04T07:30:00Z" || n.TimeZone != "America/New_York" || n.Catchup != "all" || n.LastTick != "" {
		t.Fatalf("nightly: %+v", n)
	}
	// In the past, before the tick.
	past := schedulesOf(t, srv, fmt.Sprintf("%s/api/schedules?at_seq=%d", srv.URL, setSeq))
	if past[0].Ticks != 0 || past[0].LastTick != "" || past[0].Next != "2026-03-02T10:00:00Z" {
		t.Fatalf("hourly in the past: %+v", past[0])
	}
	if past := schedulesOf(t, srv, srv.URL+"/api/schedules?at_seq=1"); len(past) != 1 {
		t.Fatalf("at seq 1: %+v", past)
	}
	page := get(t, srv, "/schedules")
	if page.code != 200 || strings.Count(page.body, `class="remove-btn"`) != 2 || !strings.Contains(page.body, "America/New_York") {
		t.Fatalf("/schedules: %d", page.code)
	}
	if p := get(t, srv, fmt.Sprintf("/schedules?at_seq=%d", setSeq)); strings.Contains(p.body, "remove-btn") || !strings.Contains(p.body, `id="past-banner"`) {
		t.Error("a past schedules page offers remove, or has no banner")
	}
	ro := newServer(t, q, nil)
	head := headSeq(t, q)
	if r := post(t, ro, "/api/schedules/billing/hourly/remove", nil); r.code != http.StatusForbidden {
		t.Errorf("read-only remove: %d", r.code)
	}
	if p := get(t, ro, "/schedules"); strings.Contains(p.body, "remove-btn") {
		t.Error("a read-only page offers remove")
	}
	if headSeq(t, q) != head {
		t.Fatal("a refused remove moved the log")
	}
	// Remove.
	if r := post(t, srv, "/api/schedules/billing/hourly/remove", nil); r.code != 200 {
		t.Fatalf("remove: %d %s", r.code, r.body)
	}
	if scs, _ := a.Schedules(ctx); len(scs) != 0 {
		t.Fatalf("after remove: %+v", scs)
	}
	rows = schedulesOf(t, srv, srv.URL+"/api/schedules")
	if !rows[0].Removed || rows[0].Next != "" || rows[1].Removed {
		t.Fatalf("after remove: %+v", rows)
	}
	if r := post(t, srv, "/api/schedules/billing/hourly/remove", nil); r.code != http.StatusNotFound {
		t.Errorf("remove again: %d %s", r.code, r.body)
	}
}

// TestActionsOnNamesThatLookLikePaths: a kind, session and schedule name holding "/", quotes
// and a script reach their actions through the escaped links of the pages.
func TestActionsOnNamesThatLookLikePaths(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, withActions())
	for _, p := range []string{"/schedules", "/kinds"} {
		if r := get(t, srv, p); !strings.Contains(r.body, esc(hostile)) {
			t.Fatalf("%s does not link the escaped name", p)
		}
	}
	if r := post(t, srv, "/api/kinds/"+esc(hostile)+"/resume", nil); r.code != 200 || !strings.Contains(r.body, `"paused":false`) {
		t.Fatalf("resume: %d %s", r.code, r.body)
	}
	if r := post(t, srv, "/api/schedules/"+esc(hostile)+"/"+esc(hostile)+"/remove", nil); r.code != 200 {
		t.Fatalf("remove: %d %s", r.code, r.body)
	}
	if scs, err := f.q.Session(hostile).Schedules(context.Background()); err != nil || len(scs) != 0 {
		t.Fatalf("after remove: %v %v", scs, err)
	}
}
