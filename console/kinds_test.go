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

type apiKind struct {
	Kind  string
	Tasks struct {
		Total, Pending, Running, Failed int64
	}
	DueNow    *int64         `json:"due_now"`
	OldestDue string         `json:"oldest_due_age"`
	Policy    map[string]any `json:"policy"`
	PolicySeq uint64         `json:"policy_seq"`
	Paused    bool
	Running   int64
	Slots     *int `json:"slots_in_use"`
}

func kindsOf(t *testing.T, srv interface{ Client() *http.Client }, u string) map[string]apiKind {
	t.Helper()
	var out struct{ Kinds []apiKind }
	if c := getJSON(t, srv, u, &out); c != 200 {
		t.Fatalf("GET %s: %d", u, c)
	}
	m := map[string]apiKind{}
	for _, k := range out.Kinds {
		m[k.Kind] = k
	}
	return m
}

func postJSON(t *testing.T, srv interface{ Client() *http.Client }, u, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	r, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var b strings.Builder
	buf := make([]byte, 1<<16)
	n, _ := r.Body.Read(buf)
	b.Write(buf[:n])
	return r.StatusCode, b.String()
}

// TestKindsPage: per kind the counts by state, the due tasks (count and oldest), the policy
// with every field and the slots in use; pause, resume and a policy edit are one
// kind_policy_set each and show at once; a past seq shows the policy then; the read-only
// console and the past refuse them.
func TestKindsPage(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	s := q.Session("s")
	for i := range 5 {
		if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "mail"}, t0.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "mail", RunAt: time.Now().Add(time.Hour)}, t0); err != nil {
		t.Fatal(err)
	}
	if err := q.SetKindPolicyAt(ctx, "mail", work.KindPolicy{MaxRunning: 3}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.ClaimKindsAt(ctx, []string{"mail"}, time.Now(), time.Hour, 2); err != nil {
		t.Fatal(err)
	}
	if err := q.SetKindPolicyAt(ctx, "idle", work.KindPolicy{Rate: 2, Burst: 4}, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, q, withActions())
	k := kindsOf(t, srv, srv.URL+"/api/kinds")
	m := k["mail"]
	if m.Tasks.Total != 6 || m.Tasks.Pending != 4 || m.Tasks.Running != 2 || m.DueNow == nil || *m.DueNow != 3 || m.OldestDue == "" {
		t.Fatalf("mail: %+v", m)
	}
	if m.Slots == nil || *m.Slots != 2 || m.Policy["max_running"] != 3.0 || m.Policy["paused"] != false || m.PolicySeq == 0 {
		t.Fatalf("mail's policy: %+v", m)
	}
	if i, ok := k["idle"]; !ok || i.Policy["rate"] != 2.0 || i.Policy["burst"] != 4.0 || i.Tasks.Total != 0 {
		t.Fatalf("idle (a policy, no task): %+v", k)
	}
	for _, f := range []string{"paused", "max_running", "rate", "burst"} {
		if _, ok := m.Policy[f]; !ok {
			t.Errorf("the policy lacks %s: %v", f, m.Policy)
		}
	}
	before := headSeq(t, q)

	// Pause: claims skip the kind.
	if c, b := postJSON(t, srv, srv.URL+"/api/kinds/mail/pause", ""); c != 200 || !strings.Contains(b, `"paused":true`) {
		t.Fatalf("pause: %d %s", c, b)
	}
	if pols, _ := q.KindPolicies(ctx); !pols["mail"].Paused || pols["mail"].MaxRunning != 3 {
		t.Fatalf("after pause: %+v", pols["mail"])
	}
	if ds, _ := q.ClaimKinds(ctx, []string{"mail"}, time.Minute, 1); len(ds) != 0 {
		t.Fatal("a paused kind was claimed")
	}
	if p := get(t, srv, "/kinds"); !strings.Contains(p.body, `class="resume-btn"`) || !strings.Contains(p.body, `<span class="tag">paused</span>`) {
		t.Error("the page does not show mail paused with a resume button")
	}
	// In the past (before the pause) it was not paused.
	if k := kindsOf(t, srv, fmt.Sprintf("%s/api/kinds?at_seq=%d", srv.URL, before)); k["mail"].Paused || k["mail"].DueNow != nil {
		t.Errorf("mail in the past: %+v", k["mail"])
	}
	if c, b := postJSON(t, srv, srv.URL+"/api/kinds/mail/resume", ""); c != 200 || !strings.Contains(b, `"paused":false`) {
		t.Fatalf("resume: %d %s", c, b)
	}
	// Edit: the fields named change, the others stay.
	if c, b := postJSON(t, srv, srv.URL+"/api/kinds/mail/policy", `{"rate":1.5,"burst":2}`); c != 200 {
		t.Fatalf("policy: %d %s", c, b)
	}
	if pols, _ := q.KindPolicies(ctx); pols["mail"] != (work.KindPolicy{MaxRunning: 3, Rate: 1.5, Burst: 2}) {
		t.Fatalf("after the edit: %+v", pols["mail"])
	}
	// The page's form sends every field; an unchecked box is false.
	r := postForm(t, srv, "/api/kinds/mail/policy", "max_running=5&rate=0&burst=0")
	if r.code != http.StatusSeeOther || r.hdr.Get("Location") != "../../../kinds" {
		t.Fatalf("form: %d %s", r.code, r.body)
	}
	if pols, _ := q.KindPolicies(ctx); pols["mail"] != (work.KindPolicy{MaxRunning: 5}) {
		t.Fatalf("after the form: %+v", pols["mail"])
	}
	// Bad input names the field; nothing changes.
	head := headSeq(t, q)
	for body, field := range map[string]string{`{"max_running":-1}`: "max_running", `{"rate":"x"}`: "rate", `{"nope":1}`: "nope", `{"rate":1}`: "burst", `[`: "JSON"} {
		if c, b := postJSON(t, srv, srv.URL+"/api/kinds/mail/policy", body); c != 400 || !strings.Contains(b, field) {
			t.Errorf("%s: %d %s", body, c, b)
		}
	}
	if c, b := postJSON(t, srv, fmt.Sprintf("%s/api/kinds/mail/pause?at_seq=%d", srv.URL, before), ""); c != http.StatusConflict {
		t.Errorf("pause in the past: %d %s", c, b)
	}
	if p := get(t, srv, fmt.Sprintf("/kinds?at_seq=%d", before)); strings.Contains(p.body, "pause-btn") || !strings.Contains(p.body, `id="past-banner"`) {
		t.Error("a past kinds page offers pause, or has no banner")
	}
	ro := newServer(t, q, nil)
	for _, p := range []string{"/api/kinds/mail/pause", "/api/kinds/mail/resume", "/api/kinds/mail/policy"} {
		if c, _ := postJSON(t, ro, ro.URL+p, `{"paused":true}`); c != http.StatusForbidden {
			t.Errorf("read-only %s: %d", p, c)
		}
	}
	if p := get(t, ro, "/kinds"); strings.Contains(p.body, "pause-btn") || strings.Contains(p.body, `method="post"`) {
		t.Error("a read-only kinds page offers actions")
	}
	if headSeq(t, q) != head {
		t.Error("a refused change moved the log")
	}
}

func postForm(t *testing.T, srv *httptest.Server, path, body string) resp {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return send(t, req)
}
