package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, "console")) }

// TestConsoleOnPostgres: the console over a PostgreSQL queue sees what another process (a
// second queue on the same schema) commits, travels back over it, and acts through it.
func TestConsoleOnPostgres(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	a, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	srv := newServer(t, a, withActions())
	s := b.Session("pg-" + hostile)
	tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"a":1}`)}, t0)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := b.ClaimDueAt(ctx, t0.Add(time.Second), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatal(len(ds), err)
	}
	if _, err := b.FinishAt(ctx, ds[0], work.Failure("boom"), t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := get(t, srv, "/tasks/"+tk.ID)
	if r.code != 200 || !strings.Contains(r.body, `id="task-state">failed<`) || strings.Contains(r.body, hostile) {
		t.Fatalf("task page over PostgreSQL: %d", r.code)
	}
	if r := get(t, srv, "/api/tasks/"+tk.ID+"?at_seq=2"); !strings.Contains(r.body, `"state":"running"`) || strings.Contains(r.body, ds[0].LeaseToken()) {
		t.Errorf("past task over PostgreSQL: %s", r.body)
	}
	if r := get(t, srv, "/"); r.code != 200 || !strings.Contains(r.body, "boom") {
		t.Errorf("overview over PostgreSQL: %d", r.code)
	}
	r = post(t, srv, "/api/tasks/"+tk.ID+"/retry", nil)
	if r.code != http.StatusOK || !strings.Contains(r.body, `"state":"pending"`) {
		t.Fatalf("retry over PostgreSQL: %d %s", r.code, r.body)
	}
	got, ok, err := b.Session(s.ID()).Task(ctx, tk.ID)
	if err != nil || !ok || got.State != work.TaskPending {
		t.Fatalf("the other process sees %v %v %v", got.State, ok, err)
	}
	r = post(t, srv, "/api/tasks/"+tk.ID+"/cancel", map[string]string{"Sec-Fetch-Site": "cross-site"})
	if r.code != http.StatusForbidden {
		t.Fatalf("cross-site cancel over PostgreSQL: %d", r.code)
	}
	if r := get(t, srv, "/verify?run=1"); !strings.Contains(r.body, "OK: the stored projection") {
		t.Errorf("verify over PostgreSQL: %s", r.body)
	}

	// The live tail over PostgreSQL: the other process's submit arrives.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(sctx, http.MethodGet, srv.URL+"/log/stream?type=task_submitted&from=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	late, err := b.Session("pg-late").Submit(ctx, work.TaskRequest{Kind: "late"})
	if err != nil {
		t.Fatal(err)
	}
	var buf []byte
	tmp := make([]byte, 1024)
	for !strings.Contains(string(buf), late.ID) {
		n, err := resp.Body.Read(tmp)
		if err != nil {
			t.Fatalf("stream over PostgreSQL ended: %v after %q", err, buf)
		}
		buf = append(buf, tmp[:n]...)
	}
	if !strings.Contains(string(buf), tk.ID) {
		t.Error("the stream from seq 1 lacks the first submit")
	}
}
