package worktest

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// runningScenarios cover part 2 of the API (shared/spec/work-api-2.md): lease extension,
// release, claims by kind, a session's task list, and the Stats and SettleAndClaim additions
// documented in work/queue_worker.go. Every rule and every error of each method has a case.
func runningScenarios() []scenario {
	return []scenario{
		{"extend/sets_the_exact_expiry_earlier_or_later", extendExactExpiry},
		{"extend/reclaim_order_follows_the_new_expiry", extendReclaimOrder},
		{"extend/returns_the_current_task_with_its_cancel_request", extendSeesCancel},
		{"extend/ignores_lease_expiry", extendIgnoresExpiry},
		{"extend/stale_deliveries_change_nothing", extendStale},
		{"extend/unknown_task", extendUnknown},
		{"extend/validation", extendValidation},

		{"release/makes_the_task_pending_again", releasePending},
		{"release/run_at_future_past_and_zero", releaseRunAt},
		{"release/claim_order_after_release", releaseOrder},
		{"release/of_a_cancel_requested_task_settles_it_canceled", releaseCanceled},
		{"release/stale_deliveries_change_nothing", releaseStale},
		{"release/unknown_task", releaseUnknown},
		{"release/validation", releaseValidation},

		{"claim_kinds/filters_by_kind_in_claim_order", claimKindsOrder},
		{"claim_kinds/follows_extend_release_cancel_and_settle", claimKindsFollows},
		{"claim_kinds/sees_work_due_before_what_it_last_claimed", claimsSeeWorkBelow},
		{"claim_kinds/validation", claimKindsValidation},

		{"tasks/a_session_in_submission_order", tasksOrder},
		{"tasks/filters_by_state_and_kind", tasksFilters},
		{"tasks/cursor_paging", tasksPaging},
		{"tasks/after_a_foreign_or_unknown_id", tasksForeignAfter},
		{"tasks/validation", tasksValidation},

		{"stats/counts_through_every_transition", statsTransitions},
		{"stats/due_now_and_the_oldest_due", statsDue},
		{"stats/validation", statsValidation},

		{"settle_and_claim/mixed_results", sacMixed},
		{"settle_and_claim/a_bad_settle_fails_only_its_own_result", sacBadSettle},
		{"settle_and_claim/results_carry_the_seq_of_their_event", sacSeq},
		{"settle_and_claim/claims_in_the_same_step", sacClaims},
		{"settle_and_claim/validation", sacValidation},

		{"running/reopen_keeps_leases_releases_lists_and_counts", runningReopen},
		{"running/wall_clock_twins", runningWallClock},
		{"concurrency/workers_release_once_and_settle_once", concWorkers},
	}
}

// --- calls ---

// extend calls ExtendAt, which must succeed, and checks what it returns: the same delivery
// (task, attempt, token) expiring at exactly now+leaseFor, with a running task snapshot.
func (e *env) extend(d work.TaskDelivery, leaseFor time.Duration, now time.Time) work.TaskDelivery {
	e.t.Helper()
	got, err := e.q.ExtendAt(e.ctx, d, leaseFor, now)
	e.ok("ExtendAt", err)
	e.noLeak(got, got.LeaseToken())
	if got.Task.ID != d.Task.ID || got.Attempt != d.Attempt {
		e.t.Errorf("ExtendAt(%s attempt %d) returned %s attempt %d", d.Task.ID, d.Attempt, got.Task.ID, got.Attempt)
	}
	if got.LeaseToken() != d.LeaseToken() {
		e.t.Errorf("ExtendAt(%s attempt %d) returned another lease token: the same delivery goes on", d.Task.ID, d.Attempt)
	}
	if !got.LeaseExpiresAt.Equal(now.Add(leaseFor)) {
		e.t.Errorf("ExtendAt(%s): lease expires %v, want exactly now+leaseFor = %v", d.Task.ID, got.LeaseExpiresAt, now.Add(leaseFor))
	}
	if got.Task.State != work.TaskRunning || got.Task.Attempts != d.Attempt {
		e.t.Errorf("ExtendAt(%s): task %s attempts %d, want running attempts %d", d.Task.ID, got.Task.State, got.Task.Attempts, d.Attempt)
	}
	return got
}

// extendErr calls ExtendAt, which must fail and return the zero delivery.
func (e *env) extendErr(d work.TaskDelivery, leaseFor time.Duration, now time.Time) error {
	e.t.Helper()
	got, err := e.q.ExtendAt(e.ctx, d, leaseFor, now)
	if err == nil {
		e.t.Fatalf("ExtendAt(%s attempt %d) succeeded, want an error", d.Task.ID, d.Attempt)
	}
	if !isZero(got.Task) || got.Attempt != 0 || !got.LeaseExpiresAt.IsZero() || got.LeaseToken() != "" {
		e.t.Errorf("ExtendAt failed but returned %+v, want the zero delivery", got)
	}
	return err
}

// release calls ReleaseAt, which must succeed.
func (e *env) release(d work.TaskDelivery, r work.ReleaseRequest, now time.Time) work.Task {
	e.t.Helper()
	t, err := e.q.ReleaseAt(e.ctx, d, r, now)
	e.ok("ReleaseAt", err)
	if t.ID != d.Task.ID {
		e.t.Errorf("ReleaseAt(%s) returned task %s", d.Task.ID, t.ID)
	}
	return t
}

// releaseErr calls ReleaseAt, which must fail and return the zero Task.
func (e *env) releaseErr(d work.TaskDelivery, r work.ReleaseRequest, now time.Time) error {
	e.t.Helper()
	t, err := e.q.ReleaseAt(e.ctx, d, r, now)
	if err == nil {
		e.t.Fatalf("ReleaseAt(%s attempt %d) succeeded, want an error", d.Task.ID, d.Attempt)
	}
	e.zeroOnError("ReleaseAt", t)
	return err
}

// claimKinds calls ClaimKindsAt, which must succeed, and checks every delivery as claim does,
// and that each is of one of kinds.
func (e *env) claimKinds(kinds []string, now time.Time, leaseFor time.Duration, limit int) []work.TaskDelivery {
	e.t.Helper()
	ds, err := e.q.ClaimKindsAt(e.ctx, kinds, now, leaseFor, limit)
	e.ok("ClaimKindsAt", err)
	e.checkClaimed("ClaimKindsAt", ds, now, leaseFor, limit)
	for _, d := range ds {
		ok := false
		for _, k := range kinds {
			ok = ok || d.Task.Kind == k
		}
		if !ok {
			e.t.Errorf("ClaimKindsAt(%q) delivered %s of kind %q", kinds, d.Task.ID, d.Task.Kind)
		}
	}
	return ds
}

// checkClaimed checks claimed deliveries: at most limit, fresh tokens that fmt never prints,
// attempt = task attempts, running, lease until now+leaseFor.
func (e *env) checkClaimed(what string, ds []work.TaskDelivery, now time.Time, leaseFor time.Duration, limit int) {
	e.t.Helper()
	if len(ds) > limit {
		e.t.Fatalf("%s(limit %d) returned %d deliveries", what, limit, len(ds))
	}
	for _, d := range ds {
		e.noteToken(d.LeaseToken())
		e.noLeak(d, d.LeaseToken())
		if d.Attempt == 0 || d.Attempt != d.Task.Attempts {
			e.t.Errorf("%s: delivery of %s: attempt %d, task attempts %d", what, d.Task.ID, d.Attempt, d.Task.Attempts)
		}
		if d.Task.State != work.TaskRunning {
			e.t.Errorf("%s: delivery of %s: task state %s, want running", what, d.Task.ID, d.Task.State)
		}
		if !d.LeaseExpiresAt.Equal(now.Add(leaseFor)) {
			e.t.Errorf("%s: delivery of %s: lease expires %v, want %v", what, d.Task.ID, d.LeaseExpiresAt, now.Add(leaseFor))
		}
	}
}

// list calls Session.Tasks, which must succeed; every task returned is the session's and
// equals what Session.Task reads.
func (e *env) list(session string, f work.TaskFilter) []work.Task {
	e.t.Helper()
	ts, err := e.q.Session(session).Tasks(e.ctx, f)
	e.ok("Tasks", err)
	if len(ts) > f.Limit {
		e.t.Fatalf("Tasks(limit %d) returned %d tasks", f.Limit, len(ts))
	}
	for _, t := range ts {
		if t.SessionID != session {
			e.t.Errorf("Tasks of session %s returned %s of session %s", session, t.ID, t.SessionID)
			continue
		}
		e.sameTask("listed task "+t.ID, t, e.mustTask(session, t.ID))
	}
	return ts
}

// statsWant is what StatsAt must report.
type statsWant struct {
	total  work.StateCounts
	kinds  []work.KindStats
	due    int64
	oldest time.Time // zero: nothing due
}

// stats calls StatsAt, which must succeed and report exactly w.
func (e *env) stats(what string, now time.Time, w statsWant) work.QueueStats {
	e.t.Helper()
	st, err := e.q.StatsAt(e.ctx, now)
	e.ok("StatsAt", err)
	if !st.At.Equal(now) {
		e.t.Errorf("%s: Stats.At = %v, want %v", what, st.At, now)
	}
	if st.Total != w.total {
		e.t.Errorf("%s: Stats.Total = %+v, want %+v", what, st.Total, w.total)
	}
	if fmt.Sprintf("%+v", st.Kinds) != fmt.Sprintf("%+v", w.kinds) && !(len(st.Kinds) == 0 && len(w.kinds) == 0) {
		e.t.Errorf("%s: Stats.Kinds = %+v, want %+v (kind order, kinds without tasks left out)", what, st.Kinds, w.kinds)
	}
	if st.DueNow != w.due {
		e.t.Errorf("%s: Stats.DueNow = %d, want %d", what, st.DueNow, w.due)
	}
	if w.oldest.IsZero() {
		if !st.OldestDueAt.IsZero() || st.OldestDueAge != 0 {
			e.t.Errorf("%s: nothing is due but OldestDueAt = %v, OldestDueAge = %v, want zero", what, st.OldestDueAt, st.OldestDueAge)
		}
	} else {
		if !st.OldestDueAt.Equal(w.oldest) {
			e.t.Errorf("%s: Stats.OldestDueAt = %v, want %v", what, st.OldestDueAt, w.oldest)
		}
		if want := now.Sub(w.oldest); st.OldestDueAge != want {
			e.t.Errorf("%s: Stats.OldestDueAge = %v, want %v", what, st.OldestDueAge, want)
		}
	}
	return st
}

// --- checks ---

// idsOf lists the ids of tasks or deliveries.
func idsOf[T work.Task | work.TaskDelivery](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		switch v := any(x).(type) {
		case work.Task:
			out[i] = v.ID
		case work.TaskDelivery:
			out[i] = v.Task.ID
		}
	}
	return out
}

// sameOrder requires got to be exactly want, and prints both with the names given to ids.
func (e *env) sameOrder(what string, got, want []string, names map[string]string) {
	e.t.Helper()
	show := func(ids []string) string {
		out := make([]string, len(ids))
		for i, id := range ids {
			if n, ok := names[id]; ok {
				out[i] = n
			} else {
				out[i] = id
			}
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	if show(got) != show(want) {
		e.t.Errorf("%s: %s, want %s", what, show(got), show(want))
	}
}

// noStateChange requires that the events after the first n are only audit records, at most
// one per attempt of at most claimed attempts: a refused call changes nothing.
func (e *env) noStateChange(what string, n int, claimed uint32) {
	e.t.Helper()
	before := e.t.Failed()
	e.atMostOnePerAttempt(e.rejectionsSince(n), claimed)
	if !before && e.t.Failed() {
		e.t.Errorf("(after %s)", what)
	}
}

// --- extend ---

func extendExactExpiry(e *env) {
	const s = "session_extend"
	t := e.submit(s, work.TaskRequest{Kind: "k", Input: js(`{"x":1}`), IdempotencyKey: "k-ext"}, at(100))
	d := e.claimOne(at(100)) // expires at 130
	n := e.logLen()
	later := e.extend(d, 60*time.Second, at(110))
	evs := e.appended("an extension", n, events.TypeTaskExtended)
	ev := evs[0].(*events.TaskExtended)
	if ev.TaskID != t.ID || ev.Attempt != 1 || ev.LeaseExpiresAt != at(170).UnixNano() ||
		ev.SessionID != s || ev.At != at(110).UnixNano() {
		e.t.Errorf("task_extended event %+v, want task %s attempt 1 until %d at %d", ev, t.ID, at(170).UnixNano(), at(110).UnixNano())
	}
	e.sameTask("the extension's snapshot", later.Task, e.mustTask(s, t.ID))
	e.eqJSON("the extension's input", later.Task.Input, `{"x":1}`)

	// Later than before: not claimable before 170, even after the old expiry.
	e.claimNone(at(130))
	e.claimNone(at(170).Add(-time.Nanosecond))

	// Earlier than before: from 170 down to 125.
	n = e.logLen()
	earlier := e.extend(later, 5*time.Second, at(120))
	e.appended("a shorter extension", n, events.TypeTaskExtended)
	e.claimNone(at(125).Add(-time.Nanosecond))

	// The original delivery and the returned ones are one delivery: any of them may extend
	// or settle until a re-claim.
	e.extend(d, 5*time.Second, at(120))
	d2 := e.claimOne(at(125))
	if d2.Task.ID != t.ID || d2.Attempt != 2 {
		e.t.Fatalf("re-claim at the new expiry: %s attempt %d, want %s attempt 2", d2.Task.ID, d2.Attempt, t.ID)
	}
	for what, old := range map[string]work.TaskDelivery{"the first delivery": d, "its extension": earlier} {
		e.wantErr("extend by "+what+" after a re-claim", e.extendErr(old, lease, at(126)), work.ErrStaleDelivery)
	}
	// A delivery whose lease was extended settles as any other.
	d2x := e.extend(d2, time.Hour, at(126))
	done := e.finish(d2x, work.Success(js(`1`)), at(127))
	e.eqState("finished after an extension", done.State, work.TaskSucceeded)
	if done.Attempts != 2 {
		e.t.Errorf("attempts %d, want 2 (an extension is not a claim)", done.Attempts)
	}
}

func extendReclaimOrder(e *env) {
	const s = "session_extend_order"
	sub := func(kind string, runAt time.Time) string {
		return e.submit(s, work.TaskRequest{Kind: kind, RunAt: runAt}, at(100)).ID
	}
	a, b, c, d := sub("a", time.Time{}), sub("b", time.Time{}), sub("c", time.Time{}), sub("d", time.Time{})
	ds := e.claim(at(100), lease, 4) // all four expire at 130
	if len(ds) != 4 {
		e.t.Fatalf("claimed %d of 4", len(ds))
	}
	x := sub("x", at(140))                   // pending, due at 140
	e.extend(ds[0], 40*time.Second, at(110)) // a: 150
	e.extend(ds[2], 10*time.Second, at(110)) // c: 120, earlier than before
	e.extend(ds[3], 30*time.Second, at(120)) // d: 150, ties with a: submission order
	names := map[string]string{a: "a", b: "b", c: "c", d: "d", x: "x"}
	e.sameOrder("claim at 125", idsOf(e.claim(at(125), lease, 10)), []string{c}, names)
	// c was claimed again at 125 until 155; b expires at 130, x is due at 140, a and d at 150.
	e.sameOrder("claim at 200", idsOf(e.claim(at(200), lease, 10)), []string{b, x, a, d, c}, names)
}

func extendSeesCancel(e *env) {
	const s = "session_extend_cancel"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
	d := e.claimOne(at(100))
	first := e.extend(d, lease, at(101))
	if !first.Task.CancelRequestedAt.IsZero() {
		e.t.Errorf("a heartbeat before any cancel shows a cancel request at %v", first.Task.CancelRequestedAt)
	}
	e.cancel(s, t.ID, at(105))
	n := e.logLen()
	hb := e.extend(d, lease, at(106))
	e.appended("a heartbeat of a cancel-requested task", n, events.TypeTaskExtended)
	e.eqTime("the heartbeat's CancelRequestedAt", hb.Task.CancelRequestedAt, at(105))
	e.eqState("the heartbeat's task", hb.Task.State, work.TaskRunning)
	e.sameTask("the heartbeat's snapshot", hb.Task, e.mustTask(s, t.ID))
	// The worker stops and settles as canceled.
	done := e.finish(hb, work.Cancellation(), at(107))
	e.eqState("after the worker stopped", done.State, work.TaskCanceled)
}

func extendIgnoresExpiry(e *env) {
	const s = "session_extend_late"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d := e.claimOne(at(100))
	// The lease expired long ago, but nobody claimed the task again: the heartbeat holds.
	late := e.extend(d, lease, at(1000))
	e.eqTime("the late heartbeat's expiry", late.LeaseExpiresAt, at(1030))
	e.claimNone(at(1030).Add(-time.Nanosecond))
	d2 := e.claimOne(at(1030))
	if d2.Task.ID != t.ID || d2.Attempt != 2 {
		e.t.Errorf("re-claim after the late heartbeat's lease: %s attempt %d", d2.Task.ID, d2.Attempt)
	}
}

func extendStale(e *env) {
	const s = "session_extend_stale"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d1 := e.claimOne(at(100))
	d2 := e.claimOne(at(130))
	n := e.logLen()
	before := e.mustTask(s, t.ID)
	cases := map[string]work.TaskDelivery{
		"the superseded attempt":   d1,
		"a forged token":           work.NewTaskDelivery(d2.Task, d2.Attempt, d2.LeaseExpiresAt, "forged-token"),
		"an empty token":           work.NewTaskDelivery(d2.Task, d2.Attempt, d2.LeaseExpiresAt, ""),
		"the old token, attempt 2": work.NewTaskDelivery(d2.Task, 2, d2.LeaseExpiresAt, d1.LeaseToken()),
		"an attempt never made":    work.NewTaskDelivery(d2.Task, 3, d2.LeaseExpiresAt, d2.LeaseToken()),
		"attempt 0":                work.NewTaskDelivery(d2.Task, 0, d2.LeaseExpiresAt, d2.LeaseToken()),
	}
	for what, d := range cases {
		err := e.extendErr(d, time.Hour, at(131))
		we := e.wantErr("extend by "+what, err, work.ErrStaleDelivery)
		if we.ID != t.ID {
			e.t.Errorf("extend by %s: stale id %q, want %s", what, we.ID, t.ID)
		}
		e.wantText("extend by "+what, err, "delivery no longer owns "+t.ID)
	}
	e.noStateChange("stale extensions", n, 2)
	e.sameTask("the task after stale extensions", e.mustTask(s, t.ID), before)
	// The current lease still ends at 160: a stale heartbeat moved nothing.
	e.claimNone(at(160).Add(-time.Nanosecond))

	// A settled task: even the delivery that settled it no longer owns a claim.
	done := e.finish(d2, work.Success(nil), at(140))
	n = e.logLen()
	for what, d := range map[string]work.TaskDelivery{"the settling delivery": d2, "the superseded one": d1} {
		e.wantErr("extend of a settled task by "+what, e.extendErr(d, time.Hour, at(141)), work.ErrStaleDelivery)
	}
	e.noStateChange("extensions of a settled task", n, 2)
	e.sameTask("the settled task after extensions", e.mustTask(s, t.ID), done)
	e.claimNone(at(10000))

	// A released delivery's lease is gone.
	t2 := e.submit(s, work.TaskRequest{Kind: "k"}, at(200))
	r := e.claimOne(at(200))
	if r.Task.ID != t2.ID {
		e.t.Fatalf("claimed %s, want %s", r.Task.ID, t2.ID)
	}
	e.release(r, work.ReleaseRequest{RunAt: at(300)}, at(201))
	n = e.logLen()
	e.wantErr("extend of a released delivery", e.extendErr(r, time.Hour, at(202)), work.ErrStaleDelivery)
	e.noStateChange("an extension of a released delivery", n, 1)
	got := e.mustTask(s, t2.ID)
	e.eqState("the released task after a stale extension", got.State, work.TaskPending)
	e.eqTime("its schedule", got.ScheduledAt, at(300))
}

func extendUnknown(e *env) {
	e.submit("session_x", work.TaskRequest{Kind: "k"}, at(100))
	e.claimOne(at(100))
	n := e.logLen()
	forged := work.NewTaskDelivery(work.Task{ID: "task_missing", SessionID: "session_x"}, 1, at(130), "forged-token")
	err := e.extendErr(forged, lease, at(101))
	we := e.wantErr("extend of an unknown task", err, work.ErrTaskNotFound)
	if we.ID != "task_missing" {
		e.t.Errorf("not-found id %q", we.ID)
	}
	e.wantText("extend of an unknown task", err, "task not found: task_missing")
	e.nothingAppended("extend of an unknown task", n)
}

func extendValidation(e *env) {
	const s = "session_extend_valid"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d := e.claimOne(at(100))
	n := e.logLen()
	for _, l := range []time.Duration{0, -time.Nanosecond, -time.Hour} {
		e.wantInvalid(fmt.Sprintf("extend by %v", l), e.extendErr(d, l, at(101)), "lease_for")
	}
	for _, id := range blanks {
		blank := work.NewTaskDelivery(work.Task{ID: id}, d.Attempt, d.LeaseExpiresAt, d.LeaseToken())
		e.wantInvalid(fmt.Sprintf("extend of task id %q", id), e.extendErr(blank, lease, at(101)), "task_id")
	}
	near := time.Unix(0, math.MaxInt64-1000) // the last representable instants, year 2262
	e.wantInvalid("an extension past the time range", e.extendErr(d, time.Hour, near), "lease_for")
	e.wantInvalid("a huge extension", e.extendErr(d, time.Duration(math.MaxInt64), at(101)), "lease_for")
	for _, bad := range []time.Time{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		e.wantInvalid("extend at "+bad.String(), e.extendErr(d, time.Second, bad), "now")
	}
	e.nothingAppended("invalid extensions", n)
	e.claimNone(at(130).Add(-time.Nanosecond))
	// An extension that just fits is fine.
	e.extend(d, 1000*time.Nanosecond, near)
}

// --- release ---

func releasePending(e *env) {
	const s = "session_release"
	req := work.TaskRequest{Kind: "resize", Input: js(`{"w":640}`), IdempotencyKey: "k-rel", Wake: work.WakeOnCompletion}
	t := e.submit(s, req, at(100))
	d := e.claimOne(at(100))
	n := e.logLen()
	got := e.release(d, work.ReleaseRequest{Reason: "disk full"}, at(110))
	evs := e.appended("a release", n, events.TypeTaskReleased)
	ev := evs[0].(*events.TaskReleased)
	if ev.TaskID != t.ID || ev.Attempt != 1 || ev.RunAt != at(110).UnixNano() || ev.Reason != "disk full" ||
		ev.SessionID != s || ev.At != at(110).UnixNano() {
		e.t.Errorf("task_released event %+v, want task %s attempt 1 run at %d reason %q", ev, t.ID, at(110).UnixNano(), "disk full")
	}

	// Pending again at now, no claim, attempts unchanged, the request as it was.
	want := t
	want.ScheduledAt = at(110)
	want.Attempts = 1
	e.sameTask("the released task", got, want)
	e.sameTask("the released task read back", e.mustTask(s, t.ID), want)
	if again := e.submit(s, req, at(111)); again.ID != t.ID {
		e.t.Error("the idempotency key no longer finds the released task")
	} else {
		e.sameTask("resubmission of the released task", again, want)
	}
	e.claimWakeNone(at(111)) // a release is not a completion

	d2 := e.claimOne(at(110))
	if d2.Task.ID != t.ID || d2.Attempt != 2 || d2.Task.Attempts != 2 {
		e.t.Fatalf("the claim after a release: %s attempt %d (task attempts %d), want attempt 2", d2.Task.ID, d2.Attempt, d2.Task.Attempts)
	}
	if d2.LeaseToken() == d.LeaseToken() {
		e.t.Error("the claim after a release reused the released token")
	}
	// The wake policy is unchanged: the settle records the completion wake.
	n = e.logLen()
	e.finish(d2, work.Success(js(`"ok"`)), at(112))
	e.appended("the settle after a release", n, events.TypeTaskSettled, events.TypeWakeRecorded)
	w := e.claimWakeOne(at(112))
	if w.Wake.Reason.TaskID != t.ID || w.Wake.Reason.State != work.TaskSucceeded {
		e.t.Errorf("completion wake %+v", w.Wake.Reason)
	}

	// Attempts count claims through any number of releases.
	t3 := e.submit(s, work.TaskRequest{Kind: "again"}, at(200))
	for i := uint32(1); i <= 4; i++ {
		d := e.claimOne(at(200))
		if d.Task.ID != t3.ID || d.Attempt != i {
			e.t.Fatalf("claim %d after %d releases: %s attempt %d", i, i-1, d.Task.ID, d.Attempt)
		}
		if r := e.release(d, work.ReleaseRequest{}, at(200)); r.Attempts != i {
			e.t.Errorf("release of attempt %d: attempts %d", i, r.Attempts)
		}
	}
}

func releaseRunAt(e *env) {
	const s = "session_release_at"
	for _, c := range []struct {
		name  string
		runAt time.Time
		want  time.Time // the schedule: RunAt after now, else now
	}{
		{"in the future", at(200), at(200)},
		{"1ns after now", at(110).Add(time.Nanosecond), at(110).Add(time.Nanosecond)},
		{"exactly now", at(110), at(110)},
		{"in the past", at(50), at(110)},
		{"zero", time.Time{}, at(110)},
	} {
		t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
		d := e.claimOne(at(100))
		if d.Task.ID != t.ID {
			e.t.Fatalf("%s: claimed %s, want %s", c.name, d.Task.ID, t.ID)
		}
		n := e.logLen()
		got := e.release(d, work.ReleaseRequest{RunAt: c.runAt}, at(110))
		ev := e.appended("a release with RunAt "+c.name, n, events.TypeTaskReleased)[0].(*events.TaskReleased)
		if ev.RunAt != c.want.UnixNano() {
			e.t.Errorf("release with RunAt %s: event RunAt %d, want %d", c.name, ev.RunAt, c.want.UnixNano())
		}
		e.eqTime("ScheduledAt after a release with RunAt "+c.name, got.ScheduledAt, c.want)
		e.eqState("release with RunAt "+c.name, got.State, work.TaskPending)
		e.claimNone(c.want.Add(-time.Nanosecond))
		d2 := e.claimOne(c.want)
		if d2.Task.ID != t.ID || d2.Attempt != 2 {
			e.t.Errorf("release with RunAt %s: claimed %s attempt %d", c.name, d2.Task.ID, d2.Attempt)
		}
		e.finish(d2, work.Success(nil), c.want)
	}
}

func releaseOrder(e *env) {
	const s = "session_release_order"
	a := e.submit(s, work.TaskRequest{Kind: "a"}, at(100)).ID
	b := e.submit(s, work.TaskRequest{Kind: "b"}, at(100)).ID
	c := e.submit(s, work.TaskRequest{Kind: "c", RunAt: at(115)}, at(100)).ID
	ds := e.claim(at(100), lease, 2)
	if len(ds) != 2 || ds[0].Task.ID != a || ds[1].Task.ID != b {
		e.t.Fatalf("claimed %d, want a and b", len(ds))
	}
	e.release(ds[1], work.ReleaseRequest{}, at(110))               // b: due at 110
	e.release(ds[0], work.ReleaseRequest{RunAt: at(115)}, at(111)) // a: due at 115, ties with c
	names := map[string]string{a: "a", b: "b", c: "c"}
	e.claimNone(at(110).Add(-time.Nanosecond))
	got := e.claim(at(200), lease, 10)
	e.sameOrder("claim order after releases", idsOf(got), []string{b, a, c}, names)
	for _, d := range got {
		want := uint32(2)
		if d.Task.ID == c {
			want = 1
		}
		if d.Attempt != want {
			e.t.Errorf("%s: attempt %d, want %d", names[d.Task.ID], d.Attempt, want)
		}
	}
}

func releaseCanceled(e *env) {
	const s = "session_release_cancel"
	for _, wake := range []bool{true, false} {
		req := work.TaskRequest{Kind: "k", Input: js(`[1]`)}
		if wake {
			req.Wake = work.WakeOnCompletion
		}
		t := e.submit(s, req, at(100))
		d := e.claimOne(at(100))
		if d.Task.ID != t.ID {
			e.t.Fatalf("claimed %s, want %s", d.Task.ID, t.ID)
		}
		e.cancel(s, t.ID, at(105))
		n := e.logLen()
		got := e.release(d, work.ReleaseRequest{RunAt: at(500), Reason: "stopping"}, at(110))
		var evs []events.Event
		if wake {
			evs = e.appended("a release of a cancel-requested task with a completion wake", n, events.TypeTaskReleased, events.TypeWakeRecorded)
			wr := evs[1].(*events.WakeRecorded)
			if wr.Reason != events.WakeTaskFinished || wr.TaskID != t.ID || wr.Outcome.State != events.TaskState(work.TaskCanceled) ||
				wr.At != at(110).UnixNano() || wr.SessionID != s {
				e.t.Errorf("completion wake event %+v", wr)
			}
		} else {
			evs = e.appended("a release of a cancel-requested task", n, events.TypeTaskReleased)
		}
		if ev := evs[0].(*events.TaskReleased); ev.TaskID != t.ID || ev.Attempt != 1 || ev.Reason != "stopping" {
			e.t.Errorf("task_released event %+v", ev)
		}

		// Settled as canceled at now, as a cancel of pending work.
		e.eqState("a released cancel-requested task", got.State, work.TaskCanceled)
		e.eqTime("its FinishedAt", got.FinishedAt, at(110))
		e.eqTime("its CancelRequestedAt", got.CancelRequestedAt, at(105))
		e.eqOutcome("its outcome", got.Outcome, work.Cancellation())
		if got.Attempts != 1 {
			e.t.Errorf("attempts %d, want 1", got.Attempts)
		}
		e.sameTask("the canceled task read back", e.mustTask(s, t.ID), got)
		e.claimNone(at(10000))

		if wake {
			w := e.claimWakeOne(at(110))
			r := w.Wake.Reason
			if r.Kind != work.WakeTaskFinished || r.TaskID != t.ID || r.State != work.TaskCanceled {
				e.t.Errorf("completion wake %+v", r)
			}
			e.eqOutcome("completion wake", r.Outcome, work.Cancellation())
			e.eqTime("completion wake CreatedAt", w.Wake.CreatedAt, at(110))
			e.ok("ack", e.ack(w, at(111)))
		}
		e.claimWakeNone(at(10000))

		// Nothing revives or re-settles it.
		n = e.logLen()
		e.wantErr("a repeated release", e.releaseErr(d, work.ReleaseRequest{}, at(120)), work.ErrStaleDelivery)
		e.wantErr("a finish after the release", e.finishErr(d, work.Success(nil), at(120)), work.ErrStaleDelivery)
		e.wantErr("an extension after the release", e.extendErr(d, lease, at(120)), work.ErrStaleDelivery)
		e.sameTask("a cancel after the release", e.cancel(s, t.ID, at(121)), got)
		e.noStateChange("calls after the release settled the task", n, 1)
		e.sameTask("the canceled task at the end", e.mustTask(s, t.ID), got)
	}
}

func releaseStale(e *env) {
	const s = "session_release_stale"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
	d1 := e.claimOne(at(100))
	d2 := e.claimOne(at(130))
	n := e.logLen()
	before := e.mustTask(s, t.ID)
	cases := map[string]work.TaskDelivery{
		"the superseded attempt":   d1,
		"a forged token":           work.NewTaskDelivery(d2.Task, d2.Attempt, d2.LeaseExpiresAt, "forged-token"),
		"an empty token":           work.NewTaskDelivery(d2.Task, d2.Attempt, d2.LeaseExpiresAt, ""),
		"the old token, attempt 2": work.NewTaskDelivery(d2.Task, 2, d2.LeaseExpiresAt, d1.LeaseToken()),
		"an attempt never made":    work.NewTaskDelivery(d2.Task, 3, d2.LeaseExpiresAt, d2.LeaseToken()),
	}
	for what, d := range cases {
		err := e.releaseErr(d, work.ReleaseRequest{Reason: "x"}, at(131))
		we := e.wantErr("release by "+what, err, work.ErrStaleDelivery)
		if we.ID != t.ID {
			e.t.Errorf("release by %s: stale id %q, want %s", what, we.ID, t.ID)
		}
		e.wantText("release by "+what, err, "delivery no longer owns "+t.ID)
	}
	e.noStateChange("stale releases", n, 2)
	e.sameTask("the task after stale releases", e.mustTask(s, t.ID), before)
	e.claimNone(at(160).Add(-time.Nanosecond)) // attempt 2 still holds its lease

	// A repeated release with the same delivery: the lease is gone.
	released := e.release(d2, work.ReleaseRequest{RunAt: at(400)}, at(140))
	n = e.logLen()
	for i := 0; i < 3; i++ {
		e.wantErr("a repeated release", e.releaseErr(d2, work.ReleaseRequest{RunAt: at(400)}, at(141)), work.ErrStaleDelivery)
		e.wantErr("a finish by the released delivery", e.finishErr(d2, work.Success(nil), at(141)), work.ErrStaleDelivery)
	}
	e.noStateChange("a repeated release", n, 2)
	e.sameTask("the released task after a repeated release", e.mustTask(s, t.ID), released)
	e.claimNone(at(400).Add(-time.Nanosecond))

	// A settled task.
	d3 := e.claimOne(at(400))
	done := e.finish(d3, work.Failure("no"), at(401))
	n = e.logLen()
	for what, d := range map[string]work.TaskDelivery{"the settling delivery": d3, "an older one": d2} {
		e.wantErr("release of a settled task by "+what, e.releaseErr(d, work.ReleaseRequest{}, at(402)), work.ErrStaleDelivery)
	}
	e.noStateChange("releases of a settled task", n, 3)
	e.sameTask("the settled task after releases", e.mustTask(s, t.ID), done)
	e.claimNone(at(10000))
	if ws := e.claimWakes(at(10000), lease, 10); len(ws) != 1 {
		e.t.Errorf("%d completion wakes, want 1", len(ws))
	}
}

func releaseUnknown(e *env) {
	e.submit("session_x", work.TaskRequest{Kind: "k"}, at(100))
	e.claimOne(at(100))
	n := e.logLen()
	forged := work.NewTaskDelivery(work.Task{ID: "task_missing", SessionID: "session_x"}, 1, at(130), "forged-token")
	err := e.releaseErr(forged, work.ReleaseRequest{}, at(101))
	we := e.wantErr("release of an unknown task", err, work.ErrTaskNotFound)
	if we.ID != "task_missing" {
		e.t.Errorf("not-found id %q", we.ID)
	}
	e.wantText("release of an unknown task", err, "task not found: task_missing")
	e.nothingAppended("release of an unknown task", n)
}

func releaseValidation(e *env) {
	const s = "session_release_valid"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d := e.claimOne(at(100))
	n := e.logLen()
	for _, id := range blanks {
		blank := work.NewTaskDelivery(work.Task{ID: id}, d.Attempt, d.LeaseExpiresAt, d.LeaseToken())
		e.wantInvalid(fmt.Sprintf("release of task id %q", id), e.releaseErr(blank, work.ReleaseRequest{}, at(101)), "task_id")
	}
	for _, bad := range []time.Time{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		e.wantInvalid("release with RunAt "+bad.String(), e.releaseErr(d, work.ReleaseRequest{RunAt: bad}, at(101)), "run_at")
		e.wantInvalid("release at "+bad.String(), e.releaseErr(d, work.ReleaseRequest{}, bad), "now")
	}
	long := strings.Repeat("r", work.MaxReasonBytes+1)
	e.wantInvalid("a reason over 64 KiB", e.releaseErr(d, work.ReleaseRequest{Reason: long}, at(101)), "reason")
	e.nothingAppended("invalid releases", n)
	e.eqState("the task after invalid releases", e.mustTask(s, t.ID).State, work.TaskRunning)

	// A reason of exactly 64 KiB is recorded whole.
	reason := strings.Repeat("r", work.MaxReasonBytes)
	e.release(d, work.ReleaseRequest{Reason: reason}, at(101))
	ev := e.appended("a release with a 64 KiB reason", n, events.TypeTaskReleased)[0].(*events.TaskReleased)
	if ev.Reason != reason {
		e.t.Errorf("the recorded reason has %d bytes, want %d", len(ev.Reason), len(reason))
	}
}

// runningWallClock: the twins without At use the wall clock, as Submit does.
func runningWallClock(e *env) {
	const s = "session_wall_clock"
	within := func(what string, got, lo, hi time.Time) {
		e.t.Helper()
		if got.Before(lo) || got.After(hi) {
			e.t.Errorf("%s = %v, want between %v and %v (the wall clock)", what, got, lo, hi)
		}
	}
	before := time.Now()
	t, err := e.q.Session(s).Submit(e.ctx, work.TaskRequest{Kind: "k"})
	e.ok("Submit", err)
	ds, err := e.q.ClaimKinds(e.ctx, []string{"k"}, time.Minute, 10)
	e.ok("ClaimKinds", err)
	if len(ds) != 1 || ds[0].Task.ID != t.ID {
		e.t.Fatalf("ClaimKinds claimed %d, want the task just submitted", len(ds))
	}
	e.noteToken(ds[0].LeaseToken())
	d, err := e.q.Extend(e.ctx, ds[0], time.Hour)
	e.ok("Extend", err)
	within("the extended lease", d.LeaseExpiresAt, before.Add(time.Hour), time.Now().Add(time.Hour))
	st, err := e.q.Stats(e.ctx)
	e.ok("Stats", err)
	within("Stats.At", st.At, before, time.Now())
	if st.Total.Running != 1 || st.DueNow != 0 {
		e.t.Errorf("Stats: %+v, want one running task, none due", st)
	}
	r, err := e.q.Release(e.ctx, d, work.ReleaseRequest{})
	e.ok("Release", err)
	within("the released task's ScheduledAt", r.ScheduledAt, before, time.Now())
	res, ds, err := e.q.SettleAndClaim(e.ctx, nil, nil, time.Minute, 10)
	e.ok("SettleAndClaim", err)
	if len(res) != 0 || len(ds) != 1 || ds[0].Task.ID != t.ID || ds[0].Attempt != 2 {
		e.t.Fatalf("SettleAndClaim returned %d results and %d deliveries, want the released task at attempt 2", len(res), len(ds))
	}
	e.noteToken(ds[0].LeaseToken())
	within("the claim's lease", ds[0].LeaseExpiresAt, before.Add(time.Minute), time.Now().Add(time.Minute))
	res, _, err = e.q.SettleAndClaim(e.ctx, []work.Settle{{Delivery: ds[0], Outcome: ptr(work.Success(nil))}}, nil, 0, 0)
	e.ok("SettleAndClaim", err)
	if len(res) != 1 || res[0].Err != nil || res[0].Task.State != work.TaskSucceeded {
		e.t.Fatalf("the settle returned %+v", res)
	}
	within("FinishedAt", res[0].Task.FinishedAt, before, time.Now())
}
