package worktest

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/worklog/worklog/work"
)

// validationScenarios: invalid values fail at the facade with ErrInvalidRequest naming the
// right field, in the seed's order (session_id first), and before touching storage.
func validationScenarios() []scenario {
	return []scenario{
		{"validation/session_id", validSessionID},
		{"validation/task_id", validTaskID},
		{"validation/wake_id", validWakeID},
		{"validation/submit_fields", validSubmitFields},
		{"validation/wake_fields", validWakeFields},
		{"validation/claim_values", validClaimValues},
		{"validation/outcome", validOutcome},
		{"validation/times_out_of_range", validTimes},
	}
}

// blanks are all-whitespace strings: blank, as the seed's trim().is_empty().
var blanks = []string{"", " ", "   ", "\t\n\r ", "\u00a0", "\u3000", "\u2028"}

// invalidJSON are texts that are not one valid JSON value.
var invalidJSON = []string{"", "{", `{"a":}`, "nul", "1 2", "{'a':1}", `"unterminated`, "[1,]", "\xff"}

// oversized is a valid JSON string one byte over max.
func oversized(max int) json.RawMessage {
	return json.RawMessage(`"` + strings.Repeat("x", max-1) + `"`)
}

// exactly is a valid JSON string of exactly max bytes.
func exactly(max int) json.RawMessage {
	return json.RawMessage(`"` + strings.Repeat("x", max-2) + `"`)
}

func validSessionID(e *env) {
	n := e.logLen()
	for _, id := range blanks {
		sess := e.session(id)
		if sess.ID() != id {
			e.t.Errorf("Session(%q).ID() = %q", id, sess.ID())
		}
		// session_id is checked first, whatever else is wrong.
		_, err := sess.SubmitAt(e.ctx, work.TaskRequest{Kind: " ", IdempotencyKey: " ", Input: js("{")}, at(100))
		e.wantInvalid("SubmitAt", err, "session_id")
		_, err = sess.Submit(e.ctx, work.TaskRequest{Kind: "k"})
		e.wantInvalid("Submit", err, "session_id")
		_, _, err = sess.Task(e.ctx, " ")
		e.wantInvalid("Task", err, "session_id")
		_, err = sess.CancelAt(e.ctx, " ", at(100))
		e.wantInvalid("CancelAt", err, "session_id")
		_, err = sess.Cancel(e.ctx, "task_x")
		e.wantInvalid("Cancel", err, "session_id")
		_, err = sess.WakeAt(e.ctx, work.WakeRequest{IdempotencyKey: " ", Payload: js("{")}, at(100))
		e.wantInvalid("WakeAt", err, "session_id")
		_, err = sess.Wake(e.ctx, work.WakeRequest{})
		e.wantInvalid("Wake", err, "session_id")
	}
	e.wantText("blank session", func() error {
		_, err := e.session("").SubmitAt(e.ctx, work.TaskRequest{Kind: "k"}, at(100))
		return err
	}(), "invalid work request field session_id: must not be blank")
	e.nothingAppended("requests with a blank session", n)
}

func validTaskID(e *env) {
	e.submit("session_v", work.TaskRequest{Kind: "k"}, at(100))
	n := e.logLen()
	sess := e.session("session_v")
	for _, id := range blanks {
		_, _, err := sess.Task(e.ctx, id)
		e.wantInvalid("Task", err, "task_id")
		_, err = sess.CancelAt(e.ctx, id, at(100))
		e.wantInvalid("CancelAt", err, "task_id")
		e.wantText("CancelAt", err, "invalid work request field task_id: must not be blank")
		_, err = sess.Cancel(e.ctx, id)
		e.wantInvalid("Cancel", err, "task_id")
		// A delivery without a task id cannot be settled.
		_, err = e.q.FinishAt(e.ctx, work.NewTaskDelivery(work.Task{ID: id}, 1, at(130), "token"), work.Failure("x"), at(100))
		e.wantInvalid("FinishAt", err, "task_id")
	}
	_, err := e.q.FinishAt(e.ctx, work.TaskDelivery{}, work.Outcome{State: work.TaskRunning}, at(100))
	e.wantInvalid("FinishAt of a zero delivery with a bad outcome", err, "task_id")
	_, err = e.q.Finish(e.ctx, work.TaskDelivery{}, work.Success(nil))
	e.wantInvalid("Finish of a zero delivery", err, "task_id")
	e.nothingAppended("requests with a blank task id", n)
}

// validWakeID: a wake delivery without a wake id (a zero WakeDelivery, or a blank id) cannot
// be acknowledged: ErrInvalidRequest naming wake_id, as Finish names task_id, not
// ErrStaleDelivery of a blank id.
func validWakeID(e *env) {
	e.wake("session_v", work.WakeRequest{}, at(100))
	e.claimWakeOne(at(100))
	n := e.logLen()
	for _, id := range blanks {
		err := e.q.AckWakeAt(e.ctx, work.NewWakeDelivery(work.Wake{ID: id}, 1, at(130), "token"), at(101))
		e.wantInvalid("AckWakeAt", err, "wake_id")
	}
	err := e.q.AckWakeAt(e.ctx, work.WakeDelivery{}, at(101))
	e.wantInvalid("AckWakeAt of a zero delivery", err, "wake_id")
	e.wantText("AckWakeAt of a zero delivery", err, "invalid work request field wake_id: must not be blank")
	e.wantInvalid("AckWake of a zero delivery", e.q.AckWake(e.ctx, work.WakeDelivery{}), "wake_id")
	e.nothingAppended("acknowledgments without a wake id", n)
}

func validSubmitFields(e *env) {
	sess := e.session("session_v")
	n := e.logLen()
	submit := func(r work.TaskRequest) error {
		t, err := sess.SubmitAt(e.ctx, r, at(100))
		if err == nil {
			e.t.Fatalf("SubmitAt(%+v) succeeded with %s", r, t.ID)
		}
		e.zeroOnError("SubmitAt", t)
		return err
	}
	for _, b := range blanks {
		e.wantInvalid("blank kind", submit(work.TaskRequest{Kind: b}), "kind")
		// kind before idempotency_key before input
		e.wantInvalid("blank kind and key", submit(work.TaskRequest{Kind: b, IdempotencyKey: " ", Input: js("{")}), "kind")
		if b != "" { // "" means no key
			e.wantInvalid("blank key", submit(work.TaskRequest{Kind: "k", IdempotencyKey: b}), "idempotency_key")
			e.wantInvalid("blank key and bad input", submit(work.TaskRequest{Kind: "k", IdempotencyKey: b, Input: js("{")}), "idempotency_key")
		}
	}
	e.wantText("blank key", submit(work.TaskRequest{Kind: "k", IdempotencyKey: "  "}),
		"invalid work request field idempotency_key: must not be blank")
	for _, bad := range invalidJSON {
		e.wantInvalid("input "+bad, submit(work.TaskRequest{Kind: "k", Input: js(bad)}), "input")
	}
	e.wantInvalid("oversized input", submit(work.TaskRequest{Kind: "k", Input: oversized(e.h.MaxValueBytes)}), "input")
	_, err := sess.Submit(e.ctx, work.TaskRequest{Kind: "k", Input: js("{")})
	e.wantInvalid("Submit with bad input", err, "input")
	e.nothingAppended("invalid submissions", n)

	// The bound is inclusive, and padded or keyed values are fine.
	big := e.submit("session_v", work.TaskRequest{Kind: "k", Input: exactly(e.h.MaxValueBytes)}, at(100))
	if len(big.Input) != e.h.MaxValueBytes {
		e.t.Errorf("input of exactly the limit came back with %d bytes", len(big.Input))
	}
	e.submit("session_v", work.TaskRequest{Kind: " padded kind ", IdempotencyKey: " padded key "}, at(100))
}

func validWakeFields(e *env) {
	sess := e.session("session_v")
	n := e.logLen()
	wake := func(r work.WakeRequest) error {
		w, err := sess.WakeAt(e.ctx, r, at(100))
		if err == nil {
			e.t.Fatalf("WakeAt(%+v) succeeded with %s", r, w.ID)
		}
		e.zeroOnError("WakeAt", w)
		return err
	}
	for _, b := range blanks[1:] {
		e.wantInvalid("blank key", wake(work.WakeRequest{IdempotencyKey: b}), "idempotency_key")
		e.wantInvalid("blank key and bad payload", wake(work.WakeRequest{IdempotencyKey: b, Payload: js("{")}), "idempotency_key")
	}
	for _, bad := range invalidJSON {
		e.wantInvalid("payload "+bad, wake(work.WakeRequest{Payload: js(bad)}), "payload")
	}
	e.wantInvalid("oversized payload", wake(work.WakeRequest{Payload: oversized(e.h.MaxValueBytes)}), "payload")
	_, err := sess.Wake(e.ctx, work.WakeRequest{Payload: js("[")})
	e.wantInvalid("Wake with a bad payload", err, "payload")
	e.nothingAppended("invalid wakes", n)
}

func validClaimValues(e *env) {
	e.submit("session_v", work.TaskRequest{Kind: "k"}, at(100))
	e.wake("session_v", work.WakeRequest{}, at(100))
	n := e.logLen()
	type claimFn func(leaseFor time.Duration, limit int) error
	claims := map[string]claimFn{
		"ClaimDueAt": func(l time.Duration, n int) error {
			ds, err := e.q.ClaimDueAt(e.ctx, at(100), l, n)
			if len(ds) != 0 {
				e.t.Errorf("a failed claim returned %d deliveries", len(ds))
			}
			return err
		},
		"ClaimDue": func(l time.Duration, n int) error { _, err := e.q.ClaimDue(e.ctx, l, n); return err },
		"ClaimWakesAt": func(l time.Duration, n int) error {
			ds, err := e.q.ClaimWakesAt(e.ctx, at(100), l, n)
			if len(ds) != 0 {
				e.t.Errorf("a failed wake claim returned %d deliveries", len(ds))
			}
			return err
		},
		"ClaimWakes": func(l time.Duration, n int) error { _, err := e.q.ClaimWakes(e.ctx, l, n); return err },
	}
	for name, claim := range claims {
		for _, l := range []time.Duration{0, -1, -time.Hour} {
			e.wantInvalid(name+" lease", claim(l, 1), "lease_for")
			e.wantInvalid(name+" lease and limit", claim(l, 0), "lease_for")
		}
		for _, limit := range []int{0, -1} {
			err := claim(time.Second, limit)
			e.wantInvalid(name+" limit", err, "limit")
			e.wantText(name+" limit", err, "invalid work request field limit: must be positive")
		}
	}
	e.nothingAppended("invalid claims", n)
	// The smallest valid values work.
	if ds := e.claim(at(100), time.Nanosecond, 1); len(ds) != 1 {
		e.t.Errorf("a 1ns lease claimed %d", len(ds))
	}
	if ds := e.claimWakes(at(100), time.Nanosecond, 1); len(ds) != 1 {
		e.t.Errorf("a 1ns wake lease claimed %d", len(ds))
	}
}

func validOutcome(e *env) {
	const s = "session_outcome"
	t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
	d := e.claimOne(at(100))
	n := e.logLen()
	cases := []struct {
		what  string
		o     work.Outcome
		field string
	}{
		{"state pending", work.Outcome{State: work.TaskPending}, "outcome"},
		{"state running", work.Outcome{State: work.TaskRunning}, "outcome"},
		{"an unknown state", work.Outcome{State: work.TaskState(99)}, "outcome"},
		{"a negative state", work.Outcome{State: work.TaskState(-1)}, "outcome"},
		{"the zero outcome", work.Outcome{}, "outcome"},
		{"a success with an error", work.Outcome{State: work.TaskSucceeded, Error: "e"}, "outcome"},
		{"a failure with output", work.Outcome{State: work.TaskFailed, Error: "e", Output: js(`1`)}, "outcome"},
		{"a failure with empty output", work.Outcome{State: work.TaskFailed, Output: js(``)}, "outcome"},
		{"a failure with a summary", work.Outcome{State: work.TaskFailed, Error: "e", Summary: "s"}, "outcome"},
		{"a cancellation with a summary", work.Outcome{State: work.TaskCanceled, Summary: "s"}, "outcome"},
		{"a cancellation with output", work.Outcome{State: work.TaskCanceled, Output: js(`null`)}, "outcome"},
		{"a cancellation with an error", work.Outcome{State: work.TaskCanceled, Error: "e"}, "outcome"},
		{"a success with an error and bad output", work.Outcome{State: work.TaskSucceeded, Error: "e", Output: js("{")}, "outcome"},
		{"oversized output", work.Success(oversized(e.h.MaxValueBytes)), "output"},
	}
	for _, bad := range invalidJSON {
		cases = append(cases, struct {
			what  string
			o     work.Outcome
			field string
		}{"output " + bad, work.SuccessWithSummary("s", js(bad)), "output"})
	}
	for _, c := range cases {
		_, err := e.q.FinishAt(e.ctx, d, c.o, at(101))
		e.wantInvalid(c.what, err, c.field)
	}
	e.nothingAppended("finishes with invalid outcomes", n)
	e.eqState("task after invalid outcomes", e.mustTask(s, t.ID).State, work.TaskRunning)
	e.claimWakeNone(at(101))

	// The delivery still owns its claim: a valid outcome settles it, and the bound is
	// inclusive.
	done := e.finish(d, work.Success(exactly(e.h.MaxValueBytes)), at(102))
	if len(done.Outcome.Output) != e.h.MaxValueBytes {
		e.t.Errorf("output of exactly the limit came back with %d bytes", len(done.Outcome.Output))
	}
}

func validTimes(e *env) {
	const s = "session_times"
	t := e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d := e.claimOne(at(100))
	w := e.wake(s, work.WakeRequest{}, at(100))
	n := e.logLen()
	far := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	early := time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, bad := range []time.Time{far, early} {
		e.wantInvalid("RunAt out of range", e.submitErr(s, work.TaskRequest{Kind: "k", RunAt: bad}, at(100)), "run_at")
		e.wantInvalid("submit time out of range", e.submitErr(s, work.TaskRequest{Kind: "k"}, bad), "now")
		_, err := e.session(s).CancelAt(e.ctx, t.ID, bad)
		e.wantInvalid("cancel time out of range", err, "now")
		_, err = e.q.ClaimDueAt(e.ctx, bad, lease, 1)
		e.wantInvalid("claim time out of range", err, "now")
		e.wantInvalid("finish time out of range", e.finishErr(d, work.Success(nil), bad), "now")
		e.wantInvalid("wake time out of range", e.wakeErr(s, work.WakeRequest{}, bad), "now")
		_, err = e.q.ClaimWakesAt(e.ctx, bad, lease, 1)
		e.wantInvalid("wake claim time out of range", err, "now")
	}
	e.wantInvalid("the zero time", e.submitErr(s, work.TaskRequest{Kind: "k"}, time.Time{}), "now")
	e.nothingAppended("calls with times out of range", n)
	e.finish(d, work.Success(nil), at(101))
	if wd := e.claimWakeOne(at(101)); wd.Wake.ID != w.ID {
		e.t.Errorf("claimed wake %s, want %s", wd.Wake.ID, w.ID)
	}
}
