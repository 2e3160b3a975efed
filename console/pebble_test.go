package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/console"
	"github.com/worklog/worklog/work"
)

// On a Pebble store (the durable queue), with history pruned: a pruned point in time and a
// pruned task get a clear page (410), never a 500; the rest of the console still answers.
func TestPrunedHistoryOnPebble(t *testing.T) {
	ctx := context.Background()
	q, err := work.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	s := q.Session("s")
	old, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "old"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, t0.Add(time.Second), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatal(len(ds), err)
	}
	if _, err := q.FinishAt(ctx, ds[0], work.Success(json.RawMessage(`1`)), t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	// A console that read the task before the prune.
	before, err := console.New(q, nil)
	if err != nil {
		t.Fatal(err)
	}
	keep, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "keep"}, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := q.Prune(ctx, t0.Add(time.Minute)); err != nil || res.Tasks != 1 {
		t.Fatalf("prune: %+v %v", res, err)
	}
	srv := newServer(t, q, withActions())
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/?at_seq=2", http.StatusGone, "was pruned"},
		{"/api/tasks/" + keep.ID + "?at_seq=1", http.StatusGone, "was pruned"},
		{"/tasks/" + old.ID, http.StatusNotFound, "no task"},
		{"/tasks/" + keep.ID, http.StatusOK, "keep"},
		{"/", http.StatusOK, "Overview"},
		{"/log", http.StatusOK, keep.ID},
		{"/verify?run=1", http.StatusOK, "1 pruned range"},
	} {
		r := get(t, srv, c.path)
		if r.code != c.code || !strings.Contains(r.body, c.want) {
			t.Errorf("GET %s: %d, want %d with %q\n%s", c.path, r.code, c.code, c.want, r.body)
		}
	}
	// The console that knew the task: its page says the history is gone.
	srv2 := newServerHandler(t, before)
	r := get(t, srv2, "/tasks/"+old.ID)
	if r.code != http.StatusGone || !strings.Contains(r.body, "pruned") {
		t.Errorf("a task pruned under a running console: %d %s", r.code, r.body)
	}
	// Cancel on the durable queue, through the console.
	r = post(t, srv, "/api/tasks/"+keep.ID+"/cancel", nil)
	if r.code != http.StatusOK || !strings.Contains(r.body, `"state":"canceled"`) {
		t.Errorf("cancel on Pebble: %d %s", r.code, r.body)
	}
}
