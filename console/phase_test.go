package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestSessionPagePhases: the session page says which pending tasks are available, scheduled
// or retrying, and its state filter takes a phase as it takes a state.
func TestSessionPagePhases(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	s := q.Session("phases")
	now := time.Now()
	later := now.Add(time.Hour)
	due, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "due"}, now)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "later", RunAt: later}, now)
	if err != nil {
		t.Fatal(err)
	}
	retry, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "flaky"}, now)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimKindsAt(ctx, []string{"flaky"}, now, time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v %v", ds, err)
	}
	if _, err := q.ReleaseAt(ctx, ds[0], work.ReleaseRequest{RunAt: later}, now); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, q, nil)

	page := get(t, srv, "/sessions/phases")
	tasks := page.body[strings.Index(page.body, `<table id="tasks">`):]
	for id, phase := range map[string]string{due.ID: "available", sched.ID: "scheduled", retry.ID: "retrying"} {
		row := tasks[strings.Index(tasks, id):]
		row = row[:strings.Index(row, "</tr>")]
		if !strings.Contains(row, "pending · "+phase) {
			t.Errorf("the row of %s does not say %s: %s", id, phase, row)
		}
	}
	for phase, id := range map[string]string{"available": due.ID, "scheduled": sched.ID, "retrying": retry.ID} {
		r := get(t, srv, "/sessions/phases?state="+phase)
		table := r.body[strings.Index(r.body, `<table id="tasks">`):]
		table = table[:strings.Index(table, "</table>")]
		for _, other := range []string{due.ID, sched.ID, retry.ID} {
			if strings.Contains(table, other) != (other == id) {
				t.Errorf("?state=%s: listing %s is %v", phase, other, other != id)
			}
		}
	}
	if r := get(t, srv, "/sessions/phases?state=queued"); r.code != 400 || !strings.Contains(r.body, "retrying") {
		t.Errorf("an unknown state or phase: %d", r.code)
	}
}
