package worktest

import (
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// sessionWakeScenarios check Queue.ClaimSessionWakes (part 3: wakes of chosen sessions).
func sessionWakeScenarios() []scenario {
	return []scenario{
		{"session_wakes/only_chosen_sessions_in_claim_wakes_order", sessionWakesOrder},
		{"session_wakes/leases_fencing_ack_and_reopen", sessionWakesLeases},
		{"session_wakes/invalid_requests_claim_nothing", sessionWakesInvalid},
	}
}

// claimSessionWakes calls ClaimSessionWakesAt, which must succeed, checks every delivery as
// claimWakes does, and that each is a wake of one of sessions.
func (e *env) claimSessionWakes(sessions []string, now time.Time, leaseFor time.Duration, limit int) []work.WakeDelivery {
	e.t.Helper()
	ds, err := e.q.ClaimSessionWakesAt(e.ctx, sessions, now, leaseFor, limit)
	e.ok("ClaimSessionWakesAt", err)
	if len(ds) > limit {
		e.t.Fatalf("ClaimSessionWakesAt(limit %d) returned %d deliveries", limit, len(ds))
	}
	for _, d := range ds {
		e.noteToken(d.LeaseToken())
		e.noLeak(d, d.LeaseToken())
		if d.Attempt == 0 {
			e.t.Errorf("wake delivery of %s: attempt 0", d.Wake.ID)
		}
		if !d.LeaseExpiresAt.Equal(now.Add(leaseFor)) {
			e.t.Errorf("wake delivery of %s: lease expires %v, want %v", d.Wake.ID, d.LeaseExpiresAt, now.Add(leaseFor))
		}
		ok := false
		for _, s := range sessions {
			ok = ok || d.Wake.SessionID == s
		}
		if !ok {
			e.t.Errorf("ClaimSessionWakesAt(%q) delivered %s of session %q", sessions, d.Wake.ID, d.Wake.SessionID)
		}
	}
	return ds
}

func wakeIDs(ds []work.WakeDelivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Wake.ID
	}
	return out
}

func sessionWakesOrder(e *env) {
	// Sessions whose names are prefixes of each other ("a" of "ab") must not see each other's wakes.
	const a, b, c, ab = "a", "b", "c", "ab"
	a1 := e.wake(a, work.WakeRequest{}, at(100)).ID
	b1 := e.wake(b, work.WakeRequest{}, at(90)).ID
	c1 := e.wake(c, work.WakeRequest{}, at(100)).ID
	a2 := e.wake(a, work.WakeRequest{}, at(95)).ID // created after a1 with an earlier clock: available first
	ab1 := e.wake(ab, work.WakeRequest{}, at(80)).ID
	// A completion wake of session c, available at its task's settlement.
	e.submit(c, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
	d := e.claimOne(at(105))
	e.finish(d, work.Success(js(`1`)), at(110))
	names := map[string]string{a1: "a1", a2: "a2", b1: "b1", c1: "c1", ab1: "ab1"}

	n := e.logLen()
	e.sameOrder("a session with no wakes", wakeIDs(e.claimSessionWakes([]string{"z"}, at(1000), lease, 10)), nil, names)
	e.sameOrder("session a before any is available", wakeIDs(e.claimSessionWakes([]string{a}, at(94), lease, 10)), nil, names)
	e.nothingAppended("claims of session wakes that found nothing", n)

	n = e.logLen()
	e.sameOrder("session a, limit 1", wakeIDs(e.claimSessionWakes([]string{a}, at(100), lease, 1)), []string{a2}, names)
	evs := e.appended("a claim of session wakes", n, events.TypeWakeClaimed)
	if wc := evs[0].(*events.WakeClaimed); wc.SessionID != a || wc.Attempt != 1 {
		e.t.Errorf("the claim event names session %q attempt %d, want %q attempt 1", wc.SessionID, wc.Attempt, a)
	}
	// Among the chosen sessions (one named twice), ClaimWakes' order: a1 and c1 at 100 in
	// creation order, then c's completion wake at 110.
	got := e.claimSessionWakes([]string{c, a, c}, at(120), lease, 10)
	if len(got) != 3 {
		e.t.Fatalf("sessions c and a at 120: %d wakes, want 3", len(got))
	}
	cw := got[2].Wake.ID
	names[cw] = "c-completion"
	e.sameOrder("sessions c and a at 120", wakeIDs(got), []string{a1, c1, cw}, names)
	if got[2].Wake.Reason.Kind != work.WakeTaskFinished {
		e.t.Errorf("the third wake is %v, want c's completion wake", got[2].Wake.Reason.Kind)
	}
	// The other sessions' wakes are untouched: ClaimWakes finds them, in its order.
	e.sameOrder("ClaimWakes at 120", wakeIDs(e.claimWakes(at(120), lease, 10)), []string{ab1, b1}, names)
	// Everything is leased now: nothing for anyone until the leases expire.
	n = e.logLen()
	e.sameOrder("all sessions at 124", wakeIDs(e.claimSessionWakes([]string{a, b, c, ab}, at(124), lease, 10)), nil, names)
	e.nothingAppended("a claim while every lease holds", n)
	// Expired leases come back in expiry order, then creation order: a2 (130), a1 and c1
	// (150, a1 created first), c's completion wake (150, created last); ab1 and b1 (150) are
	// not asked for.
	got = e.claimSessionWakes([]string{a, c}, at(150), lease, 10)
	e.sameOrder("sessions a and c at 150", wakeIDs(got), []string{a2, a1, c1, cw}, names)
	for i, want := range []uint32{2, 2, 2, 2} {
		if i < len(got) && got[i].Attempt != want {
			e.t.Errorf("%s: attempt %d, want %d", names[got[i].Wake.ID], got[i].Attempt, want)
		}
	}
	// The others' leases expired at 150 too: ClaimWakes takes them in creation order.
	e.sameOrder("ClaimWakes at 150", wakeIDs(e.claimWakes(at(150), lease, 10)), []string{b1, ab1}, names)
}

func sessionWakesLeases(e *env) {
	const s, other = "session_sw", "session_sw_other"
	base := e.ctx
	defer func() { e.ctx = base }()
	w := e.wake(s, work.WakeRequest{Payload: js(`{"n":1}`)}, at(100))
	o := e.wake(other, work.WakeRequest{}, at(100))

	e.ctx = work.WithWorker(base, "agent-1")
	n := e.logLen()
	ds := e.claimSessionWakes([]string{s}, at(100), lease, 10)
	if len(ds) != 1 || ds[0].Wake.ID != w.ID || ds[0].Attempt != 1 || string(ds[0].Wake.Reason.Payload) != `{"n":1}` {
		e.t.Fatalf("first claim: %+v", ds)
	}
	first := ds[0]
	if first.Worker != "agent-1" {
		e.t.Errorf("delivery worker %q, want agent-1", first.Worker)
	}
	evs := e.appended("the first claim", n, events.TypeWakeClaimed)
	if got := e.claimWorker(evs[0]); got != "agent-1" {
		e.t.Errorf("wake_claimed records worker %q, want agent-1", got)
	}

	// The lease holds until 130 (not at 129), then the wake is delivered again: attempt 2.
	e.sameOrder("at 129", wakeIDs(e.claimSessionWakes([]string{s}, at(129), lease, 10)), nil, nil)
	e.reopen() // the per-session index is durable state like the others
	e.ctx = work.WithWorker(base, "agent-2")
	ds = e.claimSessionWakes([]string{s}, at(130), lease, 10)
	if len(ds) != 1 || ds[0].Wake.ID != w.ID || ds[0].Attempt != 2 || ds[0].Worker != "agent-2" {
		e.t.Fatalf("re-claim after expiry: %+v", ds)
	}
	second := ds[0]
	// Fencing: the first delivery's token no longer acknowledges.
	n = e.logLen()
	e.wantErr("ack by the first delivery", e.ack(first, at(131)), work.ErrStaleDelivery)
	e.noStateChange("a stale ack", n, 2)
	e.ok("ack by the second delivery", e.ack(second, at(132)))
	e.ok("the same ack again", e.ack(second, at(133)))
	n = e.logLen()
	e.sameOrder("after the ack", wakeIDs(e.claimSessionWakes([]string{s}, at(1000), lease, 10)), nil, nil)
	e.nothingAppended("a claim after the ack", n)

	// The other session's wake was never claimed.
	ds = e.claimWakes(at(1000), lease, 10)
	if len(ds) != 1 || ds[0].Wake.ID != o.ID || ds[0].Attempt != 1 {
		e.t.Fatalf("ClaimWakes after: %+v, want only %s at attempt 1", ds, o.ID)
	}
}

func sessionWakesInvalid(e *env) {
	const s = "session_sw_invalid"
	e.wake(s, work.WakeRequest{}, at(100))
	try := func(what string, sessions []string, leaseFor time.Duration, limit int, field string) {
		e.t.Helper()
		n := e.logLen()
		ds, err := e.q.ClaimSessionWakesAt(e.ctx, sessions, at(100), leaseFor, limit)
		e.wantInvalid(what, err, field)
		if ds != nil {
			e.t.Errorf("%s: deliveries %v beside the error", what, ds)
		}
		e.nothingAppended(what, n)
	}
	try("nil sessions", nil, lease, 1, "sessions")
	try("no sessions", []string{}, lease, 1, "sessions")
	try("a blank session", []string{s, " "}, lease, 1, "session_id")
	try("an empty session", []string{""}, lease, 1, "session_id")
	try("a session id over the limit", []string{strings.Repeat("s", 1<<20)}, lease, 1, "session_id")
	try("zero lease", []string{s}, 0, 1, "lease_for")
	try("zero limit", []string{s}, lease, 0, "limit")
	try("negative limit", []string{s}, lease, -1, "limit")
	base := e.ctx
	e.ctx = work.WithWorker(base, "")
	try("an empty worker", []string{s}, lease, 1, "worker")
	e.ctx = base
	// The wake is still there for a valid claim.
	if ds := e.claimSessionWakes([]string{s}, at(100), lease, 1); len(ds) != 1 {
		e.t.Fatalf("valid claim after the refused ones: %d wakes", len(ds))
	}
}
