package worktest

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// --- stats ---

// counts builds a StateCounts from pending, running, succeeded, failed, canceled.
func counts(p, r, s, f, c int64) work.StateCounts {
	return work.StateCounts{Pending: p, Running: r, Succeeded: s, Failed: f, Canceled: c}
}

func kindStats(kind string, c work.StateCounts) work.KindStats {
	return work.KindStats{Kind: kind, StateCounts: c}
}

func statsTransitions(e *env) {
	const s = "session_stats"
	n := e.logLen()
	e.stats("a fresh queue", at(100), statsWant{})
	e.nothingAppended("Stats", n)

	a := e.submit(s, work.TaskRequest{Kind: "x", IdempotencyKey: "k-a"}, at(100))
	b := e.submit(s, work.TaskRequest{Kind: "x", RunAt: at(200)}, at(100))
	c := e.submit(s, work.TaskRequest{Kind: "y"}, at(100))
	e.submit(s, work.TaskRequest{Kind: "x", IdempotencyKey: "k-a"}, at(101)) // a repeat counts nothing
	n = e.logLen()
	e.stats("three submitted", at(100), statsWant{
		total: counts(3, 0, 0, 0, 0),
		kinds: []work.KindStats{kindStats("x", counts(2, 0, 0, 0, 0)), kindStats("y", counts(1, 0, 0, 0, 0))},
		due:   2, oldest: at(100),
	})
	e.nothingAppended("Stats", n)

	da := e.claimOne(at(110)) // a, until 140
	if da.Task.ID != a.ID {
		e.t.Fatalf("claimed %s, want a", da.Task.ID)
	}
	e.stats("a claimed", at(110), statsWant{
		total: counts(2, 1, 0, 0, 0),
		kinds: []work.KindStats{kindStats("x", counts(1, 1, 0, 0, 0)), kindStats("y", counts(1, 0, 0, 0, 0))},
		due:   1, oldest: at(100),
	})
	e.extend(da, 5*time.Second, at(120)) // a: until 125
	e.stats("a's lease extended, then expired", at(125), statsWant{
		total: counts(2, 1, 0, 0, 0),
		kinds: []work.KindStats{kindStats("x", counts(1, 1, 0, 0, 0)), kindStats("y", counts(1, 0, 0, 0, 0))},
		due:   2, oldest: at(100),
	})
	e.release(da, work.ReleaseRequest{}, at(126)) // a: pending at 126
	e.stats("a released", at(126), statsWant{
		total: counts(3, 0, 0, 0, 0),
		kinds: []work.KindStats{kindStats("x", counts(2, 0, 0, 0, 0)), kindStats("y", counts(1, 0, 0, 0, 0))},
		due:   2, oldest: at(100),
	})
	ds := e.claim(at(130), lease, 10) // c (due 100), a (due 126)
	if len(ds) != 2 || ds[0].Task.ID != c.ID || ds[1].Task.ID != a.ID {
		e.t.Fatalf("claimed %d, want c then a", len(ds))
	}
	dc, da := ds[0], ds[1]
	e.stats("a and c claimed", at(130), statsWant{
		total: counts(1, 2, 0, 0, 0),
		kinds: []work.KindStats{kindStats("x", counts(1, 1, 0, 0, 0)), kindStats("y", counts(0, 1, 0, 0, 0))},
	})
	e.cancel(s, b.ID, at(131)) // pending: canceled
	e.cancel(s, a.ID, at(132)) // running: only a request
	e.stats("b canceled, a asked to stop", at(132), statsWant{
		total: counts(0, 2, 0, 0, 1),
		kinds: []work.KindStats{kindStats("x", counts(0, 1, 0, 0, 1)), kindStats("y", counts(0, 1, 0, 0, 0))},
	})
	e.finish(dc, work.Success(nil), at(133))
	e.wantErr("a stale finish", e.finishErr(work.NewTaskDelivery(dc.Task, 1, dc.LeaseExpiresAt, "forged-token"), work.Failure("x"), at(133)),
		work.ErrStaleDelivery)
	e.stats("c succeeded", at(133), statsWant{
		total: counts(0, 1, 1, 0, 1),
		kinds: []work.KindStats{kindStats("x", counts(0, 1, 0, 0, 1)), kindStats("y", counts(0, 0, 1, 0, 0))},
	})
	e.release(da, work.ReleaseRequest{}, at(134)) // cancel requested: canceled
	e.stats("a released while asked to stop", at(134), statsWant{
		total: counts(0, 0, 1, 0, 2),
		kinds: []work.KindStats{kindStats("x", counts(0, 0, 0, 0, 2)), kindStats("y", counts(0, 0, 1, 0, 0))},
	})
	e.submit(s, work.TaskRequest{Kind: "w"}, at(140))
	dd := e.claimOne(at(140))
	e.finish(dd, work.Failure("no"), at(141))
	final := statsWant{
		total: counts(0, 0, 1, 1, 2),
		kinds: []work.KindStats{
			kindStats("w", counts(0, 0, 0, 1, 0)),
			kindStats("x", counts(0, 0, 0, 0, 2)),
			kindStats("y", counts(0, 0, 1, 0, 0)),
		},
	}
	e.stats("every task settled", at(1000), final)
	e.reopen()
	e.stats("every task settled, after a reopen", at(1000), final)
}

func statsDue(e *env) {
	const s = "session_stats_due"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(90))
	dr := e.claimOne(at(90)) // r: until 120
	p := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	e.submit(s, work.TaskRequest{Kind: "k", RunAt: at(150)}, at(100))
	tot := counts(2, 1, 0, 0, 0)
	kinds := []work.KindStats{kindStats("k", tot)}
	n := e.logLen()
	e.stats("before anything is due", at(99), statsWant{total: tot, kinds: kinds})
	e.stats("p due", at(100), statsWant{total: tot, kinds: kinds, due: 1, oldest: at(100)})
	e.stats("p due, r's lease expired exactly now", at(120), statsWant{total: tot, kinds: kinds, due: 2, oldest: at(100)})
	e.stats("1ns before f", at(150).Add(-time.Nanosecond), statsWant{total: tot, kinds: kinds, due: 2, oldest: at(100)})
	e.stats("all three due", at(150), statsWant{total: tot, kinds: kinds, due: 3, oldest: at(100)})
	e.stats("long after", at(3600), statsWant{total: tot, kinds: kinds, due: 3, oldest: at(100)})
	e.nothingAppended("Stats", n)

	d := e.claimOne(at(150))
	if d.Task.ID != p {
		e.t.Fatalf("claimed %s, want p", d.Task.ID)
	}
	tot = counts(1, 2, 0, 0, 0)
	kinds = []work.KindStats{kindStats("k", tot)}
	// The oldest due is now r, whose lease expired at 120.
	e.stats("p claimed", at(150), statsWant{total: tot, kinds: kinds, due: 2, oldest: at(120)})
	e.extend(dr, time.Hour, at(151)) // r: until 3751
	e.stats("r extended", at(151), statsWant{total: tot, kinds: kinds, due: 1, oldest: at(150)})
	// A release into the future is not due.
	e.release(d, work.ReleaseRequest{RunAt: at(400)}, at(152))
	tot = counts(2, 1, 0, 0, 0)
	kinds = []work.KindStats{kindStats("k", tot)}
	e.stats("p released until 400", at(152), statsWant{total: tot, kinds: kinds, due: 1, oldest: at(150)})
	e.stats("at 400", at(400), statsWant{total: tot, kinds: kinds, due: 2, oldest: at(150)})
}

func statsValidation(e *env) {
	e.submit("session_stats_valid", work.TaskRequest{Kind: "k"}, at(100))
	for _, bad := range []time.Time{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		st, err := e.q.StatsAt(e.ctx, bad)
		if err == nil {
			e.t.Fatalf("StatsAt(%v) succeeded with %+v", bad, st)
		}
		e.wantInvalid("Stats at "+bad.String(), err, "now")
	}
}

// --- settle and claim ---

// sac calls SettleAndClaimAt, which must succeed: one result per settle, every error in a
// result follows the error rules, and the claims are checked as claim checks them.
func (e *env) sac(settles []work.Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]work.SettleResult, []work.TaskDelivery) {
	e.t.Helper()
	res, ds, err := e.q.SettleAndClaimAt(e.ctx, settles, kinds, now, leaseFor, limit)
	e.ok("SettleAndClaimAt", err)
	if len(res) != len(settles) {
		e.t.Fatalf("SettleAndClaimAt returned %d results for %d settles", len(res), len(settles))
	}
	for i, r := range res {
		if r.Err != nil {
			e.check(r.Err)
			if !isZero(r.Task) {
				e.t.Errorf("settle %d failed (%v) but its result has task %+v", i, r.Err, r.Task)
			}
		}
	}
	e.checkClaimed("SettleAndClaimAt", ds, now, leaseFor, limit)
	for _, d := range ds {
		if len(kinds) == 0 {
			continue
		}
		ok := false
		for _, k := range kinds {
			ok = ok || d.Task.Kind == k
		}
		if !ok {
			e.t.Errorf("SettleAndClaimAt(kinds %q) delivered %s of kind %q", kinds, d.Task.ID, d.Task.Kind)
		}
	}
	return res, ds
}

// stateEvents are the types of the events after the first n, audit records left out.
func (e *env) stateEvents(n int) []events.Type {
	e.t.Helper()
	var out []events.Type
	for _, ev := range e.since(n) {
		switch ev.Type() {
		case events.TypeTaskSettleRejected, events.TypeWakeAckRejected:
			continue
		}
		out = append(out, ev.Type())
	}
	return out
}

func (e *env) wantStateEvents(what string, n int, want ...events.Type) {
	e.t.Helper()
	if got := e.stateEvents(n); fmt.Sprint(got) != fmt.Sprint(want) {
		e.t.Errorf("%s appended %v (audit records left out), want %v", what, got, want)
	}
}

func sacMixed(e *env) {
	const s = "session_sac"
	sub := func(kind string, wake bool) string {
		r := work.TaskRequest{Kind: kind}
		if wake {
			r.Wake = work.WakeOnCompletion
		}
		return e.submit(s, r, at(100)).ID
	}
	t1, t2, t3, t4 := sub("k", true), sub("k", false), sub("k", false), sub("k", false)
	ds := e.claim(at(100), lease, 4)
	if len(ds) != 4 {
		e.t.Fatalf("claimed %d of 4", len(ds))
	}
	d1, d2, d3, d4 := ds[0], ds[1], ds[2], ds[3]
	t5, t6 := sub("other", false), sub("k", false)
	names := map[string]string{t1: "t1", t2: "t2", t3: "t3", t4: "t4", t5: "t5", t6: "t6"}
	before4 := e.mustTask(s, t4)

	n := e.logLen()
	res, claimed := e.sac([]work.Settle{
		{Delivery: d1, Outcome: ptr(work.Success(js(`{"r":1}`)))},
		{Delivery: d2, Release: &work.ReleaseRequest{Reason: "retry"}},
		{Delivery: work.NewTaskDelivery(d4.Task, 1, d4.LeaseExpiresAt, "forged-token"), Outcome: ptr(work.Failure("late"))},
		{Delivery: d3, Release: &work.ReleaseRequest{RunAt: at(500)}},
	}, nil, at(110), lease, 10)

	// Each settle as FinishAt or ReleaseAt would have done it.
	if r := res[0]; r.Err != nil || r.Task.ID != t1 || r.Task.State != work.TaskSucceeded {
		e.t.Errorf("settle 1 (finish): %+v, err %v", r.Task, r.Err)
	} else {
		e.eqTime("settle 1 FinishedAt", r.Task.FinishedAt, at(110))
		e.eqOutcome("settle 1", r.Task.Outcome, work.Success(js(`{"r":1}`)))
	}
	// The released t2 is due at 110 and may be claimed by this very step, so its result is
	// the task as the release left it or as the claim did; either way scheduled at 110.
	if r := res[1]; r.Err != nil || r.Task.ID != t2 || r.Task.State.Terminal() {
		e.t.Errorf("settle 2 (release): %+v, err %v", r.Task, r.Err)
	} else {
		e.eqTime("settle 2 ScheduledAt", r.Task.ScheduledAt, at(110))
	}
	if r := res[2]; r.Err == nil {
		e.t.Errorf("settle 3 (forged) succeeded: %+v", r.Task)
	} else if we := e.wantErr("settle 3 (forged)", r.Err, work.ErrStaleDelivery); we.ID != t4 {
		e.t.Errorf("settle 3: stale id %q, want t4", we.ID)
	}
	if r := res[3]; r.Err != nil || r.Task.ID != t3 || r.Task.State != work.TaskPending || r.Task.Attempts != 1 {
		e.t.Errorf("settle 4 (release until 500): %+v, err %v", r.Task, r.Err)
	} else {
		e.eqTime("settle 4 ScheduledAt", r.Task.ScheduledAt, at(500))
	}
	// Then the claims, in claim order over what the settles left: t5 and t6 due at 100, t2
	// due again at 110; t4 is still leased until 130, t3 waits until 500.
	e.sameOrder("claims of the step", idsOf(claimed), []string{t5, t6, t2}, names)
	for i, want := range []uint32{1, 1, 2} {
		if i < len(claimed) && claimed[i].Attempt != want {
			e.t.Errorf("%s: attempt %d, want %d", names[claimed[i].Task.ID], claimed[i].Attempt, want)
		}
	}
	e.wantStateEvents("the step", n, events.TypeTaskSettled, events.TypeWakeRecorded, events.TypeTaskReleased,
		events.TypeTaskReleased, events.TypeTaskClaimed, events.TypeTaskClaimed, events.TypeTaskClaimed)
	e.atMostOnePerAttempt(e.rejectionsSince(n, events.TypeTaskSettled, events.TypeWakeRecorded, events.TypeTaskReleased, events.TypeTaskClaimed), 1)
	e.sameTask("t4 after a forged settle", e.mustTask(s, t4), before4)
	if w := e.claimWakeOne(at(110)); w.Wake.Reason.TaskID != t1 {
		e.t.Errorf("completion wake for %s, want t1", w.Wake.Reason.TaskID)
	}
	// t4's owner settles as usual afterwards.
	e.finish(d4, work.Success(nil), at(111))
}

func ptr[T any](v T) *T { return &v }

func sacBadSettle(e *env) {
	const s = "session_sac_bad"
	t1 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	t2 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	ds := e.claim(at(100), lease, 2)
	if len(ds) != 2 || ds[0].Task.ID != t1 || ds[1].Task.ID != t2 {
		e.t.Fatalf("claimed %d, want t1 then t2", len(ds))
	}
	d1, d2 := ds[0], ds[1]
	unknown := work.NewTaskDelivery(work.Task{ID: "task_missing"}, 1, at(130), "forged-token")
	blank := work.NewTaskDelivery(work.Task{ID: " "}, 1, at(130), "forged-token")
	long := strings.Repeat("r", work.MaxReasonBytes+1)
	type want struct {
		kind  error // nil: success
		field string
		state work.TaskState
	}
	cases := []struct {
		what string
		s    work.Settle
		want want
	}{
		{"an unknown task", work.Settle{Delivery: unknown, Outcome: ptr(work.Success(nil))}, want{kind: work.ErrTaskNotFound}},
		{"a non-terminal outcome", work.Settle{Delivery: d1, Outcome: &work.Outcome{State: work.TaskRunning}}, want{kind: work.ErrInvalidRequest, field: "outcome"}},
		{"invalid JSON output", work.Settle{Delivery: d1, Outcome: ptr(work.Success(json.RawMessage(`{`)))}, want{kind: work.ErrInvalidRequest, field: "output"}},
		{"both an outcome and a release", work.Settle{Delivery: d1, Outcome: ptr(work.Success(nil)), Release: &work.ReleaseRequest{}}, want{kind: work.ErrInvalidRequest}},
		{"neither an outcome nor a release", work.Settle{Delivery: d1}, want{kind: work.ErrInvalidRequest}},
		{"a blank task id", work.Settle{Delivery: blank, Release: &work.ReleaseRequest{}}, want{kind: work.ErrInvalidRequest, field: "task_id"}},
		{"a reason over 64 KiB", work.Settle{Delivery: d2, Release: &work.ReleaseRequest{Reason: long}}, want{kind: work.ErrInvalidRequest, field: "reason"}},
		{"a RunAt out of range", work.Settle{Delivery: d2, Release: &work.ReleaseRequest{RunAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}}, want{kind: work.ErrInvalidRequest, field: "run_at"}},
		{"a finish of t1", work.Settle{Delivery: d1, Outcome: ptr(work.Failure("f"))}, want{state: work.TaskFailed}},
		{"the same finish again", work.Settle{Delivery: d1, Outcome: ptr(work.Failure("f"))}, want{state: work.TaskFailed}},
		{"another outcome for t1", work.Settle{Delivery: d1, Outcome: ptr(work.Success(nil))}, want{kind: work.ErrInvalidTransition}},
		{"a release of settled t1", work.Settle{Delivery: d1, Release: &work.ReleaseRequest{}}, want{kind: work.ErrStaleDelivery}},
		{"a release of t2", work.Settle{Delivery: d2, Release: &work.ReleaseRequest{RunAt: at(300)}}, want{state: work.TaskPending}},
		{"the same release again", work.Settle{Delivery: d2, Release: &work.ReleaseRequest{RunAt: at(300)}}, want{kind: work.ErrStaleDelivery}},
	}
	settles := make([]work.Settle, len(cases))
	for i, c := range cases {
		settles[i] = c.s
	}
	n := e.logLen()
	res, claimed := e.sac(settles, nil, at(110), 0, 0)
	if len(claimed) != 0 {
		e.t.Errorf("limit 0 claimed %d", len(claimed))
	}
	for i, c := range cases {
		r := res[i]
		if c.want.kind == nil {
			if r.Err != nil {
				e.t.Errorf("settle %d (%s): %v", i, c.what, r.Err)
			} else if r.Task.State != c.want.state {
				e.t.Errorf("settle %d (%s): task %s, want %s", i, c.what, r.Task.State, c.want.state)
			}
			continue
		}
		if r.Err == nil {
			e.t.Errorf("settle %d (%s) succeeded: %+v, want %v", i, c.what, r.Task, c.want.kind)
			continue
		}
		we := e.wantErr(fmt.Sprintf("settle %d (%s)", i, c.what), r.Err, c.want.kind)
		if c.want.field != "" && we.Field != c.want.field {
			e.t.Errorf("settle %d (%s): invalid field %q, want %q", i, c.what, we.Field, c.want.field)
		}
	}
	e.wantStateEvents("the step", n, events.TypeTaskSettled, events.TypeTaskReleased)
	e.eqState("t1", e.mustTask(s, t1).State, work.TaskFailed)
	got := e.mustTask(s, t2)
	e.eqState("t2", got.State, work.TaskPending)
	e.eqTime("t2 ScheduledAt", got.ScheduledAt, at(300))
}

// sacSeq: a settle that recorded its result reports the seq of the event that did (the
// task's task_settled, or task_released), which ReadLog reads back; one that recorded none (a
// repeat, a rejected or invalid settle, even when the log records the rejection) reports 0.
func sacSeq(e *env) {
	const s = "session_sac_seq"
	t1 := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100)).ID
	t2 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	t3 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	ds := e.claim(at(100), lease, 3)
	if len(ds) != 3 || ds[0].Task.ID != t1 || ds[1].Task.ID != t2 || ds[2].Task.ID != t3 {
		e.t.Fatalf("claimed %d, want t1, t2, t3", len(ds))
	}
	forged := work.NewTaskDelivery(ds[2].Task, 1, ds[2].LeaseExpiresAt, "forged-token")
	n := e.logLen()
	res, _ := e.sac([]work.Settle{
		{Delivery: ds[0], Outcome: ptr(work.Success(js(`{"r":1}`)))},
		{Delivery: ds[1], Release: &work.ReleaseRequest{RunAt: at(500), Reason: "retry"}},
		{Delivery: ds[0], Outcome: ptr(work.Success(js(`{"r":1}`)))}, // a repeat: appends nothing
		{Delivery: forged, Outcome: ptr(work.Failure("late"))},       // rejected
		{Delivery: ds[2]}, // invalid
		{Delivery: ds[2], Outcome: ptr(work.Failure("f"))},
	}, nil, at(110), 0, 0)
	logged := map[uint64]events.Event{}
	for _, ev := range e.since(n) {
		logged[ev.Head().Seq] = ev
	}
	recorded := []struct {
		i       int
		task    string
		typ     events.Type
		attempt uint32
	}{{0, t1, events.TypeTaskSettled, 1}, {1, t2, events.TypeTaskReleased, 1}, {5, t3, events.TypeTaskSettled, 1}}
	for _, w := range recorded {
		r := res[w.i]
		if r.Err != nil {
			e.t.Errorf("settle %d: %v", w.i, r.Err)
			continue
		}
		ev, ok := logged[r.Seq]
		if !ok {
			e.t.Errorf("settle %d of %s: Seq %d is not an event of the step (seqs %d to %d)", w.i, w.task, r.Seq, n+1, n+len(logged))
			continue
		}
		taskID, _ := ev.Subject()
		if ev.Type() != w.typ || taskID != w.task {
			e.t.Errorf("settle %d: the event at Seq %d is %s of %s, want %s of %s", w.i, r.Seq, ev.Type(), taskID, w.typ, w.task)
		}
		var attempt uint32
		switch ev := ev.(type) {
		case *events.TaskSettled:
			attempt = ev.Attempt
		case *events.TaskReleased:
			attempt = ev.Attempt
		}
		if attempt != w.attempt {
			e.t.Errorf("settle %d: the event at Seq %d is of attempt %d, want %d", w.i, r.Seq, attempt, w.attempt)
		}
	}
	for _, i := range []int{2, 3, 4} {
		if r := res[i]; r.Seq != 0 {
			e.t.Errorf("settle %d recorded no result (err %v) but has Seq %d", i, r.Err, r.Seq)
		}
	}
	if res[3].Err == nil || res[4].Err == nil {
		e.t.Errorf("the forged settle (%v) and the invalid one (%v) must fail", res[3].Err, res[4].Err)
	}
}

func sacClaims(e *env) {
	const s = "session_sac_claims"
	sub := func(kind string, runAt time.Time) string {
		return e.submit(s, work.TaskRequest{Kind: kind, RunAt: runAt}, at(100)).ID
	}
	a1 := sub("a", time.Time{})
	b1 := sub("b", at(50))
	a2 := sub("a", time.Time{})
	c1 := sub("c", time.Time{})
	names := map[string]string{a1: "a1", b1: "b1", a2: "a2", c1: "c1"}

	// Limit 0 claims nothing, and needs no lease.
	n := e.logLen()
	res, ds := e.sac(nil, nil, at(100), 0, 0)
	if len(res) != 0 || len(ds) != 0 {
		e.t.Errorf("an empty step returned %d results and %d deliveries", len(res), len(ds))
	}
	e.nothingAppended("an empty step", n)

	// No kinds: as ClaimDueAt.
	_, ds = e.sac(nil, nil, at(100), lease, 2)
	e.sameOrder("no kinds, limit 2", idsOf(ds), []string{b1, a1}, names)
	// Kinds: as ClaimKindsAt.
	_, ds2 := e.sac(nil, []string{"c", "b"}, at(100), lease, 10)
	e.sameOrder("kinds c and b", idsOf(ds2), []string{c1}, names)

	// A release due now is claimed in the same step, by kind too.
	n = e.logLen()
	_, ds3 := e.sac([]work.Settle{{Delivery: ds[1], Release: &work.ReleaseRequest{}}}, []string{"a"}, at(105), 10*time.Second, 10)
	e.sameOrder("kind a after a1's release", idsOf(ds3), []string{a2, a1}, names)
	for _, d := range ds3 {
		if want := map[string]uint32{a1: 2, a2: 1}[d.Task.ID]; d.Attempt != want {
			e.t.Errorf("%s: attempt %d, want %d", names[d.Task.ID], d.Attempt, want)
		}
	}
	e.appended("a release and two claims", n, events.TypeTaskReleased, events.TypeTaskClaimed, events.TypeTaskClaimed)

	// A finish with a completion wake in the same step as a claim.
	w := e.submit(s, work.TaskRequest{Kind: "w", Wake: work.WakeOnCompletion}, at(110)).ID
	names[w] = "w"
	dw := e.claimKinds([]string{"w"}, at(110), lease, 1)
	n = e.logLen()
	_, ds4 := e.sac([]work.Settle{{Delivery: dw[0], Outcome: ptr(work.Success(nil))}}, nil, at(200), lease, 10)
	// a1 and a2 expired at 115 (a1 submitted first), b1 and c1 at 130.
	e.sameOrder("claims at 200", idsOf(ds4), []string{a1, a2, b1, c1}, names)
	e.appended("a finish with a wake and four claims", n, events.TypeTaskSettled, events.TypeWakeRecorded,
		events.TypeTaskClaimed, events.TypeTaskClaimed, events.TypeTaskClaimed, events.TypeTaskClaimed)
}

func sacValidation(e *env) {
	const s = "session_sac_valid"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	d := e.claimOne(at(100))
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	settle := []work.Settle{{Delivery: d, Outcome: ptr(work.Success(nil))}}
	n := e.logLen()
	try := func(kinds []string, now time.Time, leaseFor time.Duration, limit int) error {
		e.t.Helper()
		res, ds, err := e.q.SettleAndClaimAt(e.ctx, settle, kinds, now, leaseFor, limit)
		if err == nil {
			e.t.Fatalf("SettleAndClaimAt(%q, %v, %v, %d) succeeded, want an error", kinds, now, leaseFor, limit)
		}
		if len(res) != 0 || len(ds) != 0 {
			e.t.Errorf("SettleAndClaimAt failed but returned %d results and %d deliveries", len(res), len(ds))
		}
		return err
	}
	for _, b := range blanks {
		e.wantInvalid(fmt.Sprintf("kind %q", b), try([]string{"k", b}, at(101), lease, 1), "kind")
	}
	e.wantInvalid("a negative limit", try(nil, at(101), lease, -1), "limit")
	e.wantInvalid("lease 0 with a limit", try(nil, at(101), 0, 1), "lease_for")
	e.wantInvalid("a negative lease with a limit", try(nil, at(101), -time.Second, 1), "lease_for")
	near := time.Unix(0, math.MaxInt64-1000)
	e.wantInvalid("a lease past the time range", try(nil, near, time.Hour, 1), "lease_for")
	for _, bad := range []time.Time{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		e.wantInvalid("a step at "+bad.String(), try(nil, bad, lease, 1), "now")
	}
	// A call refused as a whole settles nothing.
	e.nothingAppended("refused steps", n)
	e.eqState("the task of a refused step's settle", e.mustTask(s, t).State, work.TaskRunning)
}

// --- reopen ---

func runningReopen(e *env) {
	const s = "session_running_reopen"
	sub := func(kind string, wake bool) string {
		r := work.TaskRequest{Kind: kind}
		if wake {
			r.Wake = work.WakeOnCompletion
		}
		return e.submit(s, r, at(100)).ID
	}
	a, b, c := sub("x", false), sub("x", false), sub("y", true)
	ds := e.claim(at(100), lease, 3)
	if len(ds) != 3 {
		e.t.Fatalf("claimed %d of 3", len(ds))
	}
	d := sub("y", false)
	names := map[string]string{a: "a", b: "b", c: "c", d: "d"}
	da := e.extend(ds[0], 400*time.Second, at(100))                                 // a: until 500
	e.release(ds[1], work.ReleaseRequest{RunAt: at(300), Reason: "later"}, at(101)) // b: pending until 300
	e.cancel(s, c, at(102))
	e.release(ds[2], work.ReleaseRequest{}, at(103)) // c: canceled, with its completion wake

	all := e.list(s, work.TaskFilter{Limit: 100})
	wantStats := statsWant{
		total: counts(2, 1, 0, 0, 1),
		kinds: []work.KindStats{kindStats("x", counts(1, 1, 0, 0, 0)), kindStats("y", counts(1, 0, 0, 0, 1))},
		due:   1, oldest: at(100),
	}
	e.stats("before the reopen", at(250), wantStats)

	e.reopen()

	after := e.list(s, work.TaskFilter{Limit: 100})
	e.sameOrder("the list after the reopen", idsOf(after), idsOf(all), names)
	for i := range after {
		if i < len(all) {
			e.sameTask("listed after the reopen", after[i], all[i])
		}
	}
	e.stats("after the reopen", at(250), wantStats)
	e.sameOrder("pending tasks of session after the reopen", idsOf(e.list(s, work.TaskFilter{States: []work.TaskState{work.TaskPending}, Limit: 10})), []string{b, d}, names)

	e.sameOrder("kind y at 250", idsOf(e.claimKinds([]string{"y"}, at(250), lease, 10)), []string{d}, names)
	e.sameOrder("kind x at 299", idsOf(e.claimKinds([]string{"x"}, at(299), lease, 10)), nil, names)
	db := e.claimKinds([]string{"x"}, at(300), lease, 10)
	e.sameOrder("kind x at 300", idsOf(db), []string{b}, names)
	if len(db) == 1 && db[0].Attempt != 2 {
		e.t.Errorf("b re-claimed after the reopen with attempt %d, want 2", db[0].Attempt)
	}
	// The delivery from before the reopen still owns its claim and its extended lease.
	e.extend(da, 10*time.Second, at(301)) // a: until 311
	e.sameOrder("kind x at 310", idsOf(e.claimKinds([]string{"x"}, at(310), lease, 10)), nil, names)
	e.sameOrder("kind x at 311", idsOf(e.claimKinds([]string{"x"}, at(311), lease, 10)), []string{a}, names)
	w := e.claimWakeOne(at(311))
	if w.Wake.Reason.TaskID != c || w.Wake.Reason.State != work.TaskCanceled {
		e.t.Errorf("completion wake %+v, want c canceled", w.Wake.Reason)
	}
}

// --- concurrency ---

// concWorkers: workers that heartbeat, give each task back once (Release) and finish it on
// its second delivery, all through SettleAndClaim, some by kind, never hold one task at once
// and settle each task exactly once, at attempt 2.
func concWorkers(e *env) {
	const s = "session_conc_workers"
	const tasks = 40
	kinds := []string{"a", "b"}
	for i := 0; i < tasks; i++ {
		e.submit(s, work.TaskRequest{Kind: kinds[i%2]}, at(100))
	}
	var mu sync.Mutex
	var seen []work.TaskDelivery
	var errs []error
	parallel(func(i int) {
		var held []work.TaskDelivery
		var only []string // workers 0 and 1 claim by kind
		if i < 2 {
			only = kinds[i : i+1]
		}
		for round := 0; round < 200; round++ {
			var settles []work.Settle
			for _, d := range held {
				if d.Attempt == 1 {
					// A heartbeat first, then give it back, due at once.
					if _, err := e.q.ExtendAt(e.ctx, d, time.Hour, at(100)); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					settles = append(settles, work.Settle{Delivery: d, Release: &work.ReleaseRequest{Reason: "once"}})
				} else {
					settles = append(settles, work.Settle{Delivery: d, Outcome: ptr(work.Success(nil))})
				}
			}
			res, ds, err := e.q.SettleAndClaimAt(e.ctx, settles, only, at(100), time.Hour, 3)
			mu.Lock()
			if err != nil {
				errs = append(errs, err)
			}
			for _, r := range res {
				if r.Err != nil {
					errs = append(errs, r.Err)
				}
			}
			seen = append(seen, ds...)
			mu.Unlock()
			held = ds
			if err != nil || len(ds) == 0 && len(settles) == 0 {
				return
			}
		}
	})
	for _, err := range errs {
		e.ok("a concurrent worker", err)
	}
	per := map[string][]uint32{}
	for _, d := range seen {
		e.noteToken(d.LeaseToken())
		per[d.Task.ID] = append(per[d.Task.ID], d.Attempt)
	}
	if len(per) != tasks {
		e.t.Errorf("%d tasks delivered, want %d", len(per), tasks)
	}
	for id, attempts := range per {
		if fmt.Sprint(attempts) != "[1 2]" {
			e.t.Errorf("task %s delivered with attempts %v, want [1 2]: once, released, once more", id, attempts)
		}
	}
	all := e.list(s, work.TaskFilter{Limit: 100})
	for _, t := range all {
		if t.State != work.TaskSucceeded || t.Attempts != 2 {
			e.t.Errorf("task %s: %s after %d attempts, want succeeded after 2", t.ID, t.State, t.Attempts)
		}
	}
	e.stats("after the workers", at(100), statsWant{
		total: counts(0, 0, tasks, 0, 0),
		kinds: []work.KindStats{kindStats("a", counts(0, 0, tasks/2, 0, 0)), kindStats("b", counts(0, 0, tasks/2, 0, 0))},
	})
}
