package console_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestSessionCountIsOnlySessions: an event about a kind as a whole (kind_policy_set, whose
// session id is "") is no session; a schedule's events belong to their session and count
// as it. Two sessions, a kind policy and a schedule are 2 sessions on every page that counts
// or lists them, live and at a past seq (issue 44 §2: the overview said 3).
func TestSessionCountIsOnlySessions(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	if _, err := q.Session("a").SubmitAt(ctx, work.TaskRequest{Kind: "k"}, at(0)); err != nil {
		t.Fatal(err)
	}
	if err := q.SetKindPolicyAt(ctx, "k", work.KindPolicy{Paused: true}, at(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Session("b").SubmitAt(ctx, work.TaskRequest{Kind: "k"}, at(2)); err != nil {
		t.Fatal(err)
	}
	if err := q.Session("b").SetScheduleAt(ctx, work.Schedule{Name: "tick", Cron: "@every 1m", Task: work.TaskRequest{Kind: "k"}}, at(3)); err != nil {
		t.Fatal(err)
	}
	if err := q.SetKindPolicyAt(ctx, "k", work.KindPolicy{}, at(4)); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, q, nil)
	for _, c := range []struct {
		suffix string
		want   int
	}{{"", 2}, {"?at_seq=5", 2}, {"?at_seq=2", 1}} {
		if r := get(t, srv, "/"+c.suffix); !strings.Contains(r.body, `<div class="n">`+itoa(c.want)+`</div><div>sessions</div>`) {
			t.Errorf("overview%s: not %d sessions\n%s", c.suffix, c.want, r.body)
		}
		if r := get(t, srv, "/stats"+c.suffix); !strings.Contains(r.body, `<dt>sessions</dt><dd>`+itoa(c.want)+`</dd>`) {
			t.Errorf("stats%s: not %d sessions\n%s", c.suffix, c.want, r.body)
		}
		r := get(t, srv, "/sessions"+c.suffix)
		if n := strings.Count(r.body, `<tr><td><a href=`); n != c.want {
			t.Errorf("sessions%s: %d rows, want %d\n%s", c.suffix, n, c.want, r.body)
		}
		if strings.Contains(r.body, `sessions/?`) || strings.Contains(r.body, `sessions/"`) {
			t.Errorf("sessions%s: a row for the empty session id\n%s", c.suffix, r.body)
		}
	}
	// Session b's row counts its schedule's event as its own: 1 task, 2 events.
	if r := get(t, srv, "/sessions"); !strings.Contains(r.body, `>b</a></td><td class="num">1</td><td class="num">2</td>`) {
		t.Errorf("session b's row lacks its schedule_set\n%s", r.body)
	}
	var j struct {
		Sessions int `json:"sessions"`
	}
	if r := get(t, srv, "/api/stats"); json.Unmarshal([]byte(r.body), &j) != nil || j.Sessions != 2 {
		t.Errorf("api/stats: sessions %d, want 2: %s", j.Sessions, r.body)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestOldestDueAgeInHumanUnits: the overview writes the oldest due age in days (the fixture's
// tasks are due since March 2026), not "6597h27m37.916s"; the JSON twin keeps the machine
// value, a Go duration.
func TestOldestDueAgeInHumanUnits(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	r := get(t, srv, "/")
	i := strings.Index(r.body, `</div><div>oldest due age</div>`)
	if i < 0 {
		t.Fatalf("no oldest due age on the overview\n%s", r.body)
	}
	card := r.body[strings.LastIndex(r.body[:i], `>`)+1 : i]
	if !strings.HasSuffix(card, " days") && !strings.Contains(card, " days ") {
		t.Errorf("oldest due age %q: not in days", card)
	}
	var j struct {
		OldestDueAge string `json:"oldest_due_age"`
	}
	r = get(t, srv, "/api/stats")
	if err := json.Unmarshal([]byte(r.body), &j); err != nil {
		t.Fatal(err)
	}
	if d, err := time.ParseDuration(j.OldestDueAge); err != nil || d < 24*time.Hour {
		t.Errorf("api/stats oldest_due_age %q: not a machine duration over a day (%v)", j.OldestDueAge, err)
	}
}
