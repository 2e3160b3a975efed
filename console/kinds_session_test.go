package console_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestKindsPageShowsSessionLimits: a kind with FairSessions and MaxRunningPerSession shows
// both in its policy (JSON and page, and at a past seq from the event), and the slots each
// session holds now.
func TestKindsPageShowsSessionLimits(t *testing.T) {
	ctx := context.Background()
	q := work.NewInMemory()
	t.Cleanup(func() { q.Close() })
	for _, sess := range []string{"alice", "bob"} {
		for i := range 3 {
			if _, err := q.Session(sess).SubmitAt(ctx, work.TaskRequest{Kind: "mail"}, t0.Add(time.Duration(i)*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := q.SetKindPolicyAt(ctx, "mail", work.KindPolicy{FairSessions: true, MaxRunningPerSession: 2}, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	set := headSeq(t, q)
	ds, err := q.ClaimKindsAt(ctx, []string{"mail"}, time.Now(), time.Hour, 3)
	if err != nil || len(ds) != 3 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	srv := newServer(t, q, nil)
	var out struct {
		Kinds []struct {
			Kind           string
			Policy         map[string]any `json:"policy"`
			Slots          *int           `json:"slots_in_use"`
			SlotsBySession map[string]int `json:"slots_by_session"`
		}
	}
	if c := getJSON(t, srv, srv.URL+"/api/kinds", &out); c != 200 || len(out.Kinds) != 1 {
		t.Fatalf("GET /api/kinds: %d %+v", c, out)
	}
	m := out.Kinds[0]
	if m.Policy["fair_sessions"] != true || m.Policy["max_running_per_session"] != 2.0 {
		t.Errorf("the policy: %v", m.Policy)
	}
	if m.Slots == nil || *m.Slots != 3 || len(m.SlotsBySession) != 2 || m.SlotsBySession["alice"]+m.SlotsBySession["bob"] != 3 ||
		m.SlotsBySession["alice"] > 2 || m.SlotsBySession["bob"] > 2 {
		t.Errorf("slots: %v by session %v", m.Slots, m.SlotsBySession)
	}
	if p := get(t, srv, "/kinds"); !strings.Contains(p.body, `class="session-slots"`) || !strings.Contains(p.body, "max_running_per_session") {
		t.Error("the page shows neither the per-session slots nor the field")
	}
	var past struct {
		Kinds []struct {
			Policy map[string]any `json:"policy"`
		}
	}
	if c := getJSON(t, srv, srv.URL+"/api/kinds?at_seq="+strconv.FormatUint(set, 10), &past); c != 200 || len(past.Kinds) != 1 ||
		past.Kinds[0].Policy["max_running_per_session"] != 2.0 || past.Kinds[0].Policy["fair_sessions"] != true {
		t.Errorf("the policy at seq %d: %+v", set, past)
	}
}
