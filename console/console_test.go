package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/console"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// hostile is a string in every place a user writes one: each is a script that must never
// reach a page unescaped.
const hostile = `<script>alert("x")</script>`

// fixture is a queue with a task in each state, a redelivery, a rejected stale settlement
// and a session, kind, key, input, output, failure and release reason that are scripts.
type fixture struct {
	q                                *work.Queue
	ok, failed, running, pending, hx string
	token                            string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	f := &fixture{q: q}
	s := q.Session("checkout-1")
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	sub := func(sess *work.Session, kind, key, input string, sec int) string {
		t.Helper()
		tk, err := sess.SubmitAt(ctx, work.TaskRequest{Kind: kind, IdempotencyKey: key, Input: json.RawMessage(input)}, at(sec))
		must(err)
		return tk.ID
	}
	claim := func(kind string, sec int) work.TaskDelivery {
		t.Helper()
		ds, err := q.ClaimKindsAt(work.WithWorker(ctx, "worker-a"), []string{kind}, at(sec), 30*time.Second, 1)
		must(err)
		if len(ds) != 1 {
			t.Fatalf("claimed %d", len(ds))
		}
		return ds[0]
	}
	f.ok = sub(s, "email", "k1", `{"to":"a@example.com"}`, 0)
	d := claim("email", 1)
	_, err := q.FinishAt(ctx, d, work.Success(json.RawMessage(`{"sent":true}`)), at(2))
	must(err)

	f.failed = sub(s, "charge", "", `{"amount":5}`, 3)
	d = claim("charge", 4)
	// A stale settlement: the lease expires, the task is redelivered, the first worker
	// finishes late and is refused (task_settle_rejected).
	d2 := claim("charge", 40)
	if _, err := q.FinishAt(ctx, d, work.Success(nil), at(41)); !errors.Is(err, work.ErrStaleDelivery) {
		t.Fatalf("stale finish: %v", err)
	}
	_, err = q.FinishAt(ctx, d2, work.Failure("card declined"), at(42))
	must(err)

	f.running = sub(s, "report", "", `{}`, 50)
	d = claim("report", 51)
	f.token = d.LeaseToken()
	f.pending = sub(s, "report", "", `{"later":true}`, 52)

	// Every user string a script.
	h := q.Session(hostile)
	f.hx = sub(h, hostile, hostile, `{"x":"`+strings.ReplaceAll(hostile, `"`, `\"`)+`"}`, 60)
	dh := claim(hostile, 61)
	_, err = q.ReleaseAt(ctx, dh, work.ReleaseRequest{Reason: hostile}, at(62))
	must(err)
	dh = claim(hostile, 63)
	_, err = q.FinishAt(ctx, dh, work.Failure(hostile), at(64))
	must(err)
	h2 := sub(h, "out", "", `{}`, 65)
	dh = claim("out", 66)
	_, err = q.FinishAt(ctx, dh, work.SuccessWithSummary(hostile, json.RawMessage(`{"o":"`+strings.ReplaceAll(hostile, `"`, `\"`)+`"}`)), at(67))
	must(err)
	_ = h2
	// A schedule and a kind policy, one of each hostile.
	must(s.SetScheduleAt(ctx, work.Schedule{Name: "nightly", Cron: "0 3 * * *", Task: work.TaskRequest{Kind: "report"}}, at(68)))
	must(h.SetScheduleAt(ctx, work.Schedule{Name: hostile, Cron: "@every 1h", Task: work.TaskRequest{Kind: hostile}}, at(69)))
	must(q.SetKindPolicyAt(ctx, hostile, work.KindPolicy{Paused: true}, at(70)))
	return f
}

// withActions is the Options of a console whose actions are on, for tests of the actions
// themselves: its Authorize lets everyone through (the tests of Authorize are in
// security_test.go).
func withActions() *console.Options {
	return &console.Options{Actions: true, Authorize: func(*http.Request) error { return nil }}
}

func newServer(t testing.TB, q *work.Queue, o *console.Options) *httptest.Server {
	t.Helper()
	h, err := console.New(q, o)
	if err != nil {
		t.Fatal(err)
	}
	return newServerHandler(t, h)
}

func newServerHandler(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	// A live tail's stream ends only when its client goes: end them, then close.
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

type resp struct {
	code int
	body string
	hdr  http.Header
}

func get(t testing.TB, srv *httptest.Server, path string) resp {
	t.Helper()
	r, err := http.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, string(b), r.Header}
}

func post(t testing.TB, srv *httptest.Server, path string, hdr map[string]string) resp {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return send(t, req)
}

func esc(s string) string { return url.PathEscape(s) }

// pages is every HTML page of the fixture, now and in the past.
func (f *fixture) pages() []string {
	return []string{
		"/", "/?at_seq=3", "/sessions", "/sessions?prefix=check", "/sessions/checkout-1",
		"/sessions/checkout-1?at_seq=5", "/sessions/" + esc(hostile), "/tasks/" + f.ok,
		"/tasks/" + f.failed, "/tasks/" + f.failed + "?at_seq=6", "/tasks/" + f.running,
		"/tasks/" + f.hx, "/log", "/log?type=task_claimed", "/log?session=checkout-1&from=1",
		"/log?kind=" + esc(hostile), "/stats", "/stats?at_seq=4", "/verify", "/verify?run=1",
		"/kinds", "/kinds?at_seq=3", "/schedules", "/schedules?at_seq=3",
		"/tasks", "/tasks?state=failed&kind=charge", "/tasks?q=" + esc(hostile), "/tasks?session=" + esc(hostile) + "&at_seq=3",
	}
}

// apis is every JSON route of the fixture.
func (f *fixture) apis() []string {
	return []string{"/api/stats", "/api/tasks/" + f.ok, "/api/tasks/" + f.failed + "?at_seq=6", "/api/tasks", "/api/tasks?state=failed&at_seq=9",
		"/api/kinds", "/api/kinds?at_seq=3", "/api/schedules", "/api/schedules?at_seq=3"}
}

// posts is every action route of the fixture: each task's and each bulk one.
func (f *fixture) posts() []string {
	return []string{
		"/api/tasks/" + f.failed + "/retry", "/api/tasks/" + f.pending + "/cancel", "/api/tasks/" + f.running + "/cancel",
		"/api/tasks/retry?state=failed", "/api/tasks/cancel", "/api/tasks/cancel?session=checkout-1",
		"/api/kinds/report/pause", "/api/kinds/report/resume", "/api/kinds/report/policy",
		"/api/schedules/checkout-1/nightly/remove",
	}
}

func TestEveryPageAnswers(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	for _, p := range f.pages() {
		r := get(t, srv, p)
		if r.code != http.StatusOK {
			t.Errorf("GET %s: %d\n%s", p, r.code, r.body)
			continue
		}
		if got := r.hdr.Get("Content-Security-Policy"); !strings.Contains(got, "script-src 'self'") || strings.Contains(got, "unsafe-inline") {
			t.Errorf("GET %s: CSP %q", p, got)
		}
		if !strings.HasPrefix(r.hdr.Get("Content-Type"), "text/html") {
			t.Errorf("GET %s: content type %q", p, r.hdr.Get("Content-Type"))
		}
	}
	for _, p := range append(f.apis(), "/assets/console.js", "/assets/console.css") {
		if r := get(t, srv, p); r.code != http.StatusOK || r.hdr.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: %d, CSP %q", p, r.code, r.hdr.Get("Content-Security-Policy"))
		}
	}
}

func TestPagesShowTheFold(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	for _, c := range []struct{ path, want string }{
		{"/", `id="count-failed">2<`},
		{"/", "card declined"},
		{"/", `id="due-now">`},
		{"/tasks/" + f.failed, "superseded"},
		{"/tasks/" + f.failed, "Rejected stale settlements"},
		{"/tasks/" + f.failed, "worker-a"},
		{"/tasks/" + f.failed, `id="task-state">failed<`},
		{"/tasks/" + f.ok, "{&#34;sent&#34;:true}"},
		{"/sessions", "checkout-1"},
		{"/sessions/checkout-1", f.pending},
		{"/sessions/checkout-1?state=failed", "1 task(s) match"},
		{"/sessions/checkout-1", `id="timeline"`},
		{"/log?type=task_settle_rejected", "task_settle_rejected"},
		{"/verify?run=1", "OK: the stored projection is exactly the fold of the log"},
	} {
		if r := get(t, srv, c.path); !strings.Contains(r.body, c.want) {
			t.Errorf("GET %s lacks %q", c.path, c.want)
		}
	}
	// The log page filters: a type filter lists no other type.
	r := get(t, srv, "/log?type=task_claimed")
	if strings.Contains(r.body, "<td>task_settled</td>") {
		t.Error("type filter let another type through")
	}
}

func TestTimeTravel(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, withActions())
	// The failed task: submitted at seq 4, claimed at 5, redelivered at 6.
	r := get(t, srv, "/tasks/"+f.failed+"?at_seq=5")
	if !strings.Contains(r.body, `id="task-state">running<`) || !strings.Contains(r.body, `id="past-banner"`) {
		t.Fatalf("task at seq 5: not running in the past\n%s", r.body)
	}
	if !strings.Contains(r.body, `id="cancel-btn" disabled`) {
		t.Error("a past page has an enabled Cancel")
	}
	r = get(t, srv, "/tasks/"+f.failed)
	if !strings.Contains(r.body, `id="task-state">failed<`) || strings.Contains(r.body, `id="past-banner"`) {
		t.Error("task now: not failed, or a past banner")
	}
	// The overview at seq 3: one task, succeeded.
	r = get(t, srv, "/?at_seq=3")
	if !strings.Contains(r.body, `id="count-succeeded">1<`) || !strings.Contains(r.body, `id="total-tasks">1<`) {
		t.Errorf("overview at seq 3 is not the past state")
	}
	// ?at=TIME: the prefix stamped at or before t0+3s ends at the failed task's submission.
	r = get(t, srv, "/tasks/"+f.failed+"?at="+t0.Add(3*time.Second).Format(time.RFC3339))
	if !strings.Contains(r.body, `id="task-state">pending<`) {
		t.Errorf("task at t0+3s is not pending")
	}
	// JSON at a past seq, and before the task existed.
	var j map[string]any
	r = get(t, srv, "/api/tasks/"+f.failed+"?at_seq=5")
	if err := json.Unmarshal([]byte(r.body), &j); err != nil || j["state"] != "running" || j["attempts"] != 1.0 {
		t.Errorf("api at seq 4: %v %s", err, r.body)
	}
	if j["lease_token"] != "[redacted]" {
		t.Errorf("lease_token %v", j["lease_token"])
	}
	r = get(t, srv, "/api/tasks/"+f.failed+"?at_seq=3")
	if r.code != http.StatusNotFound || !strings.Contains(r.body, `"error"`) || !strings.Contains(r.body, "did not exist at seq 3") {
		t.Errorf("api before the task existed: %d %s", r.code, r.body)
	}
}

func TestBadInputGetsAClearAnswer(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/?at_seq=abc", 400, "is not a sequence number"},
		{"/?at_seq=0", 400, "is not a sequence number"},
		{"/?at_seq=99999", 400, "past the end of the log"},
		{"/?at_seq=1&at=2026-03-02T09:00:00Z", 400, "not both"},
		{"/?at=yesterday", 400, "is not a time"},
		{"/?at=2000-01-01T00:00:00Z", 400, "nothing in the log is stamped"},
		{"/tasks/task_nope", 404, "no task"},
		{"/sessions/nobody", 404, "no session"},
		{"/sessions/checkout-1?state=bogus", 400, "not a task state"},
		{"/log?type=bogus", 400, "not an event type"},
		{"/log?from=x", 400, "not a sequence number"},
		{"/log?limit=0", 400, "limit"},
		{"/nowhere", 404, "There is no page"},
		{"/tasks/" + "x?at_seq=-1", 400, "not a sequence number"},
	} {
		r := get(t, srv, c.path)
		if r.code != c.code || !strings.Contains(r.body, c.want) {
			t.Errorf("GET %s: %d, want %d with %q\n%s", c.path, r.code, c.code, c.want, r.body)
		}
		if strings.Contains(r.body, "goroutine ") || strings.Contains(r.body, ".go:") {
			t.Errorf("GET %s: a stack in the answer", c.path)
		}
	}
	for _, c := range []struct {
		path string
		code int
	}{
		{"/api/tasks/task_nope", 404},
		{"/api/tasks/x?at_seq=zz", 400},
		{"/api/nothing", 404},
	} {
		r := get(t, srv, c.path)
		var j map[string]any
		if r.code != c.code || json.Unmarshal([]byte(r.body), &j) != nil || j["error"] == nil {
			t.Errorf("GET %s: %d %s", c.path, r.code, r.body)
		}
	}
}

func taskState(t *testing.T, q *work.Queue, session, id string) work.TaskState {
	t.Helper()
	tk, ok, err := q.Session(session).Task(context.Background(), id)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	return tk.State
}

func TestPostsOnlyFromTheConsolesOwnOrigin(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, withActions())
	u, _ := url.Parse(srv.URL)
	for _, hdr := range []map[string]string{
		{"Origin": "https://evil.example"},
		{"Origin": "null"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "http://" + u.Host, "Sec-Fetch-Site": "cross-site"},
	} {
		r := post(t, srv, "/api/tasks/"+f.pending+"/cancel", hdr)
		if r.code != http.StatusForbidden {
			t.Errorf("POST with %v: %d", hdr, r.code)
		}
		if st := taskState(t, f.q, "checkout-1", f.pending); st != work.TaskPending {
			t.Fatalf("POST with %v changed the task: %v", hdr, st)
		}
	}
	r := post(t, srv, "/api/tasks/"+f.pending+"/cancel", map[string]string{"Origin": "http://" + u.Host, "Sec-Fetch-Site": "same-origin"})
	if r.code != http.StatusOK || !strings.Contains(r.body, `"state":"canceled"`) {
		t.Fatalf("same-origin cancel: %d %s", r.code, r.body)
	}
	if st := taskState(t, f.q, "checkout-1", f.pending); st != work.TaskCanceled {
		t.Fatalf("after cancel: %v", st)
	}
	// Cancel of a terminal task changes nothing (the seed's rule) and says so.
	r = post(t, srv, "/api/tasks/"+f.ok+"/cancel", nil)
	if r.code != http.StatusOK || !strings.Contains(r.body, `"state":"succeeded"`) {
		t.Errorf("cancel of a succeeded task: %d %s", r.code, r.body)
	}
	r = post(t, srv, "/api/tasks/task_nope/cancel", nil)
	if r.code != http.StatusNotFound {
		t.Errorf("cancel of an unknown task: %d", r.code)
	}
	// The page's form: a redirect back to the task page.
	r = post(t, srv, "/api/tasks/"+f.running+"/cancel", map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if r.code != http.StatusSeeOther || r.hdr.Get("Location") != "../../../tasks/"+f.running {
		t.Errorf("form cancel: %d %q", r.code, r.hdr.Get("Location"))
	}
	if got := get(t, srv, "/tasks/"+f.running); !strings.Contains(got.body, "cancel request while running") {
		t.Error("the task page does not show the cancel request")
	}
}

// The default console is read-only: every POST (from its own origin too) is 403 and changes
// nothing, and no page offers an action.
func TestReadOnlyByDefault(t *testing.T) {
	f := newFixture(t)
	for _, o := range []*console.Options{nil, {}, {Authorize: func(*http.Request) error { return nil }}} {
		srv := newServer(t, f.q, o)
		u, _ := url.Parse(srv.URL)
		for _, p := range append(f.posts(), "/", "/api/stats") {
			for _, hdr := range []map[string]string{nil, {"Origin": "http://" + u.Host, "Sec-Fetch-Site": "same-origin"}, {"Content-Type": "application/x-www-form-urlencoded"}} {
				r := post(t, srv, p, hdr)
				if r.code != http.StatusForbidden || !strings.Contains(r.body, "read-only") {
					t.Errorf("%+v: POST %s %v: %d %s", o, p, hdr, r.code, r.body)
				}
			}
		}
		if st := taskState(t, f.q, "checkout-1", f.pending); st != work.TaskPending {
			t.Fatalf("read-only console changed a task: %v", st)
		}
		if st := taskState(t, f.q, "checkout-1", f.failed); st != work.TaskFailed {
			t.Fatalf("read-only console changed a task: %v", st)
		}
		if st := taskState(t, f.q, "checkout-1", f.running); st != work.TaskRunning {
			t.Fatalf("read-only console changed a task: %v", st)
		}
		for _, id := range []string{f.pending, f.failed, f.running} {
			r := get(t, srv, "/tasks/"+id)
			if r.code != http.StatusOK || strings.Contains(r.body, "cancel-btn") || strings.Contains(r.body, "retry-btn") ||
				strings.Contains(r.body, `method="post"`) || !strings.Contains(r.body, `id="read-only-note"`) {
				t.Errorf("%+v: the read-only page of %s offers an action (or lacks the note): %d", o, id, r.code)
			}
		}
	}
}

func TestUserStringsAreEscaped(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	paths := append(f.pages(), "/log?session="+esc(hostile), "/log?from=1&limit=1000", "/api/tasks/"+f.hx)
	seen := false
	for _, p := range paths {
		r := get(t, srv, p)
		if strings.Contains(r.body, hostile) || strings.Contains(r.body, "<script>alert") {
			t.Errorf("GET %s: a user's script is in the page unescaped", p)
		}
		if strings.Contains(r.body, "&lt;script&gt;alert(") || strings.Contains(r.body, `\u003cscript\u003ealert`) {
			seen = true
		}
	}
	if !seen {
		t.Fatal("no page showed the hostile strings at all: the test proves nothing")
	}
	// Each place a user writes appears, escaped, where it belongs.
	r := get(t, srv, "/tasks/"+f.hx)
	for _, id := range []string{"task-session", "task-kind", "task-key", "task-input", "task-failure"} {
		if !strings.Contains(r.body, `id="`+id+`"`) {
			t.Errorf("task page lacks %s", id)
		}
	}
}

func TestNoLeaseTokenAnywhere(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	if f.token == "" {
		t.Fatal("no token to look for")
	}
	for _, p := range append(f.pages(), "/api/tasks/"+f.running, "/api/stats", "/log?from=1&limit=1000") {
		if r := get(t, srv, p); strings.Contains(r.body, f.token) {
			t.Errorf("GET %s shows a lease token", p)
		}
	}
}

func TestMountedUnderAPrefix(t *testing.T) {
	f := newFixture(t)
	h, err := console.New(f.q, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", http.StripPrefix("/ops/console", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	r := get(t, srv, "/ops/console/tasks/"+f.ok)
	if r.code != 200 || !strings.Contains(r.body, `href="../assets/console.css"`) {
		t.Fatalf("%d; stylesheet link not relative", r.code)
	}
	if r := get(t, srv, "/ops/console/assets/console.js"); r.code != 200 {
		t.Fatalf("asset under the prefix: %d", r.code)
	}
}

func TestTheConsoleSeesNewEvents(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	before := get(t, srv, "/api/stats")
	tk, err := f.q.Session("late").SubmitAt(context.Background(), work.TaskRequest{Kind: "late-kind"}, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	after := get(t, srv, "/api/stats")
	if before.body == after.body || !strings.Contains(after.body, "late-kind") {
		t.Fatalf("stats did not change: %s", after.body)
	}
	if r := get(t, srv, "/tasks/"+tk.ID); r.code != 200 || !strings.Contains(r.body, "late-kind") {
		t.Fatalf("new task page: %d", r.code)
	}
}

func TestRetry(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, withActions())
	if r := get(t, srv, "/tasks/"+f.failed); strings.Contains(r.body, `id="retry-btn" disabled`) {
		t.Fatal("a failed task's Retry is disabled")
	}
	if r := get(t, srv, "/tasks/"+f.ok); !strings.Contains(r.body, `id="retry-btn" disabled`) {
		t.Fatal("a succeeded task offers Retry")
	}
	u, _ := url.Parse(srv.URL)
	r := post(t, srv, "/api/tasks/"+f.failed+"/retry", map[string]string{"Origin": "https://evil.example"})
	if r.code != http.StatusForbidden || taskState(t, f.q, "checkout-1", f.failed) != work.TaskFailed {
		t.Fatalf("cross-origin retry: %d", r.code)
	}
	r = post(t, srv, "/api/tasks/"+f.failed+"/retry", map[string]string{"Origin": "http://" + u.Host})
	if r.code != http.StatusOK || !strings.Contains(r.body, `"state":"pending"`) || !strings.Contains(r.body, `"attempts_at_retry":2`) {
		t.Fatalf("retry: %d %s", r.code, r.body)
	}
	if st := taskState(t, f.q, "checkout-1", f.failed); st != work.TaskPending {
		t.Fatalf("after retry: %v", st)
	}
	// The history stays: the page shows the retry's rule, and the past still shows it failed.
	page := get(t, srv, "/tasks/"+f.failed)
	if !strings.Contains(page.body, "retry of a failed task") || !strings.Contains(page.body, "task_retried") {
		t.Error("the task page does not explain the retry")
	}
	if r := get(t, srv, "/api/tasks/"+f.failed+"?at_seq=8"); !strings.Contains(r.body, `"state":"failed"`) {
		t.Errorf("the past lost the failure: %s", r.body)
	}
	// A succeeded task cannot be retried: a conflict, nothing changes.
	r = post(t, srv, "/api/tasks/"+f.ok+"/retry", nil)
	if r.code != http.StatusConflict || !strings.Contains(r.body, `"error"`) {
		t.Errorf("retry of a succeeded task: %d %s", r.code, r.body)
	}
}

func TestLiveTailStreamsNewEvents(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	last := get(t, srv, "/api/stats")
	var st struct {
		LastSeq uint64 `json:"last_seq"`
	}
	if err := json.Unmarshal([]byte(last.body), &st); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/log/stream?kind=late-kind&from="+strconvU(st.LastSeq+1), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	// One event of another kind (filtered out), then the one the tail waits for.
	if _, err := f.q.Session("late").SubmitAt(ctx, work.TaskRequest{Kind: "other"}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	tk, err := f.q.Session("late").SubmitAt(ctx, work.TaskRequest{Kind: "late-kind", Input: json.RawMessage(`{"s":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`)}, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 4096)
	tmp := make([]byte, 1024)
	for !strings.Contains(string(buf), "\n\ndata: ") || !strings.Contains(string(buf), tk.ID) {
		n, err := resp.Body.Read(tmp)
		if err != nil {
			t.Fatalf("stream ended: %v after %q", err, buf)
		}
		buf = append(buf, tmp[:n]...)
	}
	got := string(buf)
	if strings.Contains(got, `"other"`) || strings.Contains(got, "kind other") {
		t.Error("the kind filter let another kind through")
	}
	if strings.Contains(got, "<script>") {
		t.Error("a script in the stream unescaped")
	}
	if !strings.Contains(got, `"event":"task_submitted"`) {
		t.Errorf("stream: %s", got)
	}
	if r := get(t, srv, "/log/stream?from=x"); r.code != http.StatusBadRequest {
		t.Errorf("bad from: %d", r.code)
	}
}

func strconvU(n uint64) string { return strconv.FormatUint(n, 10) }

// TestPastCountsMatchARefold: the overview's and stats page's counts at every past seq (from
// checkpoints plus steps) equal those of a fresh console over the log cut at that seq.
func TestPastCountsMatchARefold(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	// Enough events for several checkpoints (4096 apart).
	for i := range 3000 {
		s := q.Session("s" + strconv.Itoa(i%7))
		tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k" + strconv.Itoa(i%3)}, t0.Add(time.Duration(i)*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			continue
		}
		ds, err := q.ClaimDueAt(ctx, t0.Add(time.Duration(i)*time.Millisecond), time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatal(err)
		}
		o := work.Success(nil)
		if i%5 == 0 {
			o = work.Failure("no")
		}
		if i%6 == 0 {
			if _, err := s.CancelAt(ctx, tk.ID, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := q.FinishAt(ctx, ds[0], o, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	srv := newServer(t, q, nil)
	last := get(t, srv, "/api/stats")
	var st struct {
		LastSeq uint64 `json:"last_seq"`
	}
	if err := json.Unmarshal([]byte(last.body), &st); err != nil || st.LastSeq < 5000 {
		t.Fatalf("%v %d", err, st.LastSeq)
	}
	for _, seq := range []uint64{1, 2, 4095, 4096, 4097, 5000, st.LastSeq - 1} {
		// The reference: each task folded on its own up to seq (the task page's path, no
		// checkpoint and no count involved), counted by state.
		cut := seq
		r := get(t, srv, "/?at_seq="+strconvU(cut))
		s := get(t, srv, "/stats?at_seq="+strconvU(cut))
		if r.code != 200 || s.code != 200 {
			t.Fatalf("seq %d: %d %d", cut, r.code, s.code)
		}
		want := refCounts(t, q, cut)
		for state, n := range want {
			if !strings.Contains(r.body, `id="count-`+state+`">`+strconv.Itoa(n)+`<`) {
				t.Errorf("seq %d: overview %s is not %d", cut, state, n)
			}
		}
		total := 0
		for _, n := range want {
			total += n
		}
		if !strings.Contains(s.body, `id="stats-tasks">`+strconv.Itoa(total)+`<`) {
			t.Errorf("seq %d: stats tasks is not %d", cut, total)
		}
	}
}

// refCounts counts the tasks of q's log up to seq by state, each task's state being its own
// events folded up to seq (GET /api/tasks/{id}?at_seq=seq).
func refCounts(t *testing.T, q *work.Queue, seq uint64) map[string]int {
	t.Helper()
	ids := map[string]bool{}
	err := q.ReadLog(context.Background(), 0, func(ev events.Event) error {
		if ev.Head().Seq > seq {
			return errDone
		}
		if tid, _ := ev.Subject(); tid != "" {
			ids[tid] = true
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDone) {
		t.Fatal(err)
	}
	h, _ := console.New(q, nil)
	out := map[string]int{"pending": 0, "running": 0, "succeeded": 0, "failed": 0, "canceled": 0}
	for id := range ids {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/tasks/"+id+"?at_seq="+strconvU(seq), nil)
		req.Host = "localhost" // not httptest's example.com, which the console does not answer to
		h.ServeHTTP(w, req)
		var j struct {
			State string `json:"state"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &j); err != nil {
			t.Fatal(err)
		}
		out[j.State]++
	}
	return out
}

var errDone = errors.New("done")

// A session id with a slash, a question mark and a hash: its links escape them, its page is
// found, and the page's relative links still lead to the console's root.
func TestSessionIDsThatLookLikePaths(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	id := "tenant/7?x=1#frag"
	tk, err := q.Session(id).SubmitAt(context.Background(), work.TaskRequest{Kind: "k"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, q, nil)
	list := get(t, srv, "/sessions")
	if !strings.Contains(list.body, `href="./sessions/tenant%2f7%3fx=1%23frag"`) && !strings.Contains(list.body, `href="./sessions/tenant%2F7%3Fx=1%23frag"`) {
		t.Fatalf("the session's link is not escaped:\n%s", list.body)
	}
	r := get(t, srv, "/sessions/"+url.PathEscape(id))
	if r.code != 200 || !strings.Contains(r.body, tk.ID) {
		t.Fatalf("session page: %d", r.code)
	}
	if !strings.Contains(r.body, `href="../assets/console.css"`) {
		t.Error("the session page's root is wrong for an id with a slash")
	}
}

func TestSessionPageListsWakes(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	defer q.Close()
	s := q.Session("w")
	if _, err := s.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"p":"` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`)}, t0); err != nil {
		t.Fatal(err)
	}
	tk, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CancelAt(ctx, tk.ID, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, q, nil)
	r := get(t, srv, "/sessions/w")
	if !strings.Contains(r.body, "<td>requested</td>") || !strings.Contains(r.body, "<td>task_finished</td>") || strings.Contains(r.body, hostile) {
		t.Fatalf("wakes on the session page:\n%s", r.body)
	}
	if r := get(t, srv, "/sessions/w?at_seq=1"); strings.Contains(r.body, "<td>task_finished</td>") {
		t.Error("the completion wake shows before it was recorded")
	}
}

// send sends req without following redirects (an action's answer to a form is one).
func send(t testing.TB, req *http.Request) resp {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, string(b), r.Header}
}
