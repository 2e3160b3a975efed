package worktest

import (
	"math"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// taskScenarios cover the task rules of the seed and the spec that the seed's suite leaves
// untested.
func taskScenarios() []scenario {
	s := []scenario{
		{"task/idempotent_submit_returns_the_current_snapshot", taskIdempotentCurrent},
		{"task/idempotency_compares_each_field", taskIdempotencyFields},
		{"task/idempotency_compares_json_as_a_value", taskJSONAsValue},
		{"task/json_is_stored_as_given_and_nil_is_null", taskJSONAsGiven},
		{"task/caller_buffers_are_not_retained", taskBuffersNotRetained},
		{"task/keys_are_session_scoped_and_apart_from_wake_keys", taskKeyNamespaces},
		{"task/finish_of_an_unknown_task", taskFinishUnknown},
		{"task/finish_repeated_with_the_same_token", taskFinishRepeated},
		{"task/finish_ignores_lease_expiry", taskFinishIgnoresExpiry},
		{"task/stale_deliveries_are_fenced", taskStaleFenced},
		{"task/cancel_of_running_work_is_cooperative", taskCancelRunning},
		{"task/cancel_of_a_terminal_task_changes_nothing", taskCancelTerminal},
		{"task/a_worker_may_settle_otherwise_after_a_cancel_request", taskSettleOtherwiseAfterCancel},
		{"task/claim_order_of_pending_work", taskClaimOrderPending},
		{"task/claim_order_with_expired_leases", taskClaimOrderExpired},
		{"task/claim_limit", taskClaimLimit},
		{"task/lease_expiry_out_of_range_claims_nothing", taskLeaseOverflow},
		{"task/ids_and_tokens", taskIDsAndTokens},
		{"task/wake_never_records_no_wake", taskWakeNever},
	}
	for _, end := range []string{"success", "failure", "worker_cancellation", "cancel_while_pending"} {
		s = append(s, scenario{"task/completion_wake_once_at_least_once/" + end, completionWakeScenario(end)})
	}
	return s
}

func taskIdempotentCurrent(e *env) {
	const s = "session_current"
	req := work.TaskRequest{Kind: "report", Input: js(`{"n":1}`), IdempotencyKey: "k-current", Wake: work.WakeOnCompletion}
	first := e.submit(s, req, at(100))
	e.eqState("new task", first.State, work.TaskPending)

	d := e.claimOne(at(100))
	cur := e.submit(s, req, at(105))
	e.eqState("resubmitted running task", cur.State, work.TaskRunning)
	if cur.ID != first.ID || cur.Attempts != 1 {
		e.t.Errorf("resubmission returned %s attempts %d, want %s attempts 1", cur.ID, cur.Attempts, first.ID)
	}
	e.eqTime("CreatedAt", cur.CreatedAt, at(100))

	e.cancel(s, first.ID, at(106))
	cur = e.submit(s, req, at(107))
	e.eqTime("resubmitted CancelRequestedAt", cur.CancelRequestedAt, at(106))

	done := e.finish(d, work.Cancellation(), at(108))
	n := e.logLen()
	cur = e.submit(s, req, at(200))
	e.sameTask("resubmission of a finished task", cur, done)
	e.nothingAppended("resubmission of a finished task", n)
	e.claimNone(at(1000)) // resubmitting does not revive it

	// A pending task canceled before its time is returned canceled too.
	sched := work.TaskRequest{Kind: "later", RunAt: at(900), IdempotencyKey: "k-later"}
	t := e.submit(s, sched, at(100))
	e.cancel(s, t.ID, at(101))
	cur = e.submit(s, sched, at(102))
	e.eqState("resubmission of a canceled task", cur.State, work.TaskCanceled)
	e.eqTime("its FinishedAt", cur.FinishedAt, at(101))
}

func taskIdempotencyFields(e *env) {
	const s = "session_fields"
	base := work.TaskRequest{Kind: "export", Input: js(`{"format":"jsonl"}`), IdempotencyKey: "k-base"}
	first := e.submit(s, base, at(100))

	// Each case names the field the conflict must report: the first field of the intent
	// (kind, run_at, wake, input) in which the request differs.
	type conflictCase struct {
		r     work.TaskRequest
		field string
	}
	conflicts := map[string]conflictCase{}
	v := base
	v.Kind = "export2"
	conflicts["kind"] = conflictCase{v, "kind"}
	v = base
	v.Input = js(`{"format":"csv"}`)
	conflicts["input"] = conflictCase{v, "input"}
	v = base
	v.RunAt = at(100) // the same instant as the submission, but an explicit schedule
	conflicts["schedule immediate vs at"] = conflictCase{v, "run_at"}
	v = base
	v.Wake = work.WakeOnCompletion
	conflicts["wake policy"] = conflictCase{v, "wake"}
	v = base
	v.Kind, v.Input = "export2", js(`{"format":"csv"}`)
	conflicts["kind and input"] = conflictCase{v, "kind"}

	n := e.logLen()
	for what, c := range conflicts {
		err := e.submitErr(s, c.r, at(101))
		we := e.wantErr(what, err, work.ErrIdempotencyConflict)
		if we.Key != "k-base" || we.Field != c.field || we.ID != first.ID {
			e.t.Errorf("%s: conflict names key %q, field %q, task %q; want k-base, %s, %s", what, we.Key, we.Field, we.ID, c.field, first.ID)
		}
	}
	e.nothingAppended("conflicting submissions", n)

	// Another key is another task; no key never deduplicates.
	v = base
	v.IdempotencyKey = "k-other"
	if other := e.submit(s, v, at(101)); other.ID == first.ID {
		e.t.Error("a different key returned the same task")
	}
	v.IdempotencyKey = ""
	a, b := e.submit(s, v, at(102)), e.submit(s, v, at(102))
	if a.ID == b.ID || a.ID == first.ID {
		e.t.Error("submissions without a key were deduplicated")
	}
	if a.IdempotencyKey != "" {
		e.t.Errorf("keyless task has key %q", a.IdempotencyKey)
	}

	// A scheduled request: zero vs set vs a different instant; the same instant in another
	// location is the same schedule (times compare as instants).
	sched := work.TaskRequest{Kind: "digest", Input: js(`null`), RunAt: at(500), IdempotencyKey: "k-sched"}
	st := e.submit(s, sched, at(100))
	loc := time.FixedZone("UTC+5", 5*3600)
	same := sched
	same.RunAt = at(500).In(loc)
	if got := e.submit(s, same, at(101)); got.ID != st.ID {
		e.t.Error("the same RunAt in another location was treated as a different schedule")
	}
	n = e.logLen()
	for what, runAt := range map[string]time.Time{
		"schedule at vs immediate": {},
		"schedule moved by 1ns":    at(500).Add(time.Nanosecond),
		"schedule moved earlier":   at(400),
	} {
		r := sched
		r.RunAt = runAt
		if we := e.wantErr(what, e.submitErr(s, r, at(101)), work.ErrIdempotencyConflict); we.Field != "run_at" || we.ID != st.ID {
			e.t.Errorf("%s: conflict names field %q, task %q; want run_at, %s", what, we.Field, we.ID, st.ID)
		}
	}
	e.nothingAppended("conflicting schedules", n)
	if got := e.mustTask(s, st.ID); !got.ScheduledAt.Equal(at(500)) {
		e.t.Errorf("a conflict moved the schedule to %v", got.ScheduledAt)
	}
}

func taskJSONAsValue(e *env) {
	const s = "session_json"
	orig := `{"a":1,"b":{"c":[1,2]},"s":"A"}`
	req := work.TaskRequest{Kind: "k", Input: js(orig), IdempotencyKey: "k-json"}
	first := e.submit(s, req, at(100))

	n := e.logLen()
	for _, same := range []string{
		`{ "b" : { "c" : [ 1 , 2 ] } , "s" : "A", "a" : 1 }`,
		"{\n\t\"a\": 1,\n\t\"b\": {\"c\": [1, 2]},\n\t\"s\": \"\\u0041\"\n}",
	} {
		r := req
		r.Input = js(same)
		got := e.submit(s, r, at(101))
		if got.ID != first.ID {
			e.t.Errorf("input %s was not the same value as %s", same, orig)
		}
		e.eqJSON("input of the deduplicated task", got.Input, orig)
	}
	for _, differ := range []string{
		`{"a":1.0,"b":{"c":[1,2]},"s":"A"}`,
		`{"a":1,"b":{"c":[2,1]},"s":"A"}`,
		`{"a":1,"b":{"c":[1,2]},"s":"a"}`,
		`{"a":1,"b":{"c":[1,2]}}`,
		`{"a":1,"b":{"c":[1,2]},"s":"A","t":null}`,
		`[{"a":1,"b":{"c":[1,2]},"s":"A"}]`,
	} {
		r := req
		r.Input = js(differ)
		e.wantErr("input "+differ, e.submitErr(s, r, at(101)), work.ErrIdempotencyConflict)
	}
	// Numbers compare by their literal text: 1 and 1.0 differ, as in the seed.
	num := work.TaskRequest{Kind: "k", Input: js(`1`), IdempotencyKey: "k-num"}
	e.submit(s, num, at(100))
	num.Input = js(`1.0`)
	e.wantErr("1 vs 1.0", e.submitErr(s, num, at(101)), work.ErrIdempotencyConflict)
	num.Input = js(` 1 `)
	e.submit(s, num, at(101))
	e.appended("value-equal and conflicting submissions", n, events.TypeTaskSubmitted)
}

func taskJSONAsGiven(e *env) {
	const s = "session_given"
	in := `{ "b" : 1,  "a" : [true, null] }`
	t := e.submit(s, work.TaskRequest{Kind: "k", Input: js(in)}, at(100))
	e.eqJSON("submitted input", t.Input, in)
	e.eqJSON("read input", e.mustTask(s, t.ID).Input, in)
	d := e.claimOne(at(100))
	e.eqJSON("delivered input", d.Task.Input, in)
	out := `{ "z" : [1, 2.50] }`
	done := e.finish(d, work.Success(js(out)), at(101))
	e.eqJSON("output", done.Outcome.Output, out)

	// nil Input is stored and returned as null, and equals an explicit null.
	nilTask := e.submit(s, work.TaskRequest{Kind: "k", IdempotencyKey: "k-nil"}, at(100))
	e.eqJSON("nil input", nilTask.Input, "null")
	e.eqJSON("read nil input", e.mustTask(s, nilTask.ID).Input, "null")
	for _, null := range []string{"null", " null "} {
		if got := e.submit(s, work.TaskRequest{Kind: "k", Input: js(null), IdempotencyKey: "k-nil"}, at(101)); got.ID != nilTask.ID {
			e.t.Errorf("input %q did not equal a nil input", null)
		}
	}
	explicit := e.submit(s, work.TaskRequest{Kind: "k", Input: js("null"), IdempotencyKey: "k-null"}, at(100))
	if got := e.submit(s, work.TaskRequest{Kind: "k", IdempotencyKey: "k-null"}, at(101)); got.ID != explicit.ID {
		e.t.Error("a nil input did not equal an explicit null")
	}
	e.wantErr("null vs {}", e.submitErr(s, work.TaskRequest{Kind: "k", Input: js(`{}`), IdempotencyKey: "k-nil"}, at(101)),
		work.ErrIdempotencyConflict)

	// A nil Output is stored as null; a failure or cancellation carries no output at all.
	for _, r := range e.claim(at(200), lease, 10) {
		switch r.Task.ID {
		case nilTask.ID:
			got := e.finish(r, work.Success(nil), at(201))
			e.eqJSON("nil output", got.Outcome.Output, "null")
			e.eqJSON("read nil output", e.mustTask(s, r.Task.ID).Outcome.Output, "null")
		case explicit.ID:
			got := e.finish(r, work.Failure("no"), at(201))
			if got.Outcome.Output != nil || got.Outcome.Summary != "" {
				e.t.Errorf("failure outcome carries output %s summary %q", got.Outcome.Output, got.Outcome.Summary)
			}
		}
	}
}

func taskBuffersNotRetained(e *env) {
	const s = "session_buffers"
	in := []byte(`{"k":"vvvv"}`)
	t := e.submit(s, work.TaskRequest{Kind: "k", Input: in}, at(100))
	copy(in, `{"k":"XXXX"}`)
	e.eqJSON("input after the caller reused its buffer", e.mustTask(s, t.ID).Input, `{"k":"vvvv"}`)
	t.Input[2] = 'Z'
	e.eqJSON("input after the caller changed a snapshot", e.mustTask(s, t.ID).Input, `{"k":"vvvv"}`)

	d := e.claimOne(at(100))
	out := []byte(`{"o":"oooo"}`)
	done := e.finish(d, work.Success(out), at(101))
	copy(out, `{"o":"XXXX"}`)
	done.Outcome.Output[2] = 'Z'
	e.eqJSON("output after the caller reused its buffer", e.mustTask(s, t.ID).Outcome.Output, `{"o":"oooo"}`)

	p := []byte(`{"p":"pppp"}`)
	w := e.wake(s, work.WakeRequest{Payload: p}, at(100))
	copy(p, `{"p":"XXXX"}`)
	w.Reason.Payload[2] = 'Z'
	wd := e.claimWakeOne(at(100))
	e.eqJSON("payload after the caller reused its buffer", wd.Wake.Reason.Payload, `{"p":"pppp"}`)
}

func taskKeyNamespaces(e *env) {
	const s = "session_ns"
	t := e.submit(s, work.TaskRequest{Kind: "k", Input: js(`1`), IdempotencyKey: "shared"}, at(100))
	w := e.wake(s, work.WakeRequest{Payload: js(`2`), IdempotencyKey: "shared"}, at(100))
	if got := e.submit(s, work.TaskRequest{Kind: "k", Input: js(`1`), IdempotencyKey: "shared"}, at(101)); got.ID != t.ID {
		e.t.Error("a wake key disturbed the task key")
	}
	if got := e.wake(s, work.WakeRequest{Payload: js(`2`), IdempotencyKey: "shared"}, at(101)); got.ID != w.ID {
		e.t.Error("a task key disturbed the wake key")
	}
	// The same key in another session is another task and another wake, even with
	// a different request.
	ot := e.submit("session_ns_other", work.TaskRequest{Kind: "other", Input: js(`3`), IdempotencyKey: "shared"}, at(100))
	ow := e.wake("session_ns_other", work.WakeRequest{Payload: js(`4`), IdempotencyKey: "shared"}, at(100))
	if ot.ID == t.ID || ow.ID == w.ID {
		e.t.Error("keys are not session scoped")
	}
	if ow.SessionID != "session_ns_other" || ot.SessionID != "session_ns_other" {
		e.t.Error("records of another session carry the wrong session")
	}
}

func taskFinishUnknown(e *env) {
	e.submit("session_x", work.TaskRequest{Kind: "k"}, at(100))
	n := e.logLen()
	forged := work.NewTaskDelivery(work.Task{ID: "task_missing", SessionID: "session_x"}, 1, at(130), "forged-token")
	err := e.finishErr(forged, work.Success(nil), at(101))
	we := e.wantErr("finish of an unknown task", err, work.ErrTaskNotFound)
	if we.ID != "task_missing" {
		e.t.Errorf("not-found id %q", we.ID)
	}
	e.wantText("finish of an unknown task", err, "task not found: task_missing")
	e.nothingAppended("finish of an unknown task", n)
}

func taskFinishRepeated(e *env) {
	const s = "session_repeat"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
	d := e.claimOne(at(100))
	o := work.SuccessWithSummary("done", js(`{"a":1,"b":[1,2]}`))
	done := e.finish(d, o, at(110))
	e.eqTime("FinishedAt", done.FinishedAt, at(110))

	n := e.logLen()
	again := e.finish(d, work.SuccessWithSummary("done", js(`{ "b" : [1, 2], "a" : 1 }`)), at(200))
	e.sameTask("repeated finish", again, done)
	e.nothingAppended("a repeated finish", n)

	for what, other := range map[string]work.Outcome{
		"no summary":      work.Success(js(`{"a":1,"b":[1,2]}`)),
		"another summary": work.SuccessWithSummary("other", js(`{"a":1,"b":[1,2]}`)),
		"another output":  work.SuccessWithSummary("done", js(`{"a":1.0,"b":[1,2]}`)),
		"a failure":       work.Failure("no"),
		"a cancellation":  work.Cancellation(),
	} {
		err := e.finishErr(d, other, at(201))
		e.wantErr("finish again with "+what, err, work.ErrInvalidTransition)
		if !strings.HasPrefix(err.Error(), "invalid work transition: ") {
			e.t.Errorf("transition error text %q", err)
		}
	}
	e.nothingAppended("finishes with another outcome", n)
	e.sameTask("task after refused finishes", e.mustTask(s, t.ID), done)
	if ws := e.claimWakes(at(300), lease, 10); len(ws) != 1 {
		e.t.Errorf("%d completion wakes, want 1", len(ws))
	}

	// A nil output and an explicit null are the same outcome.
	t2 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d2 := e.claimOne(at(100))
	if d2.Task.ID != t2.ID {
		e.t.Fatalf("claimed %s, want %s", d2.Task.ID, t2.ID)
	}
	e.finish(d2, work.Success(nil), at(101))
	e.finish(d2, work.Success(js(`null`)), at(102))
	e.wantErr("null vs {}", e.finishErr(d2, work.Success(js(`{}`)), at(102)), work.ErrInvalidTransition)
}

func taskFinishIgnoresExpiry(e *env) {
	const s = "session_late"
	t := e.submit(s, work.TaskRequest{Kind: "slow", Wake: work.WakeOnCompletion}, at(100))
	d := e.claimOne(at(100))
	// The lease expired long ago, but nobody claimed the task again: the late worker wins.
	done := e.finish(d, work.Failure("late"), at(1000))
	e.eqState("late finish", done.State, work.TaskFailed)
	e.eqTime("FinishedAt", done.FinishedAt, at(1000))
	e.eqOutcome("late finish", done.Outcome, work.Failure("late"))
	e.claimNone(at(1000))
	w := e.claimWakeOne(at(1000))
	if w.Wake.Reason.TaskID != t.ID || w.Wake.Reason.State != work.TaskFailed {
		e.t.Errorf("completion wake %+v", w.Wake.Reason)
	}
}

func taskStaleFenced(e *env) {
	const s = "session_stale"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d1 := e.claimOne(at(100))
	d2 := e.claimOne(at(130))

	// The superseded attempt, a forged token on the current attempt, an attempt never
	// claimed: all stale, and none changes the task.
	cases := map[string]work.TaskDelivery{
		"the superseded attempt":   d1,
		"a forged token":           work.NewTaskDelivery(d2.Task, d2.Attempt, d2.LeaseExpiresAt, "forged-token"),
		"an empty token":           work.NewTaskDelivery(d2.Task, d2.Attempt, d2.LeaseExpiresAt, ""),
		"the old token, attempt 2": work.NewTaskDelivery(d2.Task, 2, d2.LeaseExpiresAt, d1.LeaseToken()),
		"an attempt never made":    work.NewTaskDelivery(d2.Task, 3, d2.LeaseExpiresAt, d2.LeaseToken()),
		"attempt 0":                work.NewTaskDelivery(d2.Task, 0, d2.LeaseExpiresAt, d2.LeaseToken()),
	}
	for what, d := range cases {
		err := e.finishErr(d, work.Success(nil), at(131))
		we := e.wantErr("finish by "+what, err, work.ErrStaleDelivery)
		if we.ID != t.ID {
			e.t.Errorf("finish by %s: stale id %q, want %s", what, we.ID, t.ID)
		}
	}
	cur := e.mustTask(s, t.ID)
	e.eqState("task after stale finishes", cur.State, work.TaskRunning)
	if cur.Attempts != 2 {
		e.t.Errorf("attempts %d, want 2", cur.Attempts)
	}
	done := e.finish(d2, work.Success(nil), at(132))
	// After settlement every other delivery stays stale.
	err := e.finishErr(d1, work.Success(nil), at(133))
	e.wantErr("the superseded attempt after settlement", err, work.ErrStaleDelivery)
	e.sameTask("task after a stale finish", e.mustTask(s, t.ID), done)
}

func taskCancelRunning(e *env) {
	const s = "session_coop"
	t := e.submit(s, work.TaskRequest{Kind: "long", Wake: work.WakeOnCompletion}, at(100))
	d1 := e.claimOne(at(100))
	n := e.logLen()
	c1 := e.cancel(s, t.ID, at(110))
	e.appended("a cancel of running work", n, events.TypeTaskCancelRequested)
	e.eqState("after the cancel request", c1.State, work.TaskRunning)
	e.eqTime("CancelRequestedAt", c1.CancelRequestedAt, at(110))

	n = e.logLen()
	c2 := e.cancel(s, t.ID, at(120))
	e.eqTime("CancelRequestedAt after a second request", c2.CancelRequestedAt, at(110))
	e.nothingAppended("a repeated cancel", n)
	e.claimWakeNone(at(120))

	// The lease still expires and the task is redelivered; the worker sees the request.
	e.claimNone(at(129))
	d2 := e.claimOne(at(130))
	if d2.Attempt != 2 || d2.Task.ID != t.ID {
		e.t.Fatalf("redelivered %s attempt %d", d2.Task.ID, d2.Attempt)
	}
	e.eqTime("redelivered CancelRequestedAt", d2.Task.CancelRequestedAt, at(110))
	if !d1.Task.CancelRequestedAt.IsZero() {
		e.t.Error("the first delivery's snapshot changed")
	}

	n = e.logLen()
	done := e.finish(d2, work.Cancellation(), at(131))
	e.appended("the cooperative settle", n, events.TypeTaskSettled, events.TypeWakeRecorded)
	e.eqState("after the worker stopped", done.State, work.TaskCanceled)
	e.eqTime("FinishedAt", done.FinishedAt, at(131))
	e.eqTime("CancelRequestedAt", done.CancelRequestedAt, at(110))
	if done.Attempts != 2 {
		e.t.Errorf("attempts %d, want 2", done.Attempts)
	}
	w := e.claimWakeOne(at(131))
	if w.Wake.Reason.State != work.TaskCanceled || w.Wake.Reason.TaskID != t.ID {
		e.t.Errorf("completion wake %+v", w.Wake.Reason)
	}
	e.wantErr("the superseded worker", e.finishErr(d1, work.Cancellation(), at(132)), work.ErrStaleDelivery)
}

func taskCancelTerminal(e *env) {
	const s = "session_term"
	for _, o := range []work.Outcome{work.Success(js(`1`)), work.Failure("f"), work.Cancellation()} {
		t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
		d := e.claimOne(at(100))
		done := e.finish(d, o, at(101))
		n := e.logLen()
		got := e.cancel(s, t.ID, at(102))
		e.sameTask("cancel of a "+o.State.String()+" task", got, done)
		if !got.CancelRequestedAt.IsZero() {
			e.t.Errorf("cancel of a %s task recorded a request at %v", o.State, got.CancelRequestedAt)
		}
		e.nothingAppended("a cancel of a terminal task", n)
	}
	// A task canceled while pending keeps its first cancel time.
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(200))
	first := e.cancel(s, t.ID, at(200))
	n := e.logLen()
	got := e.cancel(s, t.ID, at(300))
	e.sameTask("a second cancel", got, first)
	e.nothingAppended("a second cancel", n)
	if ws := e.claimWakes(at(300), lease, 10); len(ws) != 4 {
		e.t.Errorf("%d completion wakes, want 4 (one per task)", len(ws))
	}
}

func taskSettleOtherwiseAfterCancel(e *env) {
	const s = "session_otherwise"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d := e.claimOne(at(100))
	e.cancel(s, t.ID, at(101))
	done := e.finish(d, work.Success(js(`"finished anyway"`)), at(102))
	e.eqState("a task finished despite a cancel request", done.State, work.TaskSucceeded)
	e.eqTime("CancelRequestedAt", done.CancelRequestedAt, at(101))
}

func taskClaimOrderPending(e *env) {
	const s = "session_order"
	sub := func(kind string, runAt time.Time, now int) string {
		return e.submit(s, work.TaskRequest{Kind: kind, RunAt: runAt}, at(now)).ID
	}
	a := sub("a", at(300), 100)
	b := sub("b", time.Time{}, 100)
	c := sub("c", at(200), 100)
	d := sub("d", time.Time{}, 100) // ties with b: submission order
	f := sub("f", at(100), 100)     // an explicit schedule at the same instant ties too
	g := sub("g", at(50), 100)      // a schedule in the past is due at once, and first
	h := sub("h", time.Time{}, 90)  // submitted last, with an earlier clock
	e.claimNone(at(49))

	ids := func(ds []work.TaskDelivery) []string {
		var out []string
		for _, d := range ds {
			out = append(out, d.Task.ID)
		}
		return out
	}
	want := [][]string{{g, h}, {b, d, f}, {c}, {a}}
	got := [][]string{
		ids(e.claim(at(300), lease, 2)),
		ids(e.claim(at(300), lease, 3)),
		ids(e.claim(at(300), lease, 1)),
		ids(e.claim(at(300), lease, 10)),
	}
	names := map[string]string{a: "a", b: "b", c: "c", d: "d", f: "f", g: "g", h: "h"}
	show := func(xs [][]string) string {
		var parts []string
		for _, x := range xs {
			var ns []string
			for _, id := range x {
				ns = append(ns, names[id])
			}
			parts = append(parts, "["+strings.Join(ns, " ")+"]")
		}
		return strings.Join(parts, " ")
	}
	if show(got) != show(want) {
		e.t.Errorf("claim order %s, want %s", show(got), show(want))
	}
}

func taskClaimOrderExpired(e *env) {
	const s = "session_order_exp"
	p := e.submit(s, work.TaskRequest{Kind: "p", RunAt: at(110)}, at(100)).ID
	q := e.submit(s, work.TaskRequest{Kind: "q"}, at(100)).ID
	if ds := e.claim(at(100), 50*time.Second, 10); len(ds) != 1 || ds[0].Task.ID != q {
		e.t.Fatalf("first claim got %d deliveries", len(ds))
	}
	if ds := e.claim(at(110), 40*time.Second, 10); len(ds) != 1 || ds[0].Task.ID != p {
		e.t.Fatalf("second claim got %d deliveries", len(ds))
	}
	// p and q now both expire at 150: ties by submission order, p first.
	r := e.submit(s, work.TaskRequest{Kind: "r", RunAt: at(140)}, at(100)).ID
	x := e.submit(s, work.TaskRequest{Kind: "x"}, at(120)).ID
	if ds := e.claim(at(120), 10*time.Second, 10); len(ds) != 1 || ds[0].Task.ID != x {
		e.t.Fatalf("third claim got %d deliveries", len(ds))
	}
	// x expires at 130, r is scheduled at 140, p and q expire at 150.
	e.claimNone(at(129))
	ds := e.claim(at(200), lease, 10)
	var got []string
	for _, d := range ds {
		got = append(got, d.Task.Kind)
	}
	if strings.Join(got, " ") != "x r p q" {
		e.t.Errorf("claim order %v, want [x r p q]", got)
	}
	for _, d := range ds {
		want := uint32(2)
		if d.Task.ID == r {
			want = 1
		}
		if d.Attempt != want {
			e.t.Errorf("%s: attempt %d, want %d", d.Task.Kind, d.Attempt, want)
		}
	}
}

func taskClaimLimit(e *env) {
	for i := 0; i < 5; i++ {
		e.submit("session_limit", work.TaskRequest{Kind: "k"}, at(100))
	}
	if n := len(e.claim(at(100), lease, 3)); n != 3 {
		e.t.Errorf("claimed %d with limit 3", n)
	}
	if n := len(e.claim(at(100), lease, 3)); n != 2 {
		e.t.Errorf("claimed %d of the 2 left", n)
	}
	if n := len(e.claim(at(100), lease, 1)); n != 0 {
		e.t.Errorf("claimed %d with nothing left", n)
	}
	// Limit 1 over expired leases still claims one at a time.
	if n := len(e.claim(at(130), lease, 1)); n != 1 {
		e.t.Errorf("claimed %d expired tasks with limit 1", n)
	}
	for i := 0; i < 4; i++ {
		e.wake("session_limit", work.WakeRequest{}, at(100))
	}
	if n := len(e.claimWakes(at(100), lease, 3)); n != 3 {
		e.t.Errorf("claimed %d wakes with limit 3", n)
	}
	if n := len(e.claimWakes(at(100), lease, 3)); n != 1 {
		e.t.Errorf("claimed %d of the 1 wake left", n)
	}
}

func taskLeaseOverflow(e *env) {
	const s = "session_overflow"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	e.wake(s, work.WakeRequest{}, at(100))
	near := time.Unix(0, math.MaxInt64-1000) // the last representable instants, year 2262

	n := e.logLen()
	_, err := e.q.ClaimDueAt(e.ctx, near, time.Hour, 10)
	e.wantInvalid("a lease past the time range", err, "lease_for")
	_, err = e.q.ClaimDueAt(e.ctx, at(100), time.Duration(math.MaxInt64), 10)
	e.wantInvalid("a huge lease", err, "lease_for")
	_, err = e.q.ClaimWakesAt(e.ctx, near, time.Hour, 10)
	e.wantInvalid("a wake lease past the time range", err, "lease_for")
	_, err = e.q.ClaimWakesAt(e.ctx, at(100), time.Duration(math.MaxInt64), 10)
	e.wantInvalid("a huge wake lease", err, "lease_for")
	e.nothingAppended("claims whose lease overflows", n)
	got := e.mustTask(s, t.ID)
	e.eqState("task after an overflowing claim", got.State, work.TaskPending)
	if got.Attempts != 0 {
		e.t.Errorf("an overflowing claim counted %d attempts", got.Attempts)
	}

	// A lease that just fits is fine.
	if ds := e.claim(near, 1000*time.Nanosecond, 10); len(ds) != 1 || ds[0].Attempt != 1 {
		e.t.Errorf("a lease ending at the last instant claimed %d", len(ds))
	}
	if ds := e.claimWakes(near, 1000*time.Nanosecond, 10); len(ds) != 1 {
		e.t.Errorf("a wake lease ending at the last instant claimed %d", len(ds))
	}
}

func taskIDsAndTokens(e *env) {
	const s = "session_ids"
	seen := map[string]bool{}
	unique := func(id, prefix string) {
		e.t.Helper()
		if !strings.HasPrefix(id, prefix) || len(id) == len(prefix) {
			e.t.Errorf("id %q, want the prefix %s", id, prefix)
		}
		if seen[id] {
			e.t.Errorf("id %s used twice", id)
		}
		seen[id] = true
	}
	for i := 0; i < 20; i++ {
		t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
		unique(t.ID, "task_")
		unique(e.wake(s, work.WakeRequest{}, at(100)).ID, "wake_")
	}
	ds := e.claim(at(100), lease, 100) // claim() checks every token is fresh
	if len(ds) != 20 {
		e.t.Fatalf("claimed %d of 20", len(ds))
	}
	redo := e.claim(at(130), lease, 100)
	for i, d := range redo {
		if d.LeaseToken() == ds[i].LeaseToken() {
			e.t.Error("a redelivery kept its token")
		}
		if strings.Contains(d.LeaseToken(), d.Task.ID) {
			e.t.Error("a lease token contains its task id")
		}
		e.finish(d, work.Success(nil), at(131))
	}
	for _, w := range e.claimWakes(at(131), lease, 100) {
		if w.Wake.Reason.Kind == work.WakeTaskFinished {
			unique(w.Wake.ID, "wake_")
		}
	}
	if len(seen) != 60 {
		e.t.Errorf("%d distinct ids, want 60", len(seen))
	}
}

func taskWakeNever(e *env) {
	const s = "session_never"
	t1 := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	t2 := e.submit(s, work.TaskRequest{Kind: "k", RunAt: at(500)}, at(100))
	d := e.claimOne(at(100))
	if d.Task.ID != t1.ID {
		e.t.Fatalf("claimed %s", d.Task.ID)
	}
	e.finish(d, work.Success(nil), at(101))
	e.cancel(s, t2.ID, at(101))
	e.claimWakeNone(at(1000))
	for _, ev := range e.since(0) {
		if ev.Type() == events.TypeWakeRecorded {
			e.t.Errorf("a task whose policy is never recorded a wake: %+v", ev)
		}
	}
}

// completionWakeScenario: a task with WakeOnCompletion that ends one way records exactly
// one wake, delivered at least once: again after each lease expiry until acknowledged, then
// never again.
func completionWakeScenario(end string) func(e *env) {
	return func(e *env) {
		const s = "session_done"
		t := e.submit(s, work.TaskRequest{Kind: "k", Input: js(`{"n":1}`), RunAt: at(100), Wake: work.WakeOnCompletion}, at(100))
		var want work.Outcome
		var d work.TaskDelivery
		n := e.logLen()
		switch end {
		case "success":
			want = work.SuccessWithSummary("ok", js(`{"done":true}`))
			d = e.claimOne(at(100))
			n = e.logLen()
			e.finish(d, want, at(110))
		case "failure":
			want = work.Failure("boom")
			d = e.claimOne(at(100))
			n = e.logLen()
			e.finish(d, want, at(110))
		case "worker_cancellation":
			want = work.Cancellation()
			d = e.claimOne(at(100))
			e.cancel(s, t.ID, at(105))
			n = e.logLen()
			e.finish(d, want, at(110))
		case "cancel_while_pending":
			want = work.Cancellation()
			e.cancel(s, t.ID, at(110))
		}
		evs := e.since(n)
		if len(evs) != 2 || evs[1].Type() != events.TypeWakeRecorded {
			e.t.Fatalf("the settle appended %v, want the settle then one wake_recorded", typesOf(evs))
		}

		// Claimable at once: at its creation time, inclusive.
		ws := e.claimWakes(at(110), lease, 10)
		if len(ws) != 1 {
			e.t.Fatalf("claimed %d wakes, want exactly 1", len(ws))
		}
		w1 := ws[0]
		r := w1.Wake.Reason
		if r.Kind != work.WakeTaskFinished || r.TaskID != t.ID || r.State != want.State || w1.Attempt != 1 {
			e.t.Errorf("completion wake %+v attempt %d", r, w1.Attempt)
		}
		e.eqOutcome("completion wake", r.Outcome, want)
		e.eqTime("completion wake CreatedAt", w1.Wake.CreatedAt, at(110))
		if r.Payload != nil && string(r.Payload) != "null" {
			e.t.Errorf("completion wake payload %s", r.Payload)
		}
		if w1.Wake.SessionID != s || w1.Wake.IdempotencyKey != "" {
			e.t.Errorf("completion wake session %q key %q", w1.Wake.SessionID, w1.Wake.IdempotencyKey)
		}

		e.claimWakeNone(at(110).Add(lease - time.Nanosecond))
		w2 := e.claimWakeOne(at(110).Add(lease))
		w3 := e.claimWakeOne(at(110).Add(2 * lease))
		if w2.Wake.ID != w1.Wake.ID || w3.Wake.ID != w1.Wake.ID || w2.Attempt != 2 || w3.Attempt != 3 {
			e.t.Fatalf("redeliveries %s/%d %s/%d", w2.Wake.ID, w2.Attempt, w3.Wake.ID, w3.Attempt)
		}
		e.wantErr("ack of attempt 1", e.ack(w1, at(200)), work.ErrStaleDelivery)
		e.wantErr("ack of attempt 2", e.ack(w2, at(200)), work.ErrStaleDelivery)
		e.ok("ack of attempt 3", e.ack(w3, at(200)))
		e.claimWakeNone(at(10000))

		// Ending it again records nothing more.
		e.cancel(s, t.ID, at(300))
		if d.Task.ID != "" {
			e.finish(d, want, at(300))
		}
		e.claimWakeNone(at(10000))
		got := e.mustTask(s, t.ID)
		e.eqState("finished task", got.State, want.State)
		e.eqTime("FinishedAt", got.FinishedAt, at(110))
	}
}
