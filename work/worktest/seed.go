package worktest

import (
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// seedScenarios port the seed's own suite, everruns tests/session_work.rs, one for one
// (with the boundaries the seed leaves implicit made explicit).
func seedScenarios() []scenario {
	return []scenario{
		{"seed/immediate_wake_is_claimed_once_after_acknowledgment", seedImmediateWake},
		{"seed/scheduled_work_is_not_claimed_early", seedScheduledNotEarly},
		{"seed/cancellation_is_immediate_when_pending_and_cooperative_when_running", seedCancellation},
		{"seed/submission_keys_deduplicate_and_reject_changed_intent", seedSubmissionKeys},
		{"seed/expired_lease_redelivers_and_fences_the_stale_attempt", seedExpiredLease},
		{"seed/completion_creates_one_at_least_once_wake", seedCompletionWake},
		{"seed/queue_recreation_with_same_backend_preserves_unfinished_work", seedRecreation},
		{"seed/replacing_the_backend_drops_state", seedReplacing},
		{"seed/invalid_claim_and_request_values_fail_at_the_facade", seedInvalidAtFacade},
		{"seed/task_reads_and_cancellation_are_session_scoped", seedSessionScoped},
	}
}

func seedImmediateWake(e *env) {
	const s = "session_example"
	now := at(100)
	refresh := work.WakeRequest{Payload: js(`{"reason":"refresh"}`), IdempotencyKey: "refresh-1"}
	w := e.wake(s, refresh, now)
	e.eqJSON("wake payload", w.Reason.Payload, `{"reason":"refresh"}`)
	e.eqTime("wake CreatedAt", w.CreatedAt, now)
	if w.IdempotencyKey != "refresh-1" {
		e.t.Errorf("wake key %q, want refresh-1", w.IdempotencyKey)
	}

	dup := e.wake(s, refresh, now.Add(time.Second))
	if dup.ID != w.ID {
		e.t.Fatalf("duplicate wake %s, want the original %s", dup.ID, w.ID)
	}
	e.eqTime("duplicate wake CreatedAt", dup.CreatedAt, now)

	n := e.logLen()
	err := e.wakeErr(s, work.WakeRequest{Payload: js(`{"reason":"different"}`), IdempotencyKey: "refresh-1"}, now.Add(2*time.Second))
	we := e.wantErr("wake with a reused key", err, work.ErrIdempotencyConflict)
	if we.Key != "refresh-1" {
		e.t.Errorf("conflict key %q, want refresh-1", we.Key)
	}
	e.wantText("conflict", err, "idempotency key was reused for different work: refresh-1 (payload differs from "+w.ID+")")
	e.nothingAppended("a conflicting wake", n)

	first := e.claimWakeOne(now)
	if first.Wake.ID != w.ID || first.Attempt != 1 {
		e.t.Fatalf("claimed wake %s attempt %d, want %s attempt 1", first.Wake.ID, first.Attempt, w.ID)
	}
	if first.Wake.Reason.Kind != work.WakeRequested {
		e.t.Errorf("wake reason %s, want requested", first.Wake.Reason.Kind)
	}
	e.eqJSON("claimed wake payload", first.Wake.Reason.Payload, `{"reason":"refresh"}`)
	e.claimWakeNone(now)
	e.claimWakeNone(now.Add(lease - time.Nanosecond))

	retry := e.claimWakeOne(now.Add(lease))
	if retry.Wake.ID != w.ID || retry.Attempt != 2 {
		e.t.Fatalf("redelivered wake %s attempt %d, want %s attempt 2", retry.Wake.ID, retry.Attempt, w.ID)
	}
	err = e.ack(first, now.Add(lease))
	e.wantErr("ack of the superseded attempt", err, work.ErrStaleDelivery)
	e.wantText("stale ack", err, "delivery no longer owns "+w.ID)
	e.ok("ack", e.ack(retry, now.Add(lease)))
	e.ok("repeated ack", e.ack(retry, now.Add(lease)))
	e.claimWakeNone(now.Add(2 * lease))
	e.claimWakeNone(now.Add(1000 * lease))

	other := e.wake("session_other", refresh, now)
	if other.ID == w.ID {
		e.t.Error("a wake key of another session returned this session's wake")
	}
}

func seedScheduledNotEarly(e *env) {
	const s = "session_example"
	submitted, due := at(100), at(160)
	task := e.submit(s, work.TaskRequest{Kind: "digest", Input: js(`{"range":"daily"}`), RunAt: due}, submitted)
	e.eqState("scheduled task", task.State, work.TaskPending)
	e.eqTime("ScheduledAt", task.ScheduledAt, due)
	e.eqTime("CreatedAt", task.CreatedAt, submitted)

	e.claimNone(at(159))
	e.claimNone(due.Add(-time.Nanosecond))
	d := e.claimOne(due) // bounds are inclusive: due exactly at ScheduledAt
	if d.Task.Kind != "digest" || d.Task.ID != task.ID {
		e.t.Errorf("claimed %s (%s), want the digest task %s", d.Task.ID, d.Task.Kind, task.ID)
	}
	e.eqJSON("delivered input", d.Task.Input, `{"range":"daily"}`)
}

func seedCancellation(e *env) {
	const s = "session_example"
	now := at(100)

	// Pending work, even scheduled in the future, is canceled at once.
	pending := e.submit(s, work.TaskRequest{Kind: "pending", Input: js(`null`), RunAt: at(500), Wake: work.WakeOnCompletion}, now)
	canceled := e.cancel(s, pending.ID, now)
	e.eqState("canceled pending task", canceled.State, work.TaskCanceled)
	e.eqTime("CancelRequestedAt", canceled.CancelRequestedAt, now)
	e.eqTime("FinishedAt", canceled.FinishedAt, now)
	e.eqOutcome("canceled pending task", canceled.Outcome, work.Cancellation())
	if canceled.Attempts != 0 {
		e.t.Errorf("canceled pending task has %d attempts", canceled.Attempts)
	}
	cw := e.claimWakeOne(now)
	r := cw.Wake.Reason
	if r.Kind != work.WakeTaskFinished || r.TaskID != pending.ID || r.State != work.TaskCanceled {
		e.t.Errorf("cancel wake reason %+v, want task_finished canceled for %s", r, pending.ID)
	}
	e.eqOutcome("cancel wake", r.Outcome, work.Cancellation())
	e.claimNone(at(500)) // never delivered, not even at its scheduled time

	// Running work only records the request; the worker settles with Cancellation.
	running := e.submit(s, work.TaskRequest{Kind: "running", Input: js(`null`)}, now)
	var delivery work.TaskDelivery
	for _, d := range e.claim(now, lease, 10) {
		if d.Task.ID == running.ID {
			delivery = d
		}
	}
	if delivery.Task.ID == "" {
		e.t.Fatal("the running task was not claimed")
	}
	got := e.cancel(s, running.ID, now)
	e.eqState("cancel of running work", got.State, work.TaskRunning)
	e.eqTime("CancelRequestedAt", got.CancelRequestedAt, now)
	if !got.FinishedAt.IsZero() || got.Outcome != nil {
		e.t.Errorf("running task after cancel request: finished %v outcome %v", got.FinishedAt, got.Outcome)
	}

	done := e.finish(delivery, work.Cancellation(), now)
	e.eqState("cooperatively canceled task", done.State, work.TaskCanceled)
	e.eqTime("CancelRequestedAt after settle", done.CancelRequestedAt, now)
	e.eqOutcome("cooperatively canceled task", done.Outcome, work.Cancellation())
}

func seedSubmissionKeys(e *env) {
	const s = "session_example"
	now := at(100)
	req := work.TaskRequest{Kind: "export", Input: js(`{"format":"jsonl"}`), IdempotencyKey: "export-42"}
	first := e.submit(s, req, now)
	if first.IdempotencyKey != "export-42" {
		e.t.Errorf("task key %q, want export-42", first.IdempotencyKey)
	}
	n := e.logLen()
	dup := e.submit(s, req, at(101))
	e.sameTask("duplicate submission", dup, first)
	e.nothingAppended("a duplicate submission", n)

	other := e.submit("session_other", req, now)
	if other.ID == first.ID {
		e.t.Error("a key of another session returned this session's task")
	}

	n = e.logLen()
	err := e.submitErr(s, work.TaskRequest{Kind: "export", Input: js(`{"format":"csv"}`), IdempotencyKey: "export-42"}, at(102))
	we := e.wantErr("changed intent", err, work.ErrIdempotencyConflict)
	if we.Key != "export-42" {
		e.t.Errorf("conflict key %q, want export-42", we.Key)
	}
	e.wantText("conflict", err, "idempotency key was reused for different work: export-42 (input differs from "+first.ID+")")
	e.nothingAppended("a conflicting submission", n)
}

func seedExpiredLease(e *env) {
	const s = "session_example"
	now := at(100)
	task := e.submit(s, work.TaskRequest{Kind: "retryable", Input: js(`null`)}, now)

	first := e.claimOne(now)
	e.claimNone(now.Add(lease - time.Nanosecond))
	second := e.claimOne(now.Add(lease)) // expires_at <= now is expired
	if first.Task.ID != task.ID || second.Task.ID != task.ID {
		e.t.Fatalf("claimed %s then %s, want %s twice", first.Task.ID, second.Task.ID, task.ID)
	}
	if first.Attempt != 1 || second.Attempt != 2 || second.Task.Attempts != 2 {
		e.t.Errorf("attempts %d then %d (task %d), want 1 then 2", first.Attempt, second.Attempt, second.Task.Attempts)
	}
	if first.LeaseToken() == second.LeaseToken() {
		e.t.Error("a redelivery reused the lease token")
	}

	n := e.logLen()
	err := e.finishErr(first, work.Success(js(`{"stale":true}`)), now)
	we := e.wantErr("finish by the stale attempt", err, work.ErrStaleDelivery)
	if we.ID != task.ID {
		e.t.Errorf("stale delivery id %q, want %s", we.ID, task.ID)
	}
	e.wantText("stale finish", err, "delivery no longer owns "+task.ID)
	for _, ev := range e.since(n) {
		if ev.Type() != events.TypeTaskSettleRejected {
			e.t.Errorf("a stale finish appended %s", ev.Type())
		}
	}

	done := e.finish(second, work.Success(js(`{"attempt":2}`)), now.Add(lease))
	e.eqState("finished task", done.State, work.TaskSucceeded)
	e.eqOutcome("finished task", done.Outcome, work.Success(js(`{"attempt":2}`)))
	e.eqTime("FinishedAt", done.FinishedAt, now.Add(lease))
	if done.Attempts != 2 {
		e.t.Errorf("finished task attempts %d, want 2", done.Attempts)
	}
	e.claimNone(now.Add(100 * lease))
}

func seedCompletionWake(e *env) {
	const s = "session_example"
	now := at(100)
	task := e.submit(s, work.TaskRequest{Kind: "index", Input: js(`{"document":7}`), Wake: work.WakeOnCompletion}, now)
	d := e.claimOne(now)
	outcome := work.SuccessWithSummary("indexed document", js(`{"ok":true}`))
	first := e.finish(d, outcome, now)
	again := e.finish(d, outcome, now)
	e.sameTask("repeated finish", again, first)

	wakes := e.claimWakes(now, lease, 10)
	if len(wakes) != 1 {
		e.t.Fatalf("claimed %d wakes, want exactly 1", len(wakes))
	}
	r := wakes[0].Wake.Reason
	if r.Kind != work.WakeTaskFinished || r.TaskID != task.ID || r.State != work.TaskSucceeded {
		e.t.Errorf("completion wake reason %+v, want task_finished succeeded for %s", r, task.ID)
	}
	e.eqOutcome("completion wake", r.Outcome, outcome)
	if wakes[0].Wake.SessionID != s || wakes[0].Wake.IdempotencyKey != "" {
		e.t.Errorf("completion wake session %q key %q", wakes[0].Wake.SessionID, wakes[0].Wake.IdempotencyKey)
	}
}

func seedRecreation(e *env) {
	now := at(100)
	task := e.submit("session_example", work.TaskRequest{Kind: "resume", Input: js(`null`)}, now)
	e.reopen()
	d := e.claimOne(now)
	if d.Task.ID != task.ID {
		e.t.Errorf("the reopened queue delivered %s, want %s", d.Task.ID, task.ID)
	}
}

func seedReplacing(e *env) {
	now := at(100)
	task := e.submit("session_example", work.TaskRequest{Kind: "ephemeral", Input: js(`null`)}, now)
	replacement := e.fresh()
	got, found, err := replacement.Session("session_example").Task(e.ctx, task.ID)
	e.ok("Task on a fresh queue", err)
	if found || !isZero(got) {
		e.t.Errorf("a fresh queue knows task %s: %+v", task.ID, got)
	}
	ds, err := replacement.ClaimDueAt(e.ctx, now, lease, 10)
	e.ok("ClaimDueAt on a fresh queue", err)
	if len(ds) != 0 {
		e.t.Errorf("a fresh queue delivered %d tasks", len(ds))
	}
	e.ok("Verify of the fresh queue", replacement.Verify(e.ctx))
}

func seedInvalidAtFacade(e *env) {
	n := e.logLen()
	_, err := e.session("session_example").Submit(e.ctx, work.TaskRequest{Kind: "   ", Input: js(`null`)})
	e.wantInvalid("blank kind", err, "kind")
	e.wantText("blank kind", err, "invalid work request field kind: must not be blank")

	_, err = e.q.ClaimDue(e.ctx, 0, 1)
	e.wantInvalid("zero lease", err, "lease_for")

	_, err = e.session("session_example").Cancel(e.ctx, "   ")
	e.wantInvalid("blank task id", err, "task_id")
	e.nothingAppended("invalid requests", n)

	// The seed's last check, on the helper custom backends use.
	req := work.TaskRequest{Kind: "invalid-snapshot", Input: js(`null`)}
	task := work.PendingTask("task_invalid", "session_example", req, at(100))
	task.State = work.TaskSucceeded
	o := work.Failure("mismatched outcome")
	task.Outcome = &o
	if w, ok := work.TaskFinishedWake("wake_invalid", task, at(101)); ok {
		e.t.Errorf("TaskFinishedWake of a mismatched snapshot = %+v, want false", w)
	}
}

func seedSessionScoped(e *env) {
	now := at(100)
	task := e.submit("session_owner", work.TaskRequest{Kind: "private", Input: js(`{"value":7}`)}, now)

	if got, found := e.task("session_other", task.ID); found {
		e.t.Errorf("another session reads task %s: %+v", task.ID, got)
	}
	n := e.logLen()
	_, err := e.session("session_other").CancelAt(e.ctx, task.ID, now)
	we := e.wantErr("foreign cancel", err, work.ErrTaskNotFound)
	if we.ID != task.ID {
		e.t.Errorf("not-found id %q, want %s", we.ID, task.ID)
	}
	e.wantText("foreign cancel", err, "task not found: "+task.ID)
	e.nothingAppended("a foreign cancel", n)

	got := e.mustTask("session_owner", task.ID)
	e.sameTask("owner's read", got, task)
	e.eqState("task after a foreign cancel", got.State, work.TaskPending)
}
