package worktest

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// sessionScenarios cover the session methods of part 3 of the API
// (shared/spec/work-api-3.md, "Finding a task by its key; retrying a finished task", "Batch
// submit"): Session.TaskByKey, Session.Retry and Session.SubmitMany. Every rule and every
// error of each has a case.
func sessionScenarios() []scenario {
	return []scenario{
		{"task_by_key/finds_the_task_in_any_state", taskByKeyStates},
		{"task_by_key/none_foreign_and_pruned", taskByKeyNone},
		{"task_by_key/validation", taskByKeyValidation},

		{"retry/a_failed_task_runs_again", retryFailed},
		{"retry/a_canceled_task_at_run_at", retryCanceled},
		{"retry/a_new_completion_wake_each_finish", retryCompletionWakes},
		{"retry/before_the_completion_wake_is_acknowledged", retryBeforeWakeAck},
		{"retry/only_failed_or_canceled", retryStates},
		{"retry/unknown_foreign_and_pruned", retryNotFound},
		{"retry/retention_after_a_retry", retryRetention},
		{"retry/reopen_keeps_the_retry", retryReopen},
		{"retry/validation", retryValidation},

		{"submit_many/each_result_as_submit_would_answer", submitManyAsSubmits},
		{"submit_many/one_step_in_order", submitManyOneStep},
		{"submit_many/invalid_items_only_fail_themselves", submitManyInvalidItems},
		{"submit_many/reopen_keeps_the_batch", submitManyReopen},
		{"submit_many/validation", submitManyValidation},
		{"submit_many/total_size_limit", submitManySizeLimit},
		{"submit_many/the_callers_bytes_after", submitManyCallerBytes},
	}
}

// taskByKey calls TaskByKey, which must succeed.
func (e *env) taskByKey(session, key string) work.Task {
	e.t.Helper()
	t, err := e.q.Session(session).TaskByKey(e.ctx, key)
	e.ok("TaskByKey", err)
	return t
}

// taskByKeyErr calls TaskByKey, which must fail with the zero Task.
func (e *env) taskByKeyErr(session, key string) error {
	e.t.Helper()
	t, err := e.q.Session(session).TaskByKey(e.ctx, key)
	if err == nil {
		e.t.Fatalf("TaskByKey(%q) found %s, want an error", key, t.ID)
	}
	e.zeroOnError("TaskByKey", t)
	return err
}

// retry calls RetryAt, which must succeed and append exactly one task_retried, which it
// checks; it returns the task.
func (e *env) retry(session, id string, runAt, now time.Time) work.Task {
	e.t.Helper()
	before := e.mustTask(session, id)
	n := e.lastSeq()
	t, err := e.q.Session(session).RetryAt(e.ctx, id, runAt, now)
	e.ok("RetryAt", err)
	evs := e.after(n)
	if len(evs) != 1 || evs[0].Type() != events.TypeTaskRetried {
		e.t.Fatalf("a retry appended %v, want [task_retried]", typesOf(evs))
	}
	ev := evs[0].(*events.TaskRetried)
	want := runAt
	if !runAt.After(now) {
		want = now
	}
	if ev.TaskID != id || ev.SessionID != session || ev.At != now.UnixNano() || ev.Attempts != before.Attempts ||
		ev.RunAt != want.UnixNano() {
		e.t.Errorf("task_retried %+v, want task %s attempts %d run at %d", ev, id, before.Attempts, want.UnixNano())
	}
	// Pending at max(runAt, now), the request and attempts kept, the end of the run cleared.
	exp := before
	exp.State, exp.ScheduledAt = work.TaskPending, want
	exp.FinishedAt, exp.Outcome, exp.CancelRequestedAt = time.Time{}, nil, time.Time{}
	e.sameTask("the retried task", t, exp)
	if t.AttemptsAtRetry != before.Attempts {
		e.t.Errorf("retried task: AttemptsAtRetry %d, want its attempts %d", t.AttemptsAtRetry, before.Attempts)
	}
	e.sameTask("the retried task read back", e.mustTask(session, id), exp)
	return t
}

// retryErr calls RetryAt, which must fail, return the zero Task and append nothing.
func (e *env) retryErr(session, id string, runAt, now time.Time) error {
	e.t.Helper()
	n := e.lastSeq()
	t, err := e.q.Session(session).RetryAt(e.ctx, id, runAt, now)
	if err == nil {
		e.t.Fatalf("RetryAt(%s) succeeded (state %s), want an error", id, t.State)
	}
	e.zeroOnError("RetryAt", t)
	if evs := e.after(n); len(evs) != 0 {
		e.t.Errorf("a refused retry appended %v", typesOf(evs))
	}
	return err
}

// lastSeq is the sequence of the live queue's last retained event (0: none), on a pruned
// log too (logLen counts from seq 1).
func (e *env) lastSeq() uint64 {
	e.t.Helper()
	var last uint64
	e.ok("ReadLog", e.q.ReadLog(e.ctx, 0, func(ev events.Event) error { last = ev.Head().Seq; return nil }))
	return last
}

// after returns the events with a sequence after seq.
func (e *env) after(seq uint64) []events.Event {
	e.t.Helper()
	var out []events.Event
	e.ok("ReadLog", e.q.ReadLog(e.ctx, seq+1, func(ev events.Event) error { out = append(out, ev); return nil }))
	return out
}

func taskByKeyStates(e *env) {
	const s = "session_by_key"
	req := work.TaskRequest{Kind: "mail", Input: js(`{"to":"a"}`), IdempotencyKey: "order-1", Wake: work.WakeOnCompletion}
	t := e.submit(s, req, at(1))
	e.submit(s, work.TaskRequest{Kind: "mail", IdempotencyKey: "order-2"}, at(1))
	n := e.logLen()
	e.sameTask("TaskByKey of a pending task", e.taskByKey(s, "order-1"), t)
	e.nothingAppended("TaskByKey", n)

	d := e.claimOne(at(2))
	if d.Task.ID != t.ID {
		e.t.Fatalf("claimed %s, want %s", d.Task.ID, t.ID)
	}
	e.sameTask("TaskByKey of a running task", e.taskByKey(s, "order-1"), e.mustTask(s, t.ID))
	done := e.finish(d, work.Failure("smtp down"), at(3))
	got := e.taskByKey(s, "order-1")
	e.sameTask("TaskByKey of a failed task", got, done)
	// The key is the key, not a prefix or a pattern; keys are exact.
	if other := e.taskByKey(s, "order-2"); other.ID == t.ID {
		e.t.Error("TaskByKey(order-2) found order-1's task")
	}
	// What a conflicting resubmit names is what TaskByKey finds.
	err := e.submitErr(s, work.TaskRequest{Kind: "mail", IdempotencyKey: "order-1"}, at(4))
	if we := e.wantErr("a conflicting resubmit", err, work.ErrIdempotencyConflict); we != nil && we.ID != got.ID {
		e.t.Errorf("the conflict names %q, TaskByKey found %s", we.ID, got.ID)
	}
}

func taskByKeyNone(e *env) {
	const s = "session_by_key_none"
	err := e.taskByKeyErr(s, "never-used")
	if we := e.wantErr("TaskByKey of an unused key", err, work.ErrTaskNotFound); we != nil && we.ID != "never-used" {
		e.t.Errorf("not found names %q, want the key", we.ID)
	}
	t := e.submit(s, work.TaskRequest{Kind: "k", IdempotencyKey: "mine"}, at(1))
	// Keys are per session: another session's key names nothing here.
	e.wantErr("TaskByKey from another session", e.taskByKeyErr("session_other", "mine"), work.ErrTaskNotFound)
	// A task without a key is found by no key; the wake key namespace is separate.
	e.submit(s, work.TaskRequest{Kind: "k"}, at(1))
	e.wake(s, work.WakeRequest{Payload: js(`1`), IdempotencyKey: "wake-key"}, at(1))
	e.wantErr("TaskByKey of a wake's key", e.taskByKeyErr(s, "wake-key"), work.ErrTaskNotFound)

	// Once its task is pruned the key names nothing.
	d := e.claimOne(at(2))
	if d.Task.ID != t.ID {
		e.t.Fatalf("claimed %s, want %s", d.Task.ID, t.ID)
	}
	e.finish(d, work.Success(nil), at(3))
	e.prune(at(4), 1, 0) // the task; the direct wake is not acknowledged
	e.wantErr("TaskByKey of a pruned task", e.taskByKeyErr(s, "mine"), work.ErrTaskNotFound)
}

func taskByKeyValidation(e *env) {
	for _, key := range []string{"", " ", "\t\n"} {
		e.wantInvalid("TaskByKey("+key+")", e.taskByKeyErr("s", key), "idempotency_key")
	}
	e.wantInvalid("TaskByKey of a blank session", e.taskByKeyErr(" ", "k"), "session_id")
}

func retryFailed(e *env) {
	const s = "session_retry"
	req := work.TaskRequest{Kind: "charge", Input: js(`{"cents":100}`), IdempotencyKey: "charge-1"}
	t := e.submit(s, req, at(10))
	for i := uint32(1); i <= 2; i++ { // attempt 1 expires, attempt 2 fails
		d := e.claimOne(at(10 + 100*int(i)))
		if d.Attempt != i {
			e.t.Fatalf("claim %d: attempt %d", i, d.Attempt)
		}
		if i == 2 {
			e.finish(d, work.Failure("card declined"), at(250))
		}
	}
	e.stats("before the retry", at(260), statsWant{
		total: work.StateCounts{Failed: 1}, kinds: []work.KindStats{{Kind: "charge", StateCounts: work.StateCounts{Failed: 1}}},
	})
	// runAt before now: pending at now.
	got := e.retry(s, t.ID, at(100), at(300))
	if got.ID != t.ID || got.Attempts != 2 || got.AttemptsAtRetry != 2 {
		e.t.Errorf("retried: %s attempts %d at retry %d, want %s 2 and 2", got.ID, got.Attempts, got.AttemptsAtRetry, t.ID)
	}
	e.stats("after the retry", at(300), statsWant{
		total: work.StateCounts{Pending: 1}, kinds: []work.KindStats{{Kind: "charge", StateCounts: work.StateCounts{Pending: 1}}},
		due: 1, oldest: at(300),
	})
	// The key still names it, and an equal resubmit returns it as it is now.
	e.sameTask("TaskByKey after the retry", e.taskByKey(s, "charge-1"), got)
	e.sameTask("an equal resubmit after the retry", e.submit(s, req, at(301)), got)
	// It is in the session's list once, as before.
	if l := e.list(s, work.TaskFilter{Limit: 10}); len(l) != 1 || l[0].ID != t.ID {
		e.t.Errorf("Tasks after the retry: %v, want [%s]", idsOf(l), t.ID)
	}
	// Attempt numbers never repeat: the next claim is attempt 3, with a fresh token.
	d := e.claimOne(at(300))
	if d.Task.ID != t.ID || d.Attempt != 3 || d.Task.AttemptsAtRetry != 2 {
		e.t.Fatalf("claim after the retry: %s attempt %d (at retry %d), want attempt 3", d.Task.ID, d.Attempt, d.Task.AttemptsAtRetry)
	}
	done := e.finish(d, work.Success(js(`"paid"`)), at(301))
	if done.State != work.TaskSucceeded || done.Attempts != 3 {
		e.t.Errorf("finished after the retry: %s attempts %d", done.State, done.Attempts)
	}
}

func retryCanceled(e *env) {
	const s = "session_retry_cancel"
	// Canceled while pending (never claimed): attempts 0.
	p := e.submit(s, work.TaskRequest{Kind: "k"}, at(1))
	e.cancel(s, p.ID, at(2))
	got := e.retry(s, p.ID, at(50), at(10)) // runAt after now: pending at runAt
	if got.Attempts != 0 || got.AttemptsAtRetry != 0 || !got.CancelRequestedAt.IsZero() {
		e.t.Errorf("retried canceled task: %+v", got)
	}
	e.claimNone(at(49))
	dp := e.claimOne(at(50))
	if dp.Task.ID != p.ID || dp.Attempt != 1 {
		e.t.Errorf("claim at run_at: %s attempt %d", dp.Task.ID, dp.Attempt)
	}
	e.finish(dp, work.Success(nil), at(51))

	// Canceled by its worker after a cancel request: the request is cleared, so the next
	// run is not told to stop.
	r := e.submit(s, work.TaskRequest{Kind: "r"}, at(100))
	d := e.claimOne(at(100))
	if d.Task.ID != r.ID {
		e.t.Fatalf("claimed %s, want %s", d.Task.ID, r.ID)
	}
	if c := e.cancel(s, r.ID, at(101)); c.CancelRequestedAt.IsZero() {
		e.t.Fatal("cancel request not recorded")
	}
	e.finish(d, work.Cancellation(), at(102))
	e.retry(s, r.ID, time.Time{}, at(103)) // zero runAt: at once
	d2 := e.claimOne(at(103))
	if d2.Task.ID != r.ID || d2.Attempt != 2 || !d2.Task.CancelRequestedAt.IsZero() {
		e.t.Errorf("claim after retrying a canceled task: %s attempt %d cancel %v", d2.Task.ID, d2.Attempt, d2.Task.CancelRequestedAt)
	}
	// A heartbeat does not see the old request either.
	if x := e.extend(d2, lease, at(104)); !x.Task.CancelRequestedAt.IsZero() {
		e.t.Error("the retried task still reports the old cancel request")
	}
}

func retryCompletionWakes(e *env) {
	const s = "session_retry_wakes"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(1))
	d := e.claimOne(at(1))
	e.finish(d, work.Failure("first"), at(2))
	first := e.claimWakeOne(at(3))
	if first.Wake.Reason.TaskID != t.ID || first.Wake.Reason.State != work.TaskFailed {
		e.t.Fatalf("first completion wake %+v", first.Wake.Reason)
	}
	e.ok("AckWakeAt of the first run's wake", e.ack(first, at(5)))
	e.retry(s, t.ID, at(5), at(5))

	d2 := e.claimOne(at(6))
	n := e.logLen()
	e.finish(d2, work.Failure("second"), at(7))
	evs := e.appended("the second finish", n, events.TypeTaskSettled, events.TypeWakeRecorded)
	wr := evs[1].(*events.WakeRecorded)
	if wr.WakeID == first.Wake.ID || wr.TaskID != t.ID || wr.Outcome.State != events.StateFailed || wr.Outcome.Error != "second" {
		e.t.Errorf("second completion wake %+v, want a new wake for %s (first %s)", wr, t.ID, first.Wake.ID)
	}
	second := e.claimWakeOne(at(8))
	if second.Wake.ID != wr.WakeID || second.Wake.Reason.Outcome == nil || second.Wake.Reason.Outcome.Error != "second" {
		e.t.Errorf("claimed %s (%s), want the second wake %s", second.Wake.ID, second.Wake.Reason.State, wr.WakeID)
	}
	e.ok("AckWakeAt of the second wake", e.ack(second, at(9)))
	e.claimWakeNone(at(1000))

	// A third run, retried after its wake was acknowledged, records a third wake.
	e.retry(s, t.ID, at(10), at(10))
	d3 := e.claimOne(at(10))
	e.finish(d3, work.Success(js(`3`)), at(11))
	third := e.claimWakeOne(at(12))
	if third.Wake.ID == first.Wake.ID || third.Wake.ID == second.Wake.ID || third.Wake.Reason.State != work.TaskSucceeded {
		e.t.Errorf("third wake %s (%s)", third.Wake.ID, third.Wake.Reason.State)
	}
}

func retryStates(e *env) {
	const s = "session_retry_states"
	pending := e.submit(s, work.TaskRequest{Kind: "p", RunAt: at(1000)}, at(1))
	running := e.submit(s, work.TaskRequest{Kind: "r"}, at(1))
	d := e.claimOne(at(2))
	if d.Task.ID != running.ID {
		e.t.Fatalf("claimed %s, want %s", d.Task.ID, running.ID)
	}
	for _, id := range []string{pending.ID, running.ID} {
		e.wantErr("RetryAt of an unfinished task", e.retryErr(s, id, time.Time{}, at(3)), work.ErrInvalidTransition)
	}
	e.finish(d, work.Success(nil), at(4))
	e.wantErr("RetryAt of a succeeded task", e.retryErr(s, running.ID, time.Time{}, at(5)), work.ErrInvalidTransition)
	// A retried task is pending: a second retry is refused until it ends again.
	e.cancel(s, pending.ID, at(6))
	e.retry(s, pending.ID, time.Time{}, at(7))
	e.wantErr("RetryAt of a retried, pending task", e.retryErr(s, pending.ID, time.Time{}, at(8)), work.ErrInvalidTransition)
}

func retryNotFound(e *env) {
	const s = "session_retry_nf"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(1))
	d := e.claimOne(at(1))
	e.finish(d, work.Failure("x"), at(2))
	err := e.retryErr("session_other", t.ID, time.Time{}, at(3))
	if we := e.wantErr("RetryAt from another session", err, work.ErrTaskNotFound); we != nil && we.ID != t.ID {
		e.t.Errorf("not found names %q", we.ID)
	}
	e.wantErr("RetryAt of an unknown task", e.retryErr(s, "task_nope", time.Time{}, at(3)), work.ErrTaskNotFound)
	e.prune(at(3), 1, 0)
	e.wantErr("RetryAt of a pruned task", e.retryErr(s, t.ID, time.Time{}, at(4)), work.ErrTaskNotFound)
}

// retryBeforeWakeAck (work-api-4.md, "Retry, whatever the completion wake"): a task retried
// while its completion wake is unacknowledged is retried all the same; that wake stays
// deliverable with the outcome of the run it reports (a delivery held across the retry, and a
// redelivery after it), the retried task's next end records a wake of its own, and retention
// keeps the task, and the wake, until the wake is acknowledged: a prune before takes neither,
// a prune after takes both (the wake first).
func retryBeforeWakeAck(e *env) {
	const s = "session_retry_unacked"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion, IdempotencyKey: "r"}, at(1))
	d := e.claimOne(at(1))
	e.finish(d, work.Failure("first"), at(2))
	held := e.claimWakeOne(at(3)) // delivered before the retry, not acknowledged
	e.retry(s, t.ID, at(4), at(4))
	firstOutcome := func(what string, w work.WakeDelivery) {
		e.t.Helper()
		r := w.Wake.Reason
		if w.Wake.ID != held.Wake.ID || r.Kind != work.WakeTaskFinished || r.TaskID != t.ID || r.State != work.TaskFailed ||
			r.Outcome == nil || r.Outcome.Error != "first" {
			e.t.Errorf("%s: wake %s %+v, want %s: task %s failed with error \"first\"", what, w.Wake.ID, r, held.Wake.ID, t.ID)
		}
	}
	// The lease held across the retry runs out; the wake is delivered again, as it was.
	again := e.claimWakeOne(held.LeaseExpiresAt)
	firstOutcome("the earlier wake redelivered after the retry", again)
	if again.Attempt != 2 {
		e.t.Errorf("redelivery attempt %d, want 2", again.Attempt)
	}
	// The second run ends, with a wake of its own; the first is still unacknowledged.
	d2 := e.claimOne(at(40))
	e.finish(d2, work.Success(js(`2`)), at(41))
	second := e.claimWakeOne(at(42))
	if second.Wake.ID == held.Wake.ID || second.Wake.Reason.TaskID != t.ID || second.Wake.Reason.State != work.TaskSucceeded {
		e.t.Errorf("second run's wake %s (%s), want a new one", second.Wake.ID, second.Wake.Reason.State)
	}
	e.ok("AckWakeAt of the second run's wake", e.ack(second, at(43)))
	// The task and its current wake would be prunable from 43, but the first run's wake is
	// not acknowledged: a prune keeps all of them.
	e.prune(at(50), 0, 0)
	e.sameTask("the task kept by the prune", e.taskByKey(s, "r"), e.mustTask(s, t.ID))
	late := e.claimWakeOne(again.LeaseExpiresAt)
	firstOutcome("the earlier wake after a prune", late)
	e.ok("AckWakeAt of the earlier wake", e.ack(late, late.LeaseExpiresAt.Add(-time.Second)))
	e.claimWakeNone(at(1000))
	// Acknowledged, it is pruned at once, and the task with its current wake by its rule.
	e.prune(at(1000), 1, 2)
	e.absent(s, t.ID)
	e.wantErr("TaskByKey of the pruned task", e.taskByKeyErr(s, "r"), work.ErrTaskNotFound)
}

func retryRetention(e *env) {
	const s = "session_retry_prune"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion, IdempotencyKey: "kept"}, at(1))
	d := e.claimOne(at(1))
	e.finish(d, work.Failure("first"), at(2))
	w1 := e.claimWakeOne(at(3))
	e.ok("AckWakeAt", e.ack(w1, at(4)))
	// The task and its wake were prunable from 4; retried at 5, the task is not, and its
	// earlier (acknowledged) wake is pruned on its own.
	e.retry(s, t.ID, at(5), at(5))
	e.prune(at(100), 0, 1)
	e.mustTask(s, t.ID)
	e.sameTask("the key after the old wake was pruned", e.taskByKey(s, "kept"), e.mustTask(s, t.ID))

	// The second run ends; with its own wake acknowledged the task goes, with that wake.
	d2 := e.claimOne(at(110))
	e.finish(d2, work.Failure("second"), at(111))
	e.prune(at(200), 0, 0) // its new wake is not acknowledged
	w2 := e.claimWakeOne(at(112))
	if w2.Wake.ID == w1.Wake.ID {
		e.t.Fatal("the second run's wake is the first's")
	}
	e.ok("AckWakeAt", e.ack(w2, at(113)))
	e.prune(at(200), 1, 1)
	e.absent(s, t.ID)

	// The earlier wake is pruned before the task, whatever times the calls gave: here the
	// second run finishes (at 305) before the first wake was acknowledged (at 310).
	u := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(300))
	du := e.claimOne(at(300))
	e.finish(du, work.Failure("first"), at(301))
	e.ok("AckWakeAt", e.ack(e.claimWakeOne(at(302)), at(310)))
	e.retry(s, u.ID, at(303), at(303))
	du2 := e.claimOne(at(304))
	e.finish(du2, work.Failure("second"), at(305))
	e.ok("AckWakeAt", e.ack(e.claimWakeOne(at(306)), at(307)))
	e.prune(at(309), 1, 2) // the old wake first, then the task with its current wake
	e.absent(s, u.ID)
}

func retryReopen(e *env) {
	const s = "session_retry_reopen"
	t := e.submit(s, work.TaskRequest{Kind: "k", IdempotencyKey: "r"}, at(1))
	d := e.claimOne(at(1))
	e.finish(d, work.Failure("x"), at(2))
	got := e.retry(s, t.ID, at(20), at(3))
	e.reopen()
	e.sameTask("the retried task after reopening", e.mustTask(s, t.ID), got)
	e.sameTask("TaskByKey after reopening", e.taskByKey(s, "r"), got)
	if x := e.mustTask(s, t.ID); x.AttemptsAtRetry != 1 {
		e.t.Errorf("AttemptsAtRetry after reopening: %d, want 1", x.AttemptsAtRetry)
	}
	e.claimNone(at(19))
	if d := e.claimOne(at(20)); d.Attempt != 2 {
		e.t.Errorf("claim after reopening: attempt %d, want 2", d.Attempt)
	}
}

func retryValidation(e *env) {
	const s = "session_retry_valid"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(1))
	e.cancel(s, t.ID, at(1))
	e.wantInvalid("RetryAt of a blank id", e.retryErr(s, " ", time.Time{}, at(2)), "task_id")
	e.wantInvalid("RetryAt in a blank session", e.retryErr(" ", t.ID, time.Time{}, at(2)), "session_id")
	far := time.Unix(0, math.MaxInt64).Add(time.Hour)
	e.wantInvalid("RetryAt with now out of range", e.retryErr(s, t.ID, time.Time{}, far), "now")
	e.wantInvalid("RetryAt with run_at out of range", e.retryErr(s, t.ID, far, at(2)), "run_at")
	// The wall-clock twin retries at the queue's clock: pending, due at once.
	got, err := e.q.Session(s).Retry(e.ctx, t.ID, time.Time{})
	e.ok("Retry", err)
	if got.State != work.TaskPending || got.ScheduledAt.IsZero() {
		e.t.Errorf("Retry: %s scheduled %v", got.State, got.ScheduledAt)
	}
}

// submitMany calls SubmitManyAt, which must succeed with one result per request.
func (e *env) submitMany(session string, rs []work.TaskRequest, now time.Time) []work.SubmitResult {
	e.t.Helper()
	res, err := e.q.Session(session).SubmitManyAt(e.ctx, rs, now)
	e.ok("SubmitManyAt", err)
	if len(res) != len(rs) {
		e.t.Fatalf("SubmitManyAt: %d results for %d requests", len(res), len(rs))
	}
	for i, r := range res {
		if r.Err != nil {
			e.check(r.Err)
			e.zeroOnError(fmt.Sprintf("SubmitManyAt item %d", i), r.Task)
		}
	}
	return res
}

// submitManyErr calls SubmitManyAt, which must fail as a whole and append nothing.
func (e *env) submitManyErr(session string, rs []work.TaskRequest, now time.Time) error {
	e.t.Helper()
	n := e.lastSeq()
	res, err := e.q.Session(session).SubmitManyAt(e.ctx, rs, now)
	if err == nil {
		e.t.Fatalf("SubmitManyAt of %d requests succeeded, want an error", len(rs))
	}
	if res != nil {
		e.t.Errorf("SubmitManyAt failed but returned %d results, want none", len(res))
	}
	if evs := e.after(n); len(evs) != 0 {
		e.t.Errorf("a refused batch appended %v", typesOf(evs))
	}
	return err
}

// batchOfEveryAnswer is a batch with every answer Submit can give: new tasks, a repeat of a
// key used before the batch, a repeat and a conflict of a key first used in the batch, a
// conflict with a task before the batch, an invalid request between valid ones.
func batchOfEveryAnswer() []work.TaskRequest {
	return []work.TaskRequest{
		{Kind: "mail", Input: js(`{"to":"a"}`), IdempotencyKey: "b1"},
		{Kind: "mail", Input: js(`{"to":"b"}`), RunAt: at(500), Wake: work.WakeOnCompletion},
		{Kind: "mail", Input: js(`{ "to" : "a" }`), IdempotencyKey: "b1"}, // the first item's task
		{Kind: "mail", Input: js(`{"to":"c"}`), IdempotencyKey: "b1"},     // conflict on input
		{Kind: " ", IdempotencyKey: "b2"},                                 // invalid: its key stays free
		{Kind: "sms", IdempotencyKey: "b2"},                               // so this one is new
		{Kind: "mail", IdempotencyKey: "before"},                          // the task made before the batch
		{Kind: "sms", IdempotencyKey: "before"},                           // conflict on kind with it
		{Kind: "mail", Input: js(`nope`)},                                 // invalid JSON
		{Kind: "mail"},
	}
}

// submitManyAsSubmits: each result is what SubmitAt answers for the same requests one after
// another, on a second queue given the same history (the differential).
func submitManyAsSubmits(e *env) {
	const s = "session_many"
	rs := batchOfEveryAnswer()
	before := work.TaskRequest{Kind: "mail", IdempotencyKey: "before"}
	pre := e.submit(s, before, at(1))
	res := e.submitMany(s, rs, at(2))

	other := e.fresh()
	opre, err := other.Session(s).SubmitAt(e.ctx, before, at(1))
	e.ok("SubmitAt on the second queue", err)
	names := map[string]string{pre.ID: opre.ID} // this queue's ids to the other's
	for i, r := range rs {
		want, werr := other.Session(s).SubmitAt(e.ctx, r, at(2))
		got := res[i]
		if (werr == nil) != (got.Err == nil) {
			e.t.Errorf("item %d: SubmitMany said %v, SubmitAt %v", i, got.Err, werr)
			continue
		}
		if werr != nil {
			ge, we := e.check(got.Err), e.check(werr)
			if ge == nil || we == nil || ge.Kind != we.Kind || ge.Field != we.Field || ge.Key != we.Key ||
				(we.ID != "" && names[ge.ID] != we.ID) {
				e.t.Errorf("item %d: SubmitMany error %v, SubmitAt error %v", i, got.Err, werr)
			}
			continue
		}
		if id, ok := names[got.Task.ID]; ok && id != want.ID {
			e.t.Errorf("item %d: task %s, SubmitAt answered the other task (%s)", i, got.Task.ID, want.ID)
		}
		names[got.Task.ID] = want.ID
		w := want
		w.ID, w.CreatedAt = got.Task.ID, got.Task.CreatedAt
		e.sameTask(fmt.Sprintf("item %d", i), got.Task, w)
	}
	// The answers themselves, as the spec names them.
	if res[2].Err != nil || res[2].Task.ID != res[0].Task.ID {
		e.t.Errorf("a key repeated in the batch: %v %s, want the first item's task %s", res[2].Err, res[2].Task.ID, res[0].Task.ID)
	}
	if we := e.wantErr("a conflicting key in the batch", res[3].Err, work.ErrIdempotencyConflict); we != nil &&
		(we.ID != res[0].Task.ID || we.Field != "input") {
		e.t.Errorf("the conflict names %s field %q, want %s input", we.ID, we.Field, res[0].Task.ID)
	}
	e.wantInvalid("an invalid item", res[4].Err, "kind")
	if res[5].Err != nil || res[5].Task.IdempotencyKey != "b2" {
		e.t.Errorf("the key an invalid item named: %v", res[5].Err)
	}
	if res[6].Err != nil || res[6].Task.ID != pre.ID {
		e.t.Errorf("a key used before the batch: %v %s, want %s", res[6].Err, res[6].Task.ID, pre.ID)
	}
	e.wantErr("a conflict with a task before the batch", res[7].Err, work.ErrIdempotencyConflict)
	e.wantInvalid("invalid JSON", res[8].Err, "input")
	// Every new task reads back as returned, and the key finds it.
	for i, r := range res {
		if r.Err == nil {
			e.sameTask(fmt.Sprintf("item %d read back", i), e.mustTask(s, r.Task.ID), r.Task)
		}
	}
	e.sameTask("TaskByKey of a batch's key", e.taskByKey(s, "b1"), res[0].Task)
}

// submitManyOneStep: the batch's new tasks are task_submitted events in request order, one
// after another with nothing between them, in submission order in the session's list, and
// claimed in that order.
func submitManyOneStep(e *env) {
	const s = "session_many_step"
	var rs []work.TaskRequest
	for i := range 50 {
		rs = append(rs, work.TaskRequest{Kind: "k", Input: js(fmt.Sprint(i))})
	}
	n := e.lastSeq()
	res := e.submitMany(s, rs, at(3))
	evs := e.after(n)
	if len(evs) != len(rs) {
		e.t.Fatalf("the batch appended %d events, want %d", len(evs), len(rs))
	}
	for i, ev := range evs {
		sub, ok := ev.(*events.TaskSubmitted)
		if !ok || sub.TaskID != res[i].Task.ID || ev.Head().Seq != n+1+uint64(i) || sub.At != at(3).UnixNano() {
			e.t.Fatalf("event %d of the batch: %T %+v, want task_submitted of %s", i, ev, ev, res[i].Task.ID)
		}
	}
	if l := e.list(s, work.TaskFilter{Limit: 100}); fmt.Sprint(idsOf(l)) != fmt.Sprint(idsOfResults(res)) {
		e.t.Errorf("Tasks: %v, want the batch's order %v", idsOf(l), idsOfResults(res))
	}
	ds := e.claim(at(3), lease, 100)
	if fmt.Sprint(idsOf(ds)) != fmt.Sprint(idsOfResults(res)) {
		e.t.Errorf("claim order %v, want the batch's order", idsOf(ds))
	}
}

func idsOfResults(res []work.SubmitResult) []string {
	out := make([]string, len(res))
	for i, r := range res {
		out[i] = r.Task.ID
	}
	return out
}

// submitManyInvalidItems: a batch whose every item is invalid records nothing and answers
// each with its error.
func submitManyInvalidItems(e *env) {
	const s = "session_many_invalid"
	n := e.lastSeq()
	res := e.submitMany(s, []work.TaskRequest{{Kind: ""}, {Kind: "k", IdempotencyKey: " "}, {Kind: "k", RunAt: time.Unix(0, math.MaxInt64).Add(time.Hour)}}, at(1))
	e.wantInvalid("item 0", res[0].Err, "kind")
	e.wantInvalid("item 1", res[1].Err, "idempotency_key")
	e.wantInvalid("item 2", res[2].Err, "run_at")
	if evs := e.after(n); len(evs) != 0 {
		e.t.Errorf("a batch of invalid items appended %v", typesOf(evs))
	}
}

func submitManyReopen(e *env) {
	const s = "session_many_reopen"
	res := e.submitMany(s, batchOfEveryAnswer(), at(1))
	e.reopen()
	for i, r := range res {
		if r.Err == nil {
			e.sameTask(fmt.Sprintf("item %d after reopening", i), e.mustTask(s, r.Task.ID), r.Task)
		}
	}
	// The keys the batch took stay taken.
	if again := e.submit(s, work.TaskRequest{Kind: "mail", Input: js(`{"to":"a"}`), IdempotencyKey: "b1"}, at(2)); again.ID != res[0].Task.ID {
		e.t.Errorf("after reopening, key b1 names %s, want %s", again.ID, res[0].Task.ID)
	}
}

func submitManyValidation(e *env) {
	const s = "session_many_valid"
	e.wantInvalid("an empty batch", e.submitManyErr(s, nil, at(1)), "requests")
	e.wantInvalid("an empty batch", e.submitManyErr(s, []work.TaskRequest{}, at(1)), "requests")
	big := make([]work.TaskRequest, work.MaxSubmitMany+1)
	for i := range big {
		big[i] = work.TaskRequest{Kind: "k"}
	}
	e.wantInvalid("a batch over the limit", e.submitManyErr(s, big, at(1)), "requests")
	e.wantInvalid("a blank session", e.submitManyErr(" ", big[:1], at(1)), "session_id")
	far := time.Unix(0, math.MaxInt64).Add(time.Hour)
	e.wantInvalid("now out of range", e.submitManyErr(s, big[:1], far), "now")
	// Exactly the limit is one batch; the wall-clock twin submits at the queue's clock.
	res := e.submitMany(s, big[:work.MaxSubmitMany], at(1))
	if res[0].Err != nil || res[work.MaxSubmitMany-1].Err != nil {
		e.t.Fatalf("a batch of exactly the limit: %v, %v", res[0].Err, res[work.MaxSubmitMany-1].Err)
	}
	got, err := e.q.Session(s).SubmitMany(e.ctx, big[:2])
	e.ok("SubmitMany", err)
	if len(got) != 2 || got[0].Err != nil || got[0].Task.CreatedAt.IsZero() {
		e.t.Errorf("SubmitMany: %+v", got)
	}
}

// maximalBatch is a batch of exactly work.MaxSubmitManyBytes (what the limit counts: inputs,
// kinds, keys, headers), of as few requests as the queue's value limit allows, each with a
// key of its own (keyed "<prefix><n>", padded): inputs of up to 1 MiB, the rest in the keys.
func maximalBatch(maxValue int, prefix string) []work.TaskRequest {
	in := min(maxValue, 1<<20)
	n := min(work.MaxSubmitMany, (work.MaxSubmitManyBytes+in-1)/in)
	rs := make([]work.TaskRequest, n)
	left := work.MaxSubmitManyBytes
	for i := range rs {
		share := left / (n - i) // what this request counts; the shares sum to the limit
		left -= share
		key := fmt.Sprintf("%s%06d", prefix, i)
		size := min(in, share-1-len(key))
		key += strings.Repeat("k", share-1-len(key)-size)
		rs[i] = work.TaskRequest{Kind: "k", IdempotencyKey: key, Input: exactly(size)}
	}
	return rs
}

// submitManySizeLimit: a batch of more than work.MaxSubmitManyBytes is refused as a whole
// (ErrInvalidRequest, "requests", the message naming the limit and the batch's size) and
// nothing of it is stored, on every backend; one of exactly the limit succeeds whole.
func submitManySizeLimit(e *env) {
	const s = "session_many_size"
	maxValue := e.h.MaxValueBytes
	if maxValue == 0 {
		maxValue = work.DefaultMaxValueBytes
	}
	over := maximalBatch(maxValue, "over-")
	over[len(over)-1].Headers = map[string]string{"x": ""} // one byte more
	err := e.wantInvalid("a batch of one byte more than the limit", e.submitManyErr(s, over, at(1)), "requests")
	for _, want := range []string{fmt.Sprint(work.MaxSubmitManyBytes), fmt.Sprint(work.MaxSubmitManyBytes + 1)} {
		if !strings.Contains(err.Message, want) {
			e.t.Errorf("the refusal %q does not name %s (the limit and the batch's size)", err.Message, want)
		}
	}
	if _, err := e.q.Session(s).TaskByKey(e.ctx, over[0].IdempotencyKey); !errors.Is(err, work.ErrTaskNotFound) {
		e.t.Errorf("after the refused batch, its first key: %v, want ErrTaskNotFound", err)
	}
	over = nil
	if raceEnabled { // race_off.go says why
		e.t.Log("the race detector is on: the batch of exactly the limit is left out")
		return
	}
	// Exactly the limit: every request succeeds.
	rs := maximalBatch(maxValue, "at-")
	res := e.submitMany(s, rs, at(2))
	for i, r := range res {
		if r.Err != nil || len(r.Task.Input) != len(rs[i].Input) || r.Task.IdempotencyKey != rs[i].IdempotencyKey {
			e.t.Fatalf("a batch of exactly the limit: item %d: %v, %d bytes of input", i, r.Err, len(r.Task.Input))
		}
	}
	last := len(rs) - 1
	if got := e.mustTask(s, res[last].Task.ID); len(got.Input) != len(rs[last].Input) {
		e.t.Errorf("the batch's last task reads back with %d bytes of input, want %d", len(got.Input), len(rs[last].Input))
	}
}

// submitManyCallerBytes: once SubmitMany has returned, the caller may overwrite its
// requests' inputs, and nothing stored changes (a backend may have passed the caller's own
// bytes to its writer instead of a copy: engineapi.Config.BorrowedInputMin). Inputs of each
// size around the backends' thresholds (4 KiB: the caches' largest value; 64 KiB: Pebble's
// direct encoding); the results may share the overwritten bytes, a read must not.
func submitManyCallerBytes(e *env) {
	const s = "session_many_bytes"
	sizes := []int{100, 4<<10 + 1, 64<<10 + 1}
	rs := make([]work.TaskRequest, 0, 2*len(sizes))
	var want []string
	for _, n := range sizes {
		if n > e.h.MaxValueBytes {
			continue
		}
		for k := range 2 {
			in := exactly(n)
			in[1] = byte('a' + k)
			rs = append(rs, work.TaskRequest{Kind: "k", Input: in})
			want = append(want, string(in))
		}
	}
	res := e.submitMany(s, rs, at(1))
	for _, r := range rs {
		for i := 1; i < len(r.Input)-1; i++ {
			r.Input[i] = 'X'
		}
	}
	for i, r := range res {
		if got := e.mustTask(s, r.Task.ID); string(got.Input) != want[i] {
			e.t.Errorf("item %d (%d bytes): read back after the caller overwrote its input: %.12q..., want %.12q...",
				i, len(want[i]), got.Input, want[i])
		}
	}
	// Claimed directly: env.claim's leak check formats every delivery, slow for 64 KiB inputs.
	ds, err := e.q.ClaimDueAt(e.ctx, at(2), time.Minute, len(rs)+10)
	e.ok("ClaimDueAt", err)
	for _, d := range ds {
		for i, r := range res {
			if d.Task.ID == r.Task.ID && string(d.Task.Input) != want[i] {
				e.t.Errorf("item %d (%d bytes): claimed after the caller overwrote its input: %.12q...", i, len(want[i]), d.Task.Input)
			}
		}
	}
}
