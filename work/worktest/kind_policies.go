package worktest

import (
	"math"
	"reflect"
	"slices"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// kindPolicyScenarios check Queue.SetKindPolicy (part 3: per-kind flow control), enforced by
// every claim method at its now.
func kindPolicyScenarios() []scenario {
	return []scenario{
		{"kind_policies/pause_skips_the_kind_in_every_claim", kindPolicyPause},
		{"kind_policies/max_running_counts_unexpired_leases_at_now", kindPolicyMaxRunning},
		{"kind_policies/rate_is_a_token_bucket_over_the_claims_now", kindPolicyRate},
		{"kind_policies/invalid_policies_name_the_field", kindPolicyInvalid},
		{"kind_policies/stats_show_policies_and_slots", kindPolicyStats},
		{"kind_policies/max_running_per_session_counts_each_sessions_leases", kindPolicyPerSession},
		{"kind_policies/fair_sessions_is_kept_and_shown", kindPolicyFairSessions},
	}
}

func (e *env) setPolicy(kind string, p work.KindPolicy, now time.Time) {
	e.t.Helper()
	n := e.logLen()
	e.ok("SetKindPolicyAt", e.q.SetKindPolicyAt(e.ctx, kind, p, now))
	evs := e.appended("SetKindPolicyAt", n, events.TypeKindPolicySet)
	ev := evs[0].(*events.KindPolicySet)
	if ev.Kind != kind || ev.SessionID != "" || ev.Paused != p.Paused || ev.MaxRunning != int64(p.MaxRunning) || ev.Rate != p.Rate ||
		ev.FairSessions != p.FairSessions || ev.MaxRunningPerSession != int64(p.MaxRunningPerSession) {
		e.t.Errorf("SetKindPolicyAt(%q, %+v) appended %+v", kind, p, ev)
	}
}

func (e *env) policies() map[string]work.KindPolicy {
	e.t.Helper()
	m, err := e.q.KindPolicies(e.ctx)
	e.ok("KindPolicies", err)
	return m
}

func kindsOf(ds []work.TaskDelivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Task.Kind
	}
	return out
}

func countKind(ds []work.TaskDelivery, kind string) int {
	n := 0
	for _, d := range ds {
		if d.Task.Kind == kind {
			n++
		}
	}
	return n
}

func kindPolicyPause(e *env) {
	for range 3 {
		e.submit("s", work.TaskRequest{Kind: "paused"}, at(100))
	}
	e.submit("s", work.TaskRequest{Kind: "open"}, at(101))
	e.setPolicy("paused", work.KindPolicy{Paused: true}, at(102))
	if got := e.policies(); len(got) != 1 || !got["paused"].Paused {
		e.t.Fatalf("KindPolicies = %+v, want paused only", got)
	}
	n := e.logLen()
	if ds := e.claimKinds([]string{"paused"}, at(110), lease, 10); len(ds) != 0 {
		e.t.Errorf("ClaimKinds of a paused kind claimed %d", len(ds))
	}
	if _, ds := e.sac(nil, []string{"paused"}, at(110), lease, 10); len(ds) != 0 {
		e.t.Errorf("SettleAndClaim of a paused kind claimed %d", len(ds))
	}
	e.nothingAppended("claims of a paused kind", n)
	ds := e.claim(at(110), lease, 10)
	if got := kindsOf(ds); !slices.Equal(got, []string{"open"}) {
		e.t.Fatalf("ClaimDue with a paused kind claimed kinds %q, want [open]", got)
	}
	// A paused policy survives a reopen; lifting it (a zero policy) removes it.
	e.reopen()
	e.claimNone(at(111))
	e.setPolicy("paused", work.KindPolicy{}, at(112))
	if got := e.policies(); len(got) != 0 {
		e.t.Errorf("KindPolicies after a zero policy = %+v, want none", got)
	}
	if ds := e.claim(at(113), lease, 10); countKind(ds, "paused") != 3 {
		e.t.Errorf("after the pause lifted, claimed %q, want the 3 paused tasks", kindsOf(ds))
	}
}

func kindPolicyMaxRunning(e *env) {
	for range 5 {
		e.submit("s", work.TaskRequest{Kind: "export"}, at(100))
	}
	e.submit("s", work.TaskRequest{Kind: "other"}, at(100))
	e.setPolicy("export", work.KindPolicy{MaxRunning: 2}, at(100))
	ds := e.claim(at(110), lease, 10) // leases to 140
	if countKind(ds, "export") != 2 || countKind(ds, "other") != 1 {
		e.t.Fatalf("first claim: kinds %q, want two exports and the other", kindsOf(ds))
	}
	e.claimNone(at(111))
	if got := e.claimKinds([]string{"export"}, at(112), lease, 10); len(got) != 0 {
		e.t.Fatalf("ClaimKinds with both slots held claimed %d", len(got))
	}
	// A settle frees a slot; SettleAndClaim's claim sees it in the same command.
	var exp []work.TaskDelivery
	for _, d := range ds {
		if d.Task.Kind == "export" {
			exp = append(exp, d)
		}
	}
	res, got := e.sac([]work.Settle{{Delivery: exp[0], Outcome: ptr(work.Success(js(`1`)))}}, nil, at(120), lease, 10) // lease to 150
	if res[0].Err != nil || len(got) != 1 || got[0].Task.Kind != "export" {
		e.t.Fatalf("SettleAndClaim: %v, claimed %q; want one export", res[0].Err, kindsOf(got))
	}
	// The reopened queue counts the same leases.
	e.reopen()
	e.claimNone(at(139))
	// At 140 exp[1]'s lease expired (and the other's): its slot is free, and it is itself
	// claimable again.
	ds = e.claim(at(140), lease, 10)
	if countKind(ds, "export") != 1 || countKind(ds, "other") != 1 {
		e.t.Fatalf("claim at the first lease expiry: kinds %q, want one export and the other", kindsOf(ds))
	}
	e.claimNone(at(141))
	// A policy change takes effect at once: a higher limit allows more.
	e.setPolicy("export", work.KindPolicy{MaxRunning: 4}, at(142))
	if ds = e.claim(at(142), lease, 10); len(ds) != 2 {
		e.t.Fatalf("claim after raising MaxRunning to 4: %d, want 2", len(ds))
	}
	e.claimNone(at(143))
}

func kindPolicyRate(e *env) {
	for range 10 {
		e.submit("s", work.TaskRequest{Kind: "sms"}, at(100))
	}
	e.setPolicy("sms", work.KindPolicy{Rate: 2, Burst: 3}, at(100))
	if got := e.policies()["sms"]; got != (work.KindPolicy{Rate: 2, Burst: 3}) {
		e.t.Fatalf("KindPolicies[sms] = %+v", got)
	}
	ms := func(n int) time.Time { return at(100).Add(time.Duration(n) * time.Millisecond) }
	if ds := e.claim(ms(0), lease, 10); len(ds) != 3 {
		e.t.Fatalf("a full bucket of 3: claimed %d", len(ds))
	}
	if ds := e.claim(ms(499), lease, 10); len(ds) != 0 {
		e.t.Fatalf("0.998 tokens: claimed %d", len(ds))
	}
	e.reopen() // the bucket is part of the projection
	if ds := e.claim(ms(500), lease, 10); len(ds) != 1 {
		e.t.Fatalf("one token after half a second: claimed %d", len(ds))
	}
	if ds := e.claimKinds([]string{"sms"}, ms(1000), lease, 10); len(ds) != 1 {
		e.t.Fatalf("ClaimKinds one token later: claimed %d", len(ds))
	}
	// Idle for long: the bucket holds at most Burst.
	if ds := e.claim(ms(60000), lease, 10); len(ds) != 3 {
		e.t.Fatalf("after a minute: claimed %d, want the burst of 3", len(ds))
	}
	// A claim with an earlier now refills nothing.
	if ds := e.claim(ms(59000), lease, 10); len(ds) != 0 {
		e.t.Fatalf("an earlier now: claimed %d", len(ds))
	}
	// Setting the policy again fills the bucket.
	e.setPolicy("sms", work.KindPolicy{Rate: 2, Burst: 1}, ms(60001))
	if ds := e.claim(ms(60001), lease, 10); len(ds) != 1 {
		e.t.Fatalf("a new policy's full bucket of 1: claimed %d", len(ds))
	}
}

func kindPolicyInvalid(e *env) {
	n := e.logLen()
	for _, c := range []struct {
		kind  string
		p     work.KindPolicy
		field string
	}{
		{"", work.KindPolicy{Paused: true}, "kind"},
		{"  ", work.KindPolicy{Paused: true}, "kind"},
		{"k", work.KindPolicy{MaxRunning: -1}, "max_running"},
		{"k", work.KindPolicy{Rate: -1, Burst: 1}, "rate"},
		{"k", work.KindPolicy{Rate: math.NaN(), Burst: 1}, "rate"},
		{"k", work.KindPolicy{Rate: math.Inf(1), Burst: 1}, "rate"},
		{"k", work.KindPolicy{Rate: 1}, "burst"},
		{"k", work.KindPolicy{Rate: 1, Burst: -1}, "burst"},
		{"k", work.KindPolicy{MaxRunning: 1, Burst: 5}, "burst"}, // a burst needs a rate
		{"k", work.KindPolicy{Burst: 1}, "burst"},
		{"k", work.KindPolicy{MaxRunningPerSession: -1}, "max_running_per_session"},
		{"k", work.KindPolicy{FairSessions: true, MaxRunningPerSession: -3}, "max_running_per_session"},
	} {
		e.wantInvalid("SetKindPolicyAt", e.q.SetKindPolicyAt(e.ctx, c.kind, c.p, at(1)), c.field)
	}
	e.nothingAppended("invalid policies", n)
	if got, ok := e.policies()["k"]; ok {
		e.t.Errorf("KindPolicies[k] = %+v after only invalid sets, want none", got)
	}
}

func kindPolicyStats(e *env) {
	for range 3 {
		e.submit("s", work.TaskRequest{Kind: "a"}, at(100))
	}
	e.setPolicy("a", work.KindPolicy{MaxRunning: 2, Rate: 1, Burst: 2}, at(100))
	e.setPolicy("b", work.KindPolicy{Paused: true}, at(100))
	e.claim(at(100), lease, 10)
	s, err := e.q.StatsAt(e.ctx, at(101))
	e.ok("StatsAt", err)
	want := []work.KindPolicyStats{
		{Kind: "a", Policy: work.KindPolicy{MaxRunning: 2, Rate: 1, Burst: 2}, Running: 2, Tokens: 1},
		{Kind: "b", Policy: work.KindPolicy{Paused: true}},
	}
	if !reflect.DeepEqual(s.Policies, want) {
		e.t.Errorf("Stats.Policies = %+v, want %+v", s.Policies, want)
	}
	if !slices.Equal(s.PausedKinds, []string{"b"}) {
		e.t.Errorf("Stats.PausedKinds = %q, want [b]", s.PausedKinds)
	}
	// At the leases' expiry the slots are free again.
	s, err = e.q.StatsAt(e.ctx, at(130))
	e.ok("StatsAt", err)
	if len(s.Policies) != 2 || s.Policies[0].Running != 0 || s.Policies[0].Tokens != 2 {
		e.t.Errorf("Stats.Policies at the leases' expiry = %+v, want a with 0 running and 2 tokens", s.Policies)
	}
}

// sessionsOf counts ds's tasks of kind by session.
func sessionsOf(ds []work.TaskDelivery, kind string) map[string]int {
	out := map[string]int{}
	for _, d := range ds {
		if d.Task.Kind == kind {
			out[d.Task.SessionID]++
		}
	}
	return out
}

func kindPolicyPerSession(e *env) {
	var a []work.Task
	for range 4 {
		a = append(a, e.submit("a", work.TaskRequest{Kind: "k"}, at(100)))
	}
	for range 2 {
		e.submit("b", work.TaskRequest{Kind: "k"}, at(101))
	}
	e.submit("a", work.TaskRequest{Kind: "other"}, at(101))
	p := work.KindPolicy{MaxRunningPerSession: 2}
	e.setPolicy("k", p, at(100))
	if got := e.policies()["k"]; got != p {
		e.t.Fatalf("KindPolicies[k] = %+v, want %+v", got, p)
	}
	// a's first two, b's two and the other kind (no limit); a's last two held back.
	ds := e.claim(at(110), lease, 10) // leases to 140
	if got := sessionsOf(ds, "k"); len(ds) != 5 || countKind(ds, "other") != 1 || got["a"] != 2 || got["b"] != 2 {
		e.t.Fatalf("first claim: sessions %v kinds %q, want a's two and b's two of k, and the other", got, kindsOf(ds))
	}
	e.claimNone(at(111))
	if got := e.claimKinds([]string{"k"}, at(111), lease, 10); len(got) != 0 {
		e.t.Fatalf("ClaimKinds with every session's slots held claimed %d", len(got))
	}
	s, err := e.q.StatsAt(e.ctx, at(111))
	e.ok("StatsAt", err)
	want := []work.KindPolicyStats{{Kind: "k", Policy: p, RunningBySession: map[string]int{"a": 2, "b": 2}}}
	if !reflect.DeepEqual(s.Policies, want) {
		e.t.Errorf("Stats.Policies = %+v, want %+v", s.Policies, want)
	}
	// A settle frees a's slot; SettleAndClaim's claim takes a's next in the same command.
	var first work.TaskDelivery
	for _, d := range ds {
		if d.Task.ID == a[0].ID {
			first = d
		}
	}
	res, got := e.sac([]work.Settle{{Delivery: first, Outcome: ptr(work.Success(js(`1`)))}}, nil, at(120), lease, 10) // lease to 150
	if res[0].Err != nil || len(got) != 1 || got[0].Task.ID != a[2].ID {
		e.t.Fatalf("SettleAndClaim: %v, claimed %v; want a's third task", res[0].Err, got)
	}
	// The reopened queue counts the same leases.
	e.reopen()
	e.claimNone(at(139))
	// At 140 a's second lease and b's expired: a holds one slot (its third, to 150), so it
	// gets one of its two due tasks: its fourth, due since 100, before its second, due again
	// from its lease's expiry at 140; b gets both again (and the other kind's task is
	// claimable again).
	ds = e.claim(at(140), lease, 10)
	if got := sessionsOf(ds, "k"); len(ds) != 4 || got["a"] != 1 || got["b"] != 2 {
		e.t.Fatalf("claim at the leases' expiry: sessions %v, want a once and b twice", got)
	}
	for _, d := range ds {
		if d.Task.SessionID == "a" && d.Task.Kind == "k" && d.Task.ID != a[3].ID {
			e.t.Errorf("a's claim at 140 took %s, want its first due task %s", d.Task.ID, a[3].ID)
		}
	}
	e.claimNone(at(141))
	// Lifting the limit lets a's second task go.
	e.setPolicy("k", work.KindPolicy{}, at(142))
	if ds = e.claim(at(142), lease, 10); len(ds) != 1 || ds[0].Task.ID != a[1].ID {
		e.t.Fatalf("claim after lifting the limit: %d tasks, want a's second", len(ds))
	}
}

func kindPolicyFairSessions(e *env) {
	p := work.KindPolicy{FairSessions: true}
	e.setPolicy("k", p, at(100))
	q := work.KindPolicy{FairSessions: true, MaxRunningPerSession: 3, MaxRunning: 5}
	e.setPolicy("j", q, at(100))
	e.reopen()
	if got := e.policies(); len(got) != 2 || got["k"] != p || got["j"] != q {
		e.t.Fatalf("KindPolicies after a reopen = %+v, want k %+v and j %+v", got, p, q)
	}
	e.submit("s", work.TaskRequest{Kind: "k"}, at(101))
	if ds := e.claim(at(101), lease, 10); len(ds) != 1 {
		e.t.Fatalf("a fair kind's one task: claimed %d", len(ds))
	}
}
