package worktest

import (
	"fmt"
	"math"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// --- claim by kind ---

func claimKindsOrder(e *env) {
	const s = "session_kinds"
	sub := func(kind string, runAt time.Time, now int) string {
		return e.submit(s, work.TaskRequest{Kind: kind, RunAt: runAt}, at(now)).ID
	}
	a1 := sub("a", at(300), 100)
	b1 := sub("b", time.Time{}, 100)
	a2 := sub("a", time.Time{}, 100)
	c1 := sub("c", at(50), 100)
	a3 := sub("a", time.Time{}, 90) // submitted after a2, with an earlier clock: due first
	b2 := sub("b", at(200), 100)
	c2 := sub("c", time.Time{}, 100)
	names := map[string]string{a1: "a1", a2: "a2", a3: "a3", b1: "b1", b2: "b2", c1: "c1", c2: "c2"}

	n := e.logLen()
	e.sameOrder("a kind nobody submitted", idsOf(e.claimKinds([]string{"z"}, at(1000), lease, 10)), nil, names)
	e.sameOrder("kind a before any is due", idsOf(e.claimKinds([]string{"a"}, at(89), lease, 10)), nil, names)
	e.nothingAppended("claims by kind that found nothing", n)

	n = e.logLen()
	e.sameOrder("kind a, limit 1", idsOf(e.claimKinds([]string{"a"}, at(100), lease, 1)), []string{a3}, names)
	e.appended("a claim by kind", n, events.TypeTaskClaimed)
	// Among the chosen kinds, the claim order of ClaimDue: c1 due at 50, then a2 and c2 at
	// 100 in submission order; a1 is due only at 300.
	n = e.logLen()
	e.sameOrder("kinds a and c", idsOf(e.claimKinds([]string{"a", "c"}, at(100), lease, 10)), []string{c1, a2, c2}, names)
	e.appended("a claim of three by kind", n, events.TypeTaskClaimed, events.TypeTaskClaimed, events.TypeTaskClaimed)
	for _, id := range []string{b1, b2, a1} {
		if got := e.mustTask(s, id); got.State != work.TaskPending || got.Attempts != 0 {
			e.t.Errorf("%s, not of the claimed kinds or not due, is %s with %d attempts", names[id], got.State, got.Attempts)
		}
	}
	// A kind named twice is claimed once.
	e.sameOrder("kind b named twice", idsOf(e.claimKinds([]string{"b", "b"}, at(300), lease, 10)), []string{b1, b2}, names)

	// Expired leases of the kind come back with its pending tasks, in claim order: a2 and a3
	// expire at 130 (a2 submitted first), a1 is due at 300.
	got := e.claimKinds([]string{"a"}, at(300), lease, 10)
	e.sameOrder("kind a at 300", idsOf(got), []string{a2, a3, a1}, names)
	for i, want := range []uint32{2, 2, 1} {
		if i < len(got) && got[i].Attempt != want {
			e.t.Errorf("%s: attempt %d, want %d", names[got[i].Task.ID], got[i].Attempt, want)
		}
	}
	// ClaimDue sees what the claims by kind left: c1 and c2, expired at 130.
	e.sameOrder("ClaimDue at 300", idsOf(e.claim(at(300), lease, 10)), []string{c1, c2}, names)
}

func claimKindsFollows(e *env) {
	const s = "session_kinds_follow"
	k := []string{"k"}
	t1 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	t2 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100)).ID
	other := e.submit(s, work.TaskRequest{Kind: "other"}, at(100)).ID
	names := map[string]string{t1: "t1", t2: "t2", other: "other"}
	ds := e.claimKinds(k, at(100), lease, 10)
	e.sameOrder("kind k at 100", idsOf(ds), []string{t1, t2}, names)
	d1, d2 := ds[0], ds[1]

	// An extension moves the task in its kind's order too.
	d1 = e.extend(d1, 100*time.Second, at(110)) // until 210
	e.extend(d2, 5*time.Second, at(110))        // until 115, earlier
	e.sameOrder("kind k at 114", idsOf(e.claimKinds(k, at(114), lease, 10)), nil, names)
	got := e.claimKinds(k, at(115), lease, 10)
	e.sameOrder("kind k at 115", idsOf(got), []string{t2}, names)
	d2 = got[0]
	if d2.Attempt != 2 {
		e.t.Errorf("t2 re-claimed by kind with attempt %d, want 2", d2.Attempt)
	}

	// A release puts it back at its new time.
	e.release(d2, work.ReleaseRequest{RunAt: at(170)}, at(160))
	e.sameOrder("kind k at 169", idsOf(e.claimKinds(k, at(169), lease, 10)), nil, names)
	got = e.claimKinds(k, at(170), lease, 10)
	e.sameOrder("kind k at 170", idsOf(got), []string{t2}, names)
	d2 = got[0]
	if d2.Attempt != 3 {
		e.t.Errorf("t2 re-claimed after its release with attempt %d, want 3", d2.Attempt)
	}

	// Canceled pending work, settled work and a release that cancels leave the kind's order.
	t3 := e.submit(s, work.TaskRequest{Kind: "k"}, at(180)).ID
	names[t3] = "t3"
	e.cancel(s, t3, at(181))
	e.finish(d1, work.Success(nil), at(182))
	e.cancel(s, t2, at(183))
	e.release(d2, work.ReleaseRequest{}, at(184))
	e.sameOrder("kind k at the end", idsOf(e.claimKinds(k, at(10000), lease, 10)), nil, names)
	e.sameOrder("ClaimDue at the end", idsOf(e.claim(at(10000), lease, 10)), []string{other}, names)
}

// claimsSeeWorkBelow: after a claim took the earliest due entry of an index, work that
// becomes due before that entry's time (a schedule in the past, a caller's clock behind, a
// release or a heartbeat at an earlier instant) is still claimed, by kind and by ClaimDue. A
// store that remembers where its last scan started (a low-water mark) must lower it for
// such work.
func claimsSeeWorkBelow(e *env) {
	const s = "session_kinds_below"
	for _, byKind := range []bool{true, false} {
		kind := fmt.Sprintf("k-%v", byKind)
		claim := func(now time.Time) []work.TaskDelivery {
			e.t.Helper()
			if byKind {
				return e.claimKinds([]string{kind}, now, lease, 10)
			}
			return e.claim(now, lease, 10)
		}
		x := e.submit(s, work.TaskRequest{Kind: kind, RunAt: at(150)}, at(100)).ID
		names := map[string]string{x: "x"}
		dx := claim(at(200))
		e.sameOrder("first claim", idsOf(dx), []string{x}, names)

		y := e.submit(s, work.TaskRequest{Kind: kind, RunAt: at(120)}, at(200)).ID // scheduled in the past
		z := e.submit(s, work.TaskRequest{Kind: kind}, at(110)).ID                 // a clock behind
		names[y], names[z] = "y", "z"
		ds := claim(at(200))
		e.sameOrder("work due before the last claimed entry", idsOf(ds), []string{z, y}, names)

		e.release(dx[0], work.ReleaseRequest{}, at(105)) // x due at 105, a clock behind
		dz := e.extend(ds[0], 10*time.Second, at(50))    // z's lease until 60
		ds = claim(at(200))
		e.sameOrder("a release and a heartbeat at earlier instants", idsOf(ds), []string{z, x}, names)
		if len(ds) == 2 && (ds[0].Attempt != 2 || ds[1].Attempt != 2) {
			e.t.Errorf("attempts %d and %d, want 2 and 2", ds[0].Attempt, ds[1].Attempt)
		}
		e.eqTime("z's heartbeat lease", dz.LeaseExpiresAt, at(60))
		for _, d := range e.claim(at(10000), lease, 10) { // settle all before the next round
			e.finish(d, work.Success(nil), at(10000))
		}
	}
}

func claimKindsValidation(e *env) {
	const s = "session_kinds_valid"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	n := e.logLen()
	try := func(kinds []string, now time.Time, leaseFor time.Duration, limit int) error {
		e.t.Helper()
		ds, err := e.q.ClaimKindsAt(e.ctx, kinds, now, leaseFor, limit)
		if err == nil {
			e.t.Fatalf("ClaimKindsAt(%q, %v, %v, %d) succeeded with %d deliveries, want an error", kinds, now, leaseFor, limit, len(ds))
		}
		if len(ds) != 0 {
			e.t.Errorf("ClaimKindsAt failed but returned %d deliveries", len(ds))
		}
		return err
	}
	e.wantInvalid("nil kinds", try(nil, at(100), lease, 10), "kinds")
	e.wantInvalid("no kinds", try([]string{}, at(100), lease, 10), "kinds")
	for _, b := range blanks {
		e.wantInvalid(fmt.Sprintf("kind %q", b), try([]string{"k", b}, at(100), lease, 10), "kind")
	}
	e.wantInvalid("lease 0", try([]string{"k"}, at(100), 0, 10), "lease_for")
	e.wantInvalid("a negative lease", try([]string{"k"}, at(100), -time.Second, 10), "lease_for")
	e.wantInvalid("limit 0", try([]string{"k"}, at(100), lease, 0), "limit")
	e.wantInvalid("a negative limit", try([]string{"k"}, at(100), lease, -1), "limit")
	near := time.Unix(0, math.MaxInt64-1000)
	e.wantInvalid("a lease past the time range", try([]string{"k"}, near, time.Hour, 10), "lease_for")
	e.wantInvalid("a huge lease", try([]string{"k"}, at(100), time.Duration(math.MaxInt64), 10), "lease_for")
	e.nothingAppended("invalid claims by kind", n)
	if got := e.mustTask(s, t.ID); got.State != work.TaskPending || got.Attempts != 0 {
		e.t.Errorf("an invalid claim by kind left the task %s with %d attempts", got.State, got.Attempts)
	}
	// A lease that just fits is fine.
	if ds := e.claimKinds([]string{"k"}, near, 1000*time.Nanosecond, 10); len(ds) != 1 {
		e.t.Errorf("a lease ending at the last instant claimed %d", len(ds))
	}
}

// --- a session's tasks ---

func tasksOrder(e *env) {
	const a, b = "session_list_a", "session_list_b"
	a1 := e.submit(a, work.TaskRequest{Kind: "k", Input: js(`{"a": 1}`)}, at(100)).ID
	b1 := e.submit(b, work.TaskRequest{Kind: "k"}, at(100)).ID
	a2 := e.submit(a, work.TaskRequest{Kind: "k", RunAt: at(50)}, at(100)).ID
	a3 := e.submit(a, work.TaskRequest{Kind: "k"}, at(90)).ID // an earlier clock: still submitted after a2
	keyed := work.TaskRequest{Kind: "k", IdempotencyKey: "k-list"}
	a4 := e.submit(a, keyed, at(100)).ID
	if again := e.submit(a, keyed, at(101)).ID; again != a4 {
		e.t.Fatal("an idempotent resubmission made a new task")
	}
	b2 := e.submit(b, work.TaskRequest{Kind: "k"}, at(100)).ID
	names := map[string]string{a1: "a1", a2: "a2", a3: "a3", a4: "a4", b1: "b1", b2: "b2"}

	n := e.logLen()
	listed := e.list(a, work.TaskFilter{Limit: 100})
	e.sameOrder("session a", idsOf(listed), []string{a1, a2, a3, a4}, names)
	if len(listed) > 0 {
		e.eqJSON("a listed task's input", listed[0].Input, `{"a": 1}`)
	}
	e.sameOrder("session b", idsOf(e.list(b, work.TaskFilter{Limit: 100})), []string{b1, b2}, names)
	e.sameOrder("a session without tasks", idsOf(e.list("session_list_none", work.TaskFilter{Limit: 100})), nil, names)
	e.sameOrder("session a, limit 2", idsOf(e.list(a, work.TaskFilter{Limit: 2})), []string{a1, a2}, names)
	e.nothingAppended("listing", n)

	// Transitions do not reorder the list.
	ds := e.claim(at(100), lease, 100)
	for _, d := range ds {
		switch d.Task.ID {
		case a1:
			e.finish(d, work.Success(nil), at(101))
		case a2:
			e.release(d, work.ReleaseRequest{RunAt: at(500)}, at(101))
		case a3:
			e.extend(d, time.Hour, at(101))
		}
	}
	e.cancel(a, a4, at(102))
	e.sameOrder("session a after transitions", idsOf(e.list(a, work.TaskFilter{Limit: 100})), []string{a1, a2, a3, a4}, names)
}

func tasksFilters(e *env) {
	const s = "session_filter"
	sub := func(kind string, runAt time.Time) string {
		return e.submit(s, work.TaskRequest{Kind: kind, RunAt: runAt}, at(100)).ID
	}
	tp := sub("x", at(1000)) // pending
	tr := sub("y", time.Time{})
	ts := sub("x", time.Time{})
	tf := sub("y", time.Time{})
	tc := sub("x", at(1000))
	tl := sub("y", time.Time{})
	names := map[string]string{tp: "pending", tr: "running", ts: "succeeded", tf: "failed", tc: "canceled", tl: "released"}
	e.cancel(s, tc, at(100))
	ds := e.claim(at(100), lease, 10)
	e.sameOrder("claim", idsOf(ds), []string{tr, ts, tf, tl}, names)
	e.finish(ds[1], work.Success(nil), at(101))
	e.finish(ds[2], work.Failure("f"), at(101))
	e.release(ds[3], work.ReleaseRequest{RunAt: at(1000)}, at(101))
	e.submit("session_filter_other", work.TaskRequest{Kind: "x"}, at(100)) // never listed

	st := func(xs ...work.TaskState) []work.TaskState { return xs }
	for _, c := range []struct {
		name string
		f    work.TaskFilter
		want []string
	}{
		{"no filter", work.TaskFilter{}, []string{tp, tr, ts, tf, tc, tl}},
		{"pending", work.TaskFilter{States: st(work.TaskPending)}, []string{tp, tl}},
		{"running", work.TaskFilter{States: st(work.TaskRunning)}, []string{tr}},
		{"succeeded or failed", work.TaskFilter{States: st(work.TaskFailed, work.TaskSucceeded)}, []string{ts, tf}},
		{"a state named twice", work.TaskFilter{States: st(work.TaskFailed, work.TaskFailed)}, []string{tf}},
		{"canceled", work.TaskFilter{States: st(work.TaskCanceled)}, []string{tc}},
		{"every state", work.TaskFilter{States: st(work.TaskCanceled, work.TaskFailed, work.TaskSucceeded, work.TaskRunning, work.TaskPending)}, []string{tp, tr, ts, tf, tc, tl}},
		{"kind x", work.TaskFilter{Kinds: []string{"x"}}, []string{tp, ts, tc}},
		{"kind y", work.TaskFilter{Kinds: []string{"y"}}, []string{tr, tf, tl}},
		{"kinds y and x", work.TaskFilter{Kinds: []string{"y", "x"}}, []string{tp, tr, ts, tf, tc, tl}},
		{"a kind with no tasks", work.TaskFilter{Kinds: []string{"z"}}, nil},
		{"pending of kind y", work.TaskFilter{States: st(work.TaskPending), Kinds: []string{"y"}}, []string{tl}},
		{"running of kind x", work.TaskFilter{States: st(work.TaskRunning), Kinds: []string{"x"}}, nil},
		{"pending, limit 1", work.TaskFilter{States: st(work.TaskPending), Limit: 1}, []string{tp}},
		{"kind y, limit 2", work.TaskFilter{Kinds: []string{"y"}, Limit: 2}, []string{tr, tf}},
	} {
		if c.f.Limit == 0 {
			c.f.Limit = 100
		}
		e.sameOrder("filter "+c.name, idsOf(e.list(s, c.f)), c.want, names)
	}
}

func tasksPaging(e *env) {
	const s, other = "session_page", "session_page_other"
	var ids []string
	names := map[string]string{}
	kinds := map[string]string{}
	for i := 0; i < 7; i++ {
		kind := []string{"x", "y"}[i%2]
		id := e.submit(s, work.TaskRequest{Kind: kind}, at(100+i)).ID
		ids = append(ids, id)
		names[id] = fmt.Sprintf("t%d", i)
		kinds[id] = kind
		e.submit(other, work.TaskRequest{Kind: kind}, at(100+i))
	}
	e.sameOrder("page 1", idsOf(e.list(s, work.TaskFilter{Limit: 3})), ids[0:3], names)
	e.sameOrder("page 2", idsOf(e.list(s, work.TaskFilter{Limit: 3, After: ids[2]})), ids[3:6], names)
	e.sameOrder("page 3", idsOf(e.list(s, work.TaskFilter{Limit: 3, After: ids[5]})), ids[6:], names)
	e.sameOrder("after the last", idsOf(e.list(s, work.TaskFilter{Limit: 3, After: ids[6]})), nil, names)

	// Paging with any limit and filter returns the whole filtered list, each task once.
	for _, f := range []work.TaskFilter{{}, {Kinds: []string{"x"}}, {Kinds: []string{"y"}}} {
		var want []string
		for _, id := range ids {
			if len(f.Kinds) == 0 || kinds[id] == f.Kinds[0] {
				want = append(want, id)
			}
		}
		for limit := 1; limit <= 4; limit++ {
			f.Limit, f.After = limit, ""
			var got []string
			for pages := 0; pages < 10; pages++ {
				page := idsOf(e.list(s, f))
				got = append(got, page...)
				if len(page) < limit {
					break
				}
				f.After = page[len(page)-1]
			}
			e.sameOrder(fmt.Sprintf("paging kinds %q by %d", f.Kinds, limit), got, want, names)
		}
	}
	// A cursor need not match the filter: it is a position in the session's list.
	e.sameOrder("kind x after t1 (a y)", idsOf(e.list(s, work.TaskFilter{Kinds: []string{"x"}, After: ids[1], Limit: 2})), []string{ids[2], ids[4]}, names)
	// A task submitted between pages is on a later page.
	late := e.submit(s, work.TaskRequest{Kind: "x"}, at(50)).ID
	names[late] = "late"
	e.sameOrder("after t5 once another was submitted", idsOf(e.list(s, work.TaskFilter{Limit: 3, After: ids[5]})), []string{ids[6], late}, names)
}

func tasksForeignAfter(e *env) {
	const a, b = "session_after_a", "session_after_b"
	e.submit(a, work.TaskRequest{Kind: "k"}, at(100))
	foreign := e.submit(b, work.TaskRequest{Kind: "k"}, at(100)).ID
	for what, id := range map[string]string{"another session's task": foreign, "an unknown id": "task_missing"} {
		ts, err := e.q.Session(a).Tasks(e.ctx, work.TaskFilter{After: id, Limit: 10})
		if err == nil {
			e.t.Fatalf("Tasks after %s returned %d tasks, want ErrTaskNotFound", what, len(ts))
		}
		if len(ts) != 0 {
			e.t.Errorf("Tasks after %s failed but returned %d tasks", what, len(ts))
		}
		we := e.wantErr("Tasks after "+what, err, work.ErrTaskNotFound)
		if we.ID != id {
			e.t.Errorf("Tasks after %s: not-found id %q, want %q", what, we.ID, id)
		}
		e.wantText("Tasks after "+what, err, "task not found: "+id)
	}
}

func tasksValidation(e *env) {
	const s = "session_list_valid"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	try := func(sess string, f work.TaskFilter) error {
		e.t.Helper()
		ts, err := e.q.Session(sess).Tasks(e.ctx, f)
		if err == nil {
			e.t.Fatalf("Tasks(%q, %+v) succeeded with %d tasks, want an error", sess, f, len(ts))
		}
		if len(ts) != 0 {
			e.t.Errorf("Tasks failed but returned %d tasks", len(ts))
		}
		return err
	}
	e.wantInvalid("limit 0", try(s, work.TaskFilter{}), "limit")
	e.wantInvalid("a negative limit", try(s, work.TaskFilter{Limit: -1}), "limit")
	for _, b := range blanks {
		e.wantInvalid(fmt.Sprintf("session %q", b), try(b, work.TaskFilter{Limit: 1}), "session_id")
		e.wantInvalid(fmt.Sprintf("kind %q", b), try(s, work.TaskFilter{Kinds: []string{"k", b}, Limit: 1}), "kind")
	}
	for _, bad := range []work.TaskState{work.TaskCanceled + 1, 99, -1} {
		e.wantInvalid(fmt.Sprintf("state %d", int(bad)), try(s, work.TaskFilter{States: []work.TaskState{work.TaskPending, bad}, Limit: 1}), "states")
	}
}
