package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

type apiTaskRow struct {
	ID, Session, Kind, State string
	Key                      string `json:"idempotency_key"`
	SubmitSeq                uint64 `json:"submitted_seq"`
}

type apiTasksPage struct {
	AtSeq  uint64       `json:"at_seq"`
	Tasks  []apiTaskRow `json:"tasks"`
	Before uint64       `json:"next_before"`
}

func getJSON(t *testing.T, srv interface{ Client() *http.Client }, url string, v any) int {
	t.Helper()
	r, err := srv.Client().Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %d, not JSON: %v", url, r.StatusCode, err)
	}
	return r.StatusCode
}

// bigQueue is 250 tasks over two sessions and two kinds, each fifth failed, the rest pending.
func bigQueue(t *testing.T) (*work.Queue, []string) {
	t.Helper()
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	var ids []string
	for i := range 250 {
		kind := []string{"a", "b"}[i%2]
		s := q.Session(fmt.Sprintf("s%d", i%3))
		req := work.TaskRequest{Kind: kind, IdempotencyKey: fmt.Sprintf("key-%d", i), Input: json.RawMessage(`{}`)}
		if i%5 != 0 {
			req.RunAt = t0.Add(24 * time.Hour) // not claimable by the claims below
		}
		tk, err := s.SubmitAt(ctx, req, t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tk.ID)
		if i%5 == 0 {
			ds, err := q.ClaimKindsAt(ctx, []string{kind}, t0.Add(time.Duration(i)*time.Second), time.Minute, 1)
			if err != nil || len(ds) != 1 || ds[0].Task.ID != tk.ID {
				t.Fatalf("claim: %v %v", ds, err)
			}
			if _, err := q.FinishAt(ctx, ds[0], work.Failure("boom"), t0.Add(time.Duration(i)*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return q, ids
}

// allPages follows next_before from the first page of /api/tasks?query to the last.
func allPages(t *testing.T, srv interface{ Client() *http.Client }, base, query string) []apiTaskRow {
	t.Helper()
	var out []apiTaskRow
	q := query
	for range 100 {
		var pg apiTasksPage
		if c := getJSON(t, srv, base+"/api/tasks?"+q, &pg); c != 200 {
			t.Fatalf("GET /api/tasks?%s: %d", q, c)
		}
		if len(pg.Tasks) > 100 {
			t.Fatalf("a page of %d rows", len(pg.Tasks))
		}
		out = append(out, pg.Tasks...)
		if pg.Before == 0 {
			return out
		}
		v, _ := url.ParseQuery(query)
		v.Set("before", fmt.Sprint(pg.Before))
		q = v.Encode()
	}
	t.Fatal("the pages never end")
	return nil
}

// TestTasksListFilterAndPages: /api/tasks lists every task newest first in pages of at most
// 100 that together hold each matching task exactly once; each filter (state, kind,
// session, q by id and by key) keeps exactly the tasks it names; a past at_seq shows each
// task's state then.
func TestTasksListFilterAndPages(t *testing.T) {
	q, ids := bigQueue(t)
	srv := newServer(t, q, nil)
	all := allPages(t, srv, srv.URL, "")
	if len(all) != len(ids) {
		t.Fatalf("%d rows over the pages, want %d", len(all), len(ids))
	}
	for i, r := range all {
		if want := ids[len(ids)-1-i]; r.ID != want {
			t.Fatalf("row %d: %s, want %s (newest first)", i, r.ID, want)
		}
	}
	count := func(query string, keep func(i int) bool) {
		t.Helper()
		rows := allPages(t, srv, srv.URL, query)
		var want []string
		for i := len(ids) - 1; i >= 0; i-- {
			if keep(i) {
				want = append(want, ids[i])
			}
		}
		if len(rows) != len(want) {
			t.Fatalf("%s: %d rows, want %d", query, len(rows), len(want))
		}
		for i := range rows {
			if rows[i].ID != want[i] {
				t.Fatalf("%s: row %d is %s, want %s", query, i, rows[i].ID, want[i])
			}
		}
	}
	count("state=failed", func(i int) bool { return i%5 == 0 })
	count("state=pending", func(i int) bool { return i%5 != 0 })
	count("kind=b", func(i int) bool { return i%2 == 1 })
	count("session=s1", func(i int) bool { return i%3 == 1 })
	count("session=s1&state=failed&kind=a", func(i int) bool { return i%3 == 1 && i%5 == 0 && i%2 == 0 })
	count("q="+ids[17], func(i int) bool { return i == 17 })
	count("q=key-42", func(i int) bool { return i == 42 })
	count("q=key-42&state=failed", func(int) bool { return false })
	count("q=nothing", func(int) bool { return false })

	// In the past: at the seq of task 10's submission, task 10 is pending (its failure came
	// after) and no later task is listed.
	var pg apiTasksPage
	getJSON(t, srv, srv.URL+"/api/tasks?q="+ids[10], &pg)
	sub := pg.Tasks[0].SubmitSeq
	getJSON(t, srv, fmt.Sprintf("%s/api/tasks?at_seq=%d", srv.URL, sub), &pg)
	if len(pg.Tasks) == 0 || pg.Tasks[0].ID != ids[10] || pg.Tasks[0].State != "pending" || pg.AtSeq != sub {
		t.Fatalf("at seq %d: %+v", sub, pg.Tasks[:min(2, len(pg.Tasks))])
	}
	getJSON(t, srv, fmt.Sprintf("%s/api/tasks?state=failed&at_seq=%d", srv.URL, sub), &pg)
	if len(pg.Tasks) != 2 { // tasks 0 and 5
		t.Fatalf("failed at seq %d: %d rows", sub, len(pg.Tasks))
	}

	// The page: rows, a next-page link keeping the filter, the filter shown.
	r := get(t, srv, "/tasks?kind=a")
	if r.code != 200 || strings.Count(r.body, `<tr class="s-`) != 100 || !strings.Contains(r.body, `id="next-page"`) || !strings.Contains(r.body, "?before=71&amp;kind=a") {
		t.Fatalf("/tasks?kind=a: %d", r.code)
	}
	if r := get(t, srv, "/tasks?state=nope"); r.code != 400 || !strings.Contains(r.body, "state") {
		t.Errorf("bad state: %d", r.code)
	}
	if r := get(t, srv, "/api/tasks?before=x"); r.code != 400 || !strings.Contains(r.body, "before") {
		t.Errorf("bad before: %d %s", r.code, r.body)
	}
}

type bulkAnswer struct {
	Matched, Acted, Skipped int
}

func postBulk(t *testing.T, srv interface{ Client() *http.Client }, u string) (int, bulkAnswer, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, nil)
	r, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var b strings.Builder
	var a bulkAnswer
	buf := make([]byte, 1<<16)
	n, _ := r.Body.Read(buf)
	b.Write(buf[:n])
	_ = json.Unmarshal(buf[:n], &a)
	return r.StatusCode, a, b.String()
}

// TestBulkRetryAndCancel: a bulk retry acts on every failed task the filter matches and
// answers how many; repeated, it acts on none and skips them (safe to repeat); a bulk cancel
// over a kind cancels its pending tasks; the past and a read-only console are refused.
func TestBulkRetryAndCancel(t *testing.T) {
	q, ids := bigQueue(t)
	srv := newServer(t, q, withActions())
	code, a, body := postBulk(t, srv, srv.URL+"/api/tasks/retry?state=failed&kind=a")
	if code != 200 || a.Acted != 25 || a.Matched != 25 || a.Skipped != 0 { // i%10 == 0
		t.Fatalf("bulk retry: %d %s", code, body)
	}
	for i, id := range ids {
		st := taskState(t, q, fmt.Sprintf("s%d", i%3), id)
		want := work.TaskPending
		if i%5 == 0 && i%2 == 1 {
			want = work.TaskFailed
		}
		if st != want {
			t.Fatalf("task %d: %v, want %v", i, st, want)
		}
	}
	// Again: nothing failed of kind a is left; the same filter without state skips.
	if code, a, body = postBulk(t, srv, srv.URL+"/api/tasks/retry?state=failed&kind=a"); code != 200 || a.Acted != 0 {
		t.Fatalf("repeated: %d %s", code, body)
	}
	if code, a, body = postBulk(t, srv, srv.URL+"/api/tasks/retry?kind=b"); code != 200 || a.Acted != 25 || a.Skipped != 100 {
		t.Fatalf("retry kind b: %d %s", code, body)
	}
	// Cancel session s2's tasks: every one pending now.
	if code, a, body = postBulk(t, srv, srv.URL+"/api/tasks/cancel?session=s2"); code != 200 || a.Acted != 83 || a.Skipped != 0 {
		t.Fatalf("cancel s2: %d %s", code, body)
	}
	if code, a, body = postBulk(t, srv, srv.URL+"/api/tasks/cancel?session=s2"); code != 200 || a.Acted != 0 || a.Skipped != 83 {
		t.Fatalf("cancel s2 again: %d %s", code, body)
	}
	var pg apiTasksPage
	getJSON(t, srv, srv.URL+"/api/tasks?session=s2&state=canceled", &pg)
	if len(pg.Tasks) != 83 {
		t.Fatalf("canceled in s2: %d", len(pg.Tasks))
	}
	// The past is refused, and so is a filter it cannot read.
	head := headSeq(t, q)
	if code, _, body = postBulk(t, srv, srv.URL+"/api/tasks/retry?at_seq=3"); code != http.StatusConflict || !strings.Contains(body, "at_seq") {
		t.Errorf("bulk in the past: %d %s", code, body)
	}
	if code, _, body = postBulk(t, srv, srv.URL+"/api/tasks/cancel?state=done"); code != http.StatusBadRequest || !strings.Contains(body, "state") {
		t.Errorf("bad filter: %d %s", code, body)
	}
	ro := newServer(t, q, nil)
	for _, p := range []string{"/api/tasks/retry", "/api/tasks/cancel?kind=a"} {
		if code, _, body = postBulk(t, ro, ro.URL+p); code != http.StatusForbidden {
			t.Errorf("read-only %s: %d %s", p, code, body)
		}
	}
	if headSeq(t, q) != head {
		t.Error("a refused bulk action moved the log")
	}
}

// TestBulkFormRedirects: the /tasks page's bulk form is answered with the list again, saying
// what was done; the buttons are there only with actions on and now.
func TestBulkFormRedirects(t *testing.T) {
	q, _ := bigQueue(t)
	srv := newServer(t, q, withActions())
	r := post(t, srv, "/api/tasks/retry?state=failed", map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if r.code != http.StatusSeeOther || !strings.HasPrefix(r.hdr.Get("Location"), "../../tasks?") || !strings.Contains(r.hdr.Get("Location"), "acted=50") {
		t.Fatalf("%d %v", r.code, r.hdr)
	}
	if p := get(t, srv, "/tasks?state=failed"); !strings.Contains(p.body, `id="bulk-retry"`) || !strings.Contains(p.body, `<input type="hidden" name="state" value="failed">`) {
		t.Error("no bulk buttons with actions on")
	}
	if p := get(t, srv, "/tasks?at_seq=3"); strings.Contains(p.body, `id="bulk-retry"`) || !strings.Contains(p.body, `id="past-banner"`) {
		t.Error("bulk buttons in the past, or no banner")
	}
	ro := newServer(t, q, nil)
	if p := get(t, ro, "/tasks"); strings.Contains(p.body, `id="bulk-retry"`) {
		t.Error("bulk buttons on a read-only console")
	}
}

// TestBulkCancelBeyondOneBatch: a filter matching more than one batch (500) acts on every
// task, each once: 1,201 pending tasks, all canceled, and the answer says 1,201.
func TestBulkCancelBeyondOneBatch(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	reqs := make([]work.TaskRequest, 1201)
	for i := range reqs {
		reqs[i] = work.TaskRequest{Kind: "bulk"}
	}
	if _, err := q.Session("many").SubmitManyAt(ctx, reqs, t0); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, q, withActions())
	if code, a, body := postBulk(t, srv, srv.URL+"/api/tasks/cancel?kind=bulk"); code != 200 || a.Acted != 1201 || a.Matched != 1201 {
		t.Fatalf("%d %s", code, body)
	}
	st, err := q.Stats(ctx)
	if err != nil || st.Total.Canceled != 1201 || st.Total.Pending != 0 {
		t.Fatalf("%+v %v", st.Total, err)
	}
}
