package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/console"
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/work"
)

// do sends one request to srv with Host host (the TCP connection goes to srv's loopback
// address whatever the Host says, as a browser's does after a DNS rebinding) and reads at
// most 64 KiB of the answer, with a deadline: a live tail that was not refused would
// otherwise never end.
func do(t *testing.T, srv *httptest.Server, method, path, host string, hdr map[string]string) resp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if r.Header.Get("Content-Type") == "text/event-stream" {
		return resp{r.StatusCode, "(a live tail)", r.Header}
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	return resp{r.StatusCode, string(b), r.Header}
}

// TestHostCheckRefusesDNSRebinding (issue 43 §2): a page of another site whose DNS name
// points at the console's address (DNS rebinding) sends the console its own name as Host,
// and a matching Origin. Every such request — each page, the JSON API, the live tail, the
// assets, and the actions with a matching Origin — gets 421 and reads nothing: no task's
// input, id or state is in the answer, and the log does not move (the failed task is still
// failed after the refused retry). The console has actions on, with an Authorize that lets
// everyone through, so that only the Host check stands between the attacker and the queue.
// Before the check, every one of them was answered (the retry with 200).
func TestHostCheckRefusesDNSRebinding(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, withActions())
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	head := headSeq(t, f.q)
	gets := append(append(f.pages(), f.apis()...), "/log/stream?from=1", "/assets/console.js", "/assets/console.css", "/nope")
	posts := f.posts()
	for _, host := range []string{
		"evil.example:" + port, "evil.example", "EVIL.example.:" + port,
		"127.0.0.1.nip.io:" + port, "localhost.evil.example:" + port, "evil.example.localhost:" + port,
		"10.0.0.5:" + port, "[2001:db8::1]:" + port, "0.0.0.0:" + port, "127.1:" + port,
	} {
		for _, p := range gets {
			r := do(t, srv, http.MethodGet, p, host, nil)
			if r.code != http.StatusMisdirectedRequest {
				t.Errorf("GET %s with Host %s: %d, want 421", p, host, r.code)
			}
			for _, secret := range []string{"a@example.com", `amount`, f.failed, f.ok, f.pending, "card declined", "checkout-1", "worklog console live tail"} {
				if strings.Contains(r.body, secret) {
					t.Errorf("GET %s with Host %s: the refusal shows %q", p, host, secret)
				}
			}
		}
		for _, p := range posts {
			for _, hdr := range []map[string]string{
				{"Origin": "http://" + host},
				{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin", "Content-Type": "application/x-www-form-urlencoded"},
				nil,
			} {
				if r := do(t, srv, http.MethodPost, p, host, hdr); r.code != http.StatusMisdirectedRequest {
					t.Errorf("POST %s with Host %s %v: %d, want 421", p, host, hdr, r.code)
				}
			}
		}
	}
	if st := taskState(t, f.q, "checkout-1", f.failed); st != work.TaskFailed {
		t.Errorf("the failed task after refused retries: %v", st)
	}
	if st := taskState(t, f.q, "checkout-1", f.pending); st != work.TaskPending {
		t.Errorf("the pending task after refused cancels: %v", st)
	}
	if st := taskState(t, f.q, "checkout-1", f.running); st != work.TaskRunning {
		t.Errorf("the running task after refused cancels: %v", st)
	}
	if h := headSeq(t, f.q); h != head {
		t.Errorf("refused requests moved the log from seq %d to %d", head, h)
	}
	// The refusal says what happened and how to allow a name; the API's is JSON.
	r := do(t, srv, http.MethodGet, "/", "evil.example:"+port, nil)
	if !strings.Contains(r.body, "does not answer to the host") || !strings.Contains(r.body, "AllowedHosts") {
		t.Errorf("the refusal page: %s", r.body)
	}
	r = do(t, srv, http.MethodGet, "/api/stats", "evil.example", nil)
	if !strings.Contains(r.body, `"status":421`) {
		t.Errorf("the API's refusal: %s", r.body)
	}

	// The loopback names are answered, on any port, and the same retry then works.
	for _, host := range []string{"localhost:" + port, "LOCALHOST.:" + port, "127.0.0.1:" + port, "127.9.9.9:" + port,
		"[::1]:" + port, "[::ffff:127.0.0.1]:" + port, "localhost", "127.0.0.1:1"} {
		if r := do(t, srv, http.MethodGet, "/tasks/"+f.failed, host, nil); r.code != http.StatusOK || !strings.Contains(r.body, f.failed) {
			t.Errorf("GET with Host %s: %d", host, r.code)
		}
	}
	r = do(t, srv, http.MethodPost, "/api/tasks/"+f.failed+"/retry", "localhost:"+port, map[string]string{"Origin": "http://localhost:" + port})
	if r.code != http.StatusOK || taskState(t, f.q, "checkout-1", f.failed) != work.TaskPending {
		t.Errorf("retry with Host localhost: %d %s", r.code, r.body)
	}
}

// headSeq is the queue's last seq: a refused request must not move it.
func headSeq(t *testing.T, q *work.Queue) uint64 {
	t.Helper()
	var last uint64
	if err := q.ReadLog(context.Background(), 0, func(ev events.Event) error { last = ev.Head().Seq; return nil }); err != nil {
		t.Fatal(err)
	}
	return last
}

// TestAllowedHosts: the names an application lists are answered (any case, a final dot,
// any port; or the one port given), the loopback names still are, others are not; "*"
// answers any Host.
func TestAllowedHosts(t *testing.T) {
	f := newFixture(t)
	o := withActions()
	o.AllowedHosts = []string{"ops.example.com", "10.0.0.5", "2001:DB8::1", "tls.example.com:8443", "[2001:db8::2]:8080"}
	srv := newServer(t, f.q, o)
	for host, want := range map[string]int{
		"ops.example.com":          200,
		"OPS.Example.COM.:18081":   200,
		"10.0.0.5:80":              200,
		"[2001:db8::1]:9000":       200,
		"[2001:db8:0::1]":          200,
		"tls.example.com:8443":     200,
		"[2001:db8::2]:8080":       200,
		"localhost:1234":           200,
		"tls.example.com:8444":     421,
		"tls.example.com":          421,
		"[2001:db8::2]:8081":       421,
		"evil.example":             421,
		"www.ops.example.com":      421,
		"ops.example.com.evil.com": 421,
		"10.0.0.6":                 421,
	} {
		if r := do(t, srv, http.MethodGet, "/api/stats", host, nil); r.code != want {
			t.Errorf("Host %s: %d, want %d", host, r.code, want)
		}
	}
	// An action through a listed name, with its own Origin.
	r := do(t, srv, http.MethodPost, "/api/tasks/"+f.failed+"/retry", "ops.example.com:18081", map[string]string{"Origin": "https://ops.example.com:18081"})
	if r.code != http.StatusOK || taskState(t, f.q, "checkout-1", f.failed) != work.TaskPending {
		t.Errorf("retry through a listed name: %d %s", r.code, r.body)
	}
	// A listed name is no excuse for another Origin.
	r = do(t, srv, http.MethodPost, "/api/tasks/"+f.pending+"/cancel", "ops.example.com", map[string]string{"Origin": "https://evil.example"})
	if r.code != http.StatusForbidden || taskState(t, f.q, "checkout-1", f.pending) != work.TaskPending {
		t.Errorf("cross-origin cancel through a listed name: %d %s", r.code, r.body)
	}

	any := newServer(t, f.q, &console.Options{AllowedHosts: []string{"*"}})
	if r := do(t, any, http.MethodGet, "/api/stats", "anything.example:1", nil); r.code != 200 {
		t.Errorf(`"*": %d`, r.code)
	}
}

// Odd Host headers, straight to the handler (no client sends them): refused.
func TestOddHostsRefused(t *testing.T) {
	f := newFixture(t)
	h, err := console.New(f.q, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"", ":80", "[::1", "[localhost]:80", "localhost:", "example.com", "local host", "localhost/x", "user@localhost"} {
		req := httptest.NewRequest(http.MethodGet, "/api/stats", nil)
		req.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusMisdirectedRequest {
			t.Errorf("Host %q: %d", host, w.Code)
		}
	}
}

// TestAuthorize: with Authorize set, every request passes it first: a refusal is 403 with
// the error's text (escaped on a page, in JSON under /api) on pages, the API, the live
// tail, the assets and the actions, and nothing is read or changed; a request it lets
// through is served and its action acts. Before Authorize existed (part 3), no request was
// ever asked.
func TestAuthorize(t *testing.T) {
	f := newFixture(t)
	var calls atomic.Int32
	o := &console.Options{Actions: true, Authorize: func(r *http.Request) error {
		calls.Add(1)
		if r.Header.Get("X-Operator") != "alice" {
			return errors.New("operators only: <sign in> first")
		}
		return nil
	}}
	srv := newServer(t, f.q, o)
	host := strings.TrimPrefix(srv.URL, "http://")
	head := headSeq(t, f.q)
	for _, p := range append(append(f.pages(), f.apis()...), "/log/stream?from=1", "/assets/console.js", "/nope") {
		r := do(t, srv, http.MethodGet, p, host, nil)
		if r.code != http.StatusForbidden {
			t.Errorf("GET %s without the operator: %d", p, r.code)
			continue
		}
		if strings.Contains(r.body, "<sign in>") || !(strings.Contains(r.body, "operators only: &lt;sign in&gt; first") || strings.Contains(r.body, `operators only: \u003csign in\u003e first`)) {
			t.Errorf("GET %s: the error's text is not shown (escaped): %s", p, r.body)
		}
		for _, secret := range []string{"a@example.com", f.failed, "card declined"} {
			if strings.Contains(r.body, secret) {
				t.Errorf("GET %s refused, but shows %q", p, secret)
			}
		}
	}
	for _, p := range f.posts() {
		r := do(t, srv, http.MethodPost, p, host, map[string]string{"Origin": "http://" + host})
		if r.code != http.StatusForbidden || !strings.Contains(r.body, "operators only") {
			t.Errorf("POST %s without the operator: %d %s", p, r.code, r.body)
		}
	}
	if taskState(t, f.q, "checkout-1", f.failed) != work.TaskFailed || taskState(t, f.q, "checkout-1", f.pending) != work.TaskPending ||
		taskState(t, f.q, "checkout-1", f.running) != work.TaskRunning || headSeq(t, f.q) != head {
		t.Fatal("a refused request changed the queue")
	}
	// The Host check comes first: Authorize is never asked about a foreign Host.
	before := calls.Load()
	if r := do(t, srv, http.MethodGet, "/", "evil.example", map[string]string{"X-Operator": "alice"}); r.code != http.StatusMisdirectedRequest {
		t.Errorf("foreign Host with the operator: %d", r.code)
	}
	if calls.Load() != before {
		t.Error("Authorize was asked about a request for a foreign Host")
	}
	// The operator: pages and the action.
	alice := map[string]string{"X-Operator": "alice"}
	if r := do(t, srv, http.MethodGet, "/tasks/"+f.failed, host, alice); r.code != http.StatusOK || !strings.Contains(r.body, `id="retry-btn"`) {
		t.Errorf("the operator's task page: %d", r.code)
	}
	r := do(t, srv, http.MethodPost, "/api/tasks/"+f.failed+"/retry", host, map[string]string{"X-Operator": "alice", "Origin": "http://" + host})
	if r.code != http.StatusOK || !strings.Contains(r.body, `"state":"pending"`) || taskState(t, f.q, "checkout-1", f.failed) != work.TaskPending {
		t.Errorf("the operator's retry: %d %s", r.code, r.body)
	}

	// On a read-only console Authorize guards the pages just the same.
	ro := newServer(t, f.q, &console.Options{Authorize: o.Authorize})
	if r := do(t, ro, http.MethodGet, "/", strings.TrimPrefix(ro.URL, "http://"), nil); r.code != http.StatusForbidden {
		t.Errorf("read-only console without the operator: %d", r.code)
	}
	if r := do(t, ro, http.MethodGet, "/", strings.TrimPrefix(ro.URL, "http://"), alice); r.code != http.StatusOK {
		t.Errorf("read-only console with the operator: %d", r.code)
	}
}

// An Authorize that panics is a 500 that names no secret, and the request is not served.
func TestAuthorizePanicIsA500(t *testing.T) {
	f := newFixture(t)
	srv := newServer(t, f.q, &console.Options{Authorize: func(*http.Request) error { panic("the auth store is down") }})
	r := do(t, srv, http.MethodGet, "/tasks/"+f.failed, strings.TrimPrefix(srv.URL, "http://"), nil)
	if r.code != http.StatusInternalServerError || strings.Contains(r.body, f.failed) || strings.Contains(r.body, "auth store") {
		t.Errorf("%d %s", r.code, r.body)
	}
}

// TestOptionsTable: New refuses every field out of range with an *OptionError naming
// console.Options and the field, before reading anything; the zero Options is the secure
// default (read-only, loopback only: the tests above).
func TestOptionsTable(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	allow := func(*http.Request) error { return nil }
	for _, c := range []struct {
		o     console.Options
		field string
	}{
		{console.Options{Actions: true}, "Authorize"},
		{console.Options{Actions: true, AllowedHosts: []string{"ops.example.com"}}, "Authorize"},
		{console.Options{AllowedHosts: []string{""}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"ok.example", " ops.example.com"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"https://ops.example.com"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"ops.example.com/console"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"ops.example.com:"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"ops.example.com:0"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"ops.example.com:65536"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"ops..example.com"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"*.example.com"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{"[ops.example.com]"}}, "AllowedHosts"},
		{console.Options{AllowedHosts: []string{strings.Repeat("a", 64) + ".example"}}, "AllowedHosts"},
		{console.Options{Actions: true, Authorize: allow, TraceURL: "ftp://x/{trace_id}"}, "TraceURL"},
		{console.Options{TraceURL: "https://jaeger.example.com/trace/"}, "TraceURL"},
	} {
		_, err := console.New(q, &c.o)
		optionerr.Want(t, fmt.Sprintf("%+v", c.o), err, "console.Options", c.field)
		if !errors.Is(err, console.ErrInvalidOptions) || !errors.Is(err, work.ErrInvalidOptions) {
			t.Errorf("%+v: %v does not match ErrInvalidOptions", c.o, err)
		}
		if c.field == "Authorize" && !strings.Contains(err.Error(), "Authorize") {
			t.Errorf("the error does not name Authorize: %v", err)
		}
	}
	for _, o := range []console.Options{{}, {Actions: true, Authorize: allow, AllowedHosts: []string{"*", "Ops.Example.com.", "10.0.0.5:8080", "[::1]:1", "::1", "a_b.internal"}}} {
		if _, err := console.New(q, &o); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	optionerr.FieldsCovered(t, console.Options{}, "Actions", "Authorize", "AllowedHosts", "TraceURL",
		"Logger") // Logger: nil discards (every test but this one leaves it nil)
}
