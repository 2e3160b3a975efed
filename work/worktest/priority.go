package worktest

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// priorityScenarios: TaskRequest.Priority and Headers (shared/spec/work-api-3.md, "Priority
// and headers").
func priorityScenarios() []scenario {
	return []scenario{
		{"priority/claim_order", priorityClaimOrder},
		{"priority/scheduled_not_before_due", priorityScheduled},
		{"priority/expired_leases", priorityExpiredLeases},
		{"priority/claim_kinds", priorityClaimKinds},
		{"priority/settle_and_claim", prioritySettleAndClaim},
		{"priority/reopen", priorityReopen},
		{"priority/idempotency", priorityIdempotency},
		{"priority/headers", priorityHeaders},
		{"priority/validation", priorityValidation},
		{"priority/stats_oldest", priorityStatsOldest},
	}
}

// priorityClaimOrder: among due tasks, higher priority first; equal priorities keep part
// 1's order (earlier ScheduledAt, then submission order); the default is 0.
func priorityClaimOrder(e *env) {
	const s = "session_prio"
	sub := func(pri int, runAt time.Time, now int) string {
		return e.submit(s, work.TaskRequest{Kind: "k", Priority: pri, RunAt: runAt}, at(now)).ID
	}
	z1 := sub(0, time.Time{}, 100)
	lo := sub(-5, at(10), 100)
	h1 := sub(7, time.Time{}, 100)
	z2 := sub(0, at(50), 100)
	h2 := sub(7, at(90), 100) // same priority as h1, due earlier: first
	top := sub(1000, time.Time{}, 100)
	names := map[string]string{z1: "z1", lo: "lo", h1: "h1", z2: "z2", h2: "h2", top: "top"}
	if got := e.mustTask(s, top); got.Priority != 1000 {
		e.t.Errorf("Task.Priority = %d, want 1000", got.Priority)
	}
	if got := e.mustTask(s, z1); got.Priority != 0 || got.Headers != nil {
		e.t.Errorf("a default task has priority %d, headers %v", got.Priority, got.Headers)
	}
	got := idsOf(e.claim(at(100), lease, 2))
	e.sameOrder("limit 2", got, []string{top, h2}, names)
	got = idsOf(e.claim(at(100), lease, 10))
	e.sameOrder("the rest", got, []string{h1, z2, z1, lo}, names)
}

// priorityScheduled: a high-priority task scheduled later is not claimed before it is due,
// and does not hide the due tasks of lower priorities.
func priorityScheduled(e *env) {
	const s = "session_prio_sched"
	future := e.submit(s, work.TaskRequest{Kind: "k", Priority: 900, RunAt: at(500)}, at(100)).ID
	low := e.submit(s, work.TaskRequest{Kind: "k", Priority: -900}, at(100)).ID
	mid := e.submit(s, work.TaskRequest{Kind: "k", Priority: 3}, at(100)).ID
	names := map[string]string{future: "future", low: "low", mid: "mid"}
	e.sameOrder("at 100", idsOf(e.claim(at(100), 10*time.Minute, 10)), []string{mid, low}, names)
	e.claimNone(at(499))
	e.sameOrder("at 500", idsOf(e.claim(at(500), lease, 10)), []string{future}, names)
}

// priorityExpiredLeases: a running task whose lease expired is claimable again under its own
// priority, in the same order as pending ones.
func priorityExpiredLeases(e *env) {
	const s = "session_prio_expired"
	hi := e.submit(s, work.TaskRequest{Kind: "k", Priority: 10}, at(100)).ID
	lo := e.submit(s, work.TaskRequest{Kind: "k", Priority: -10}, at(100)).ID
	names := map[string]string{hi: "hi", lo: "lo"}
	e.sameOrder("first claims", idsOf(e.claim(at(100), lease, 10)), []string{hi, lo}, names)
	// Both leases expire at 130; a new pending task of priority 0 comes between them.
	mid := e.submit(s, work.TaskRequest{Kind: "k"}, at(120)).ID
	names[mid] = "mid"
	got := e.claim(at(200), lease, 10)
	e.sameOrder("after expiry", idsOf(got), []string{hi, mid, lo}, names)
	for i, want := range []uint32{2, 1, 2} {
		if i < len(got) && got[i].Attempt != want {
			e.t.Errorf("%s: attempt %d, want %d", names[got[i].Task.ID], got[i].Attempt, want)
		}
	}
}

// priorityClaimKinds: claims by kind honour priority across the kinds named, and priorities
// of other kinds change nothing.
func priorityClaimKinds(e *env) {
	const s = "session_prio_kinds"
	sub := func(kind string, pri int) string {
		return e.submit(s, work.TaskRequest{Kind: kind, Priority: pri}, at(100)).ID
	}
	a0 := sub("a", 0)
	b5 := sub("b", 5)
	c9 := sub("c", 9)
	a5 := sub("a", 5)
	b0 := sub("b", 0)
	aN := sub("a", -1)
	names := map[string]string{a0: "a0", b5: "b5", c9: "c9", a5: "a5", b0: "b0", aN: "aN"}
	e.sameOrder("kind a", idsOf(e.claimKinds([]string{"a"}, at(100), lease, 1)), []string{a5}, names)
	e.sameOrder("kinds a and b", idsOf(e.claimKinds([]string{"a", "b"}, at(100), lease, 10)), []string{b5, a0, b0, aN}, names)
	e.sameOrder("ClaimDue", idsOf(e.claim(at(100), lease, 10)), []string{c9}, names)
}

// prioritySettleAndClaim: SettleAndClaim's claim takes priority first too.
func prioritySettleAndClaim(e *env) {
	const s = "session_prio_sac"
	first := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d := e.claimOne(at(100))
	lo := e.submit(s, work.TaskRequest{Kind: "k", Priority: -1}, at(101)).ID
	hi := e.submit(s, work.TaskRequest{Kind: "k", Priority: 1}, at(102)).ID
	names := map[string]string{first.ID: "first", lo: "lo", hi: "hi"}
	_, got := e.sac([]work.Settle{{Delivery: d, Outcome: &work.Outcome{State: work.TaskSucceeded}}}, []string{"k"}, at(110), lease, 1)
	e.sameOrder("SettleAndClaim", idsOf(got), []string{hi}, names)
}

// priorityReopen: priorities and headers survive a reopen, and so does the claim order.
func priorityReopen(e *env) {
	const s = "session_prio_reopen"
	lo := e.submit(s, work.TaskRequest{Kind: "k", Priority: -3}, at(100)).ID
	hi := e.submit(s, work.TaskRequest{Kind: "k", Priority: 3, Headers: map[string]string{"tenant": "acme"}}, at(100)).ID
	e.reopen()
	if got := e.mustTask(s, hi); got.Priority != 3 || got.Headers["tenant"] != "acme" {
		e.t.Errorf("after reopen: priority %d, headers %v", got.Priority, got.Headers)
	}
	e.sameOrder("after reopen", idsOf(e.claim(at(100), lease, 10)), []string{hi, lo}, map[string]string{lo: "lo", hi: "hi"})
}

// priorityIdempotency: priority is part of the intent (a conflict names it, after kind,
// run_at and wake, before input); headers are not.
func priorityIdempotency(e *env) {
	const s = "session_prio_key"
	base := work.TaskRequest{Kind: "k", Input: js(`{"a":1}`), IdempotencyKey: "k1", Priority: 4,
		Headers: map[string]string{"traceparent": "00-aa-bb-01"}}
	first := e.submit(s, base, at(100))
	n := e.logLen()
	r := base
	r.Priority = 5
	we := e.wantErr("another priority", e.submitErr(s, r, at(101)), work.ErrIdempotencyConflict)
	if we.Field != "priority" || we.ID != first.ID {
		e.t.Errorf("conflict names field %q, task %q; want priority, %s", we.Field, we.ID, first.ID)
	}
	r.Input = js(`{"a":2}`) // priority comes before input
	if we := e.wantErr("priority and input", e.submitErr(s, r, at(101)), work.ErrIdempotencyConflict); we.Field != "priority" {
		e.t.Errorf("priority and input differ: conflict names %q, want priority", we.Field)
	}
	r = base
	r.Wake = work.WakeOnCompletion // wake comes before priority
	r.Priority = 0
	if we := e.wantErr("wake and priority", e.submitErr(s, r, at(101)), work.ErrIdempotencyConflict); we.Field != "wake" {
		e.t.Errorf("wake and priority differ: conflict names %q, want wake", we.Field)
	}
	// Other headers, or none: the existing task, unchanged.
	for _, h := range []map[string]string{nil, {"traceparent": "00-cc-dd-01", "tenant": "x"}} {
		r = base
		r.Headers = h
		got := e.submit(s, r, at(102))
		if got.ID != first.ID || !maps.Equal(got.Headers, base.Headers) {
			e.t.Errorf("resubmit with headers %v: task %s headers %v, want %s headers %v", h, got.ID, got.Headers, first.ID, base.Headers)
		}
	}
	e.nothingAppended("conflicts and repeats", n)
}

// priorityHeaders: headers round-trip (Submit's answer, Session.Task, Session.Tasks, a
// claim's delivery, the event); the caller's map is copied; at the limits they are accepted.
func priorityHeaders(e *env) {
	const s = "session_headers"
	h := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "vendor=x",
		"empty":       "",
		"bytes\xff":   "not utf-8 \x00",
	}
	want := maps.Clone(h)
	n := e.logLen()
	got := e.submit(s, work.TaskRequest{Kind: "k", Headers: h}, at(100))
	h["traceparent"] = "changed by the caller"
	got.Headers["tenant"] = "changed in a snapshot"
	evs := e.appended("a submit with headers", n, events.TypeTaskSubmitted)
	if len(evs) == 1 {
		if sub := evs[0].(*events.TaskSubmitted); !maps.Equal(sub.Headers, want) {
			e.t.Errorf("event headers %v, want %v", sub.Headers, want)
		}
	}
	if t := e.mustTask(s, got.ID); !maps.Equal(t.Headers, want) {
		e.t.Errorf("Task.Headers %v, want %v", t.Headers, want)
	}
	if l := e.list(s, work.TaskFilter{Limit: 10}); len(l) != 1 || !maps.Equal(l[0].Headers, want) {
		e.t.Errorf("Session.Tasks: %+v", l)
	}
	if d := e.claimOne(at(100)); !maps.Equal(d.Task.Headers, want) {
		e.t.Errorf("delivery headers %v, want %v", d.Task.Headers, want)
	}
	// At the limits: 64 entries, a key of 256 bytes, 16 KiB in all.
	full := map[string]string{strings.Repeat("k", events.MaxHeaderKey): ""}
	for i := range events.MaxHeaders - 2 {
		full[fmt.Sprintf("h%02d", i)] = "v"
	}
	used := events.MaxHeaderKey + (events.MaxHeaders-2)*4
	full["last"] = strings.Repeat("v", events.MaxHeaderBytes-used-len("last"))
	big := e.submit(s, work.TaskRequest{Kind: "k", Headers: full}, at(100))
	if t := e.mustTask(s, big.ID); !maps.Equal(t.Headers, full) {
		e.t.Errorf("headers at the limits did not round-trip (%d entries)", len(t.Headers))
	}
	// An empty map is no headers.
	if t := e.submit(s, work.TaskRequest{Kind: "k", Headers: map[string]string{}}, at(100)); t.Headers != nil {
		e.t.Errorf("empty headers read back as %v", t.Headers)
	}
}

// priorityValidation: out-of-range priorities and headers are ErrInvalidRequest naming the
// field, before anything is stored.
func priorityValidation(e *env) {
	const s = "session_prio_valid"
	n := e.logLen()
	for _, p := range []int{1001, -1001, 1 << 40, -1 << 40} {
		e.wantInvalid(fmt.Sprintf("priority %d", p), e.submitErr(s, work.TaskRequest{Kind: "k", Priority: p}, at(100)), "priority")
	}
	many := map[string]string{}
	for i := range events.MaxHeaders + 1 {
		many[fmt.Sprintf("h%02d", i)] = ""
	}
	for what, h := range map[string]map[string]string{
		"65 entries":       many,
		"an empty key":     {"": "v"},
		"a 257-byte key":   {strings.Repeat("k", events.MaxHeaderKey+1): "v"},
		"16 KiB + 1 bytes": {"a": strings.Repeat("v", events.MaxHeaderBytes)},
	} {
		e.wantInvalid("headers: "+what, e.submitErr(s, work.TaskRequest{Kind: "k", Headers: h}, at(100)), "headers")
	}
	e.nothingAppended("invalid priorities and headers", n)
	for _, p := range []int{1000, -1000} {
		if t := e.submit(s, work.TaskRequest{Kind: "k", Priority: p}, at(100)); t.Priority != p {
			e.t.Errorf("priority %d stored as %d", p, t.Priority)
		}
	}
}

// priorityStatsOldest: Stats' oldest due task is the oldest of every priority, not the
// first in claim order.
func priorityStatsOldest(e *env) {
	const s = "session_prio_stats"
	e.submit(s, work.TaskRequest{Kind: "k", Priority: 5}, at(100))
	e.submit(s, work.TaskRequest{Kind: "k", Priority: -5}, at(40))
	st, err := e.q.StatsAt(e.ctx, at(200))
	e.ok("StatsAt", err)
	if st.DueNow != 2 || !st.OldestDueAt.Equal(at(40)) {
		e.t.Errorf("DueNow %d, OldestDueAt %v; want 2, %v", st.DueNow, st.OldestDueAt, at(40))
	}
}
