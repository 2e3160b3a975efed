package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/replayjson"
	"github.com/worklog/worklog/projection"
)

// step is one event of a task's history with the rule of the fold it applied.
type step struct {
	ev      events.Event
	rule    string
	refused bool
}

// foldEvents folds evs (one task's or one session's, ascending) into a fresh Mem, and
// explains each step: the same fold as the store, one subset of the log.
func foldEvents(evs []events.Event, explain bool) (*projection.Mem, []step) {
	m := projection.NewMem()
	s := &seqFree{Mem: m}
	var steps []step
	failed := false
	for _, ev := range evs {
		if failed {
			steps = append(steps, step{ev: ev, rule: "not folded: an earlier event was refused", refused: true})
			continue
		}
		taskID, wakeID := ev.Subject()
		var bt *projection.Task
		var bw *projection.Wake
		if explain {
			if taskID != "" {
				bt, _ = m.Task(taskID)
			} else {
				bw, _ = m.Wake(wakeID)
			}
		}
		s.next = ev.Head().Seq
		if e, ok := ev.(*events.TaskSubmitted); ok {
			projection.SeedTick(m, e) // its schedule's events are not the task's
		}
		if err := projection.Apply(s, ev); err != nil {
			rule := err.Error()
			var ae *projection.ApplyError
			if errors.As(err, &ae) {
				rule = ae.Rule
			}
			steps = append(steps, step{ev: ev, rule: "REFUSED by the fold: " + rule + " (the log is inconsistent here; run replay verify)", refused: true})
			failed = true
			continue
		}
		if !explain {
			continue
		}
		var rule string
		if taskID != "" {
			at, _ := m.Task(taskID)
			rule = taskRule(ev, bt, at)
		} else {
			aw, _ := m.Wake(wakeID)
			rule = wakeRule(ev, bw, aw)
		}
		steps = append(steps, step{ev: ev, rule: rule})
	}
	return m, steps
}

func fmtTime(ns int64) string  { return time.Unix(0, ns).UTC().Format("2006-01-02 15:04:05.000") }
func jsonTime(ns int64) string { return replayjson.Time(ns) }

// taskRule says which rule of the fold an event about a task applied, from the task before
// (nil before its submission) and after (replay task's explanation).
func taskRule(ev events.Event, b, t *projection.Task) string {
	h := ev.Head()
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		var r string
		switch {
		case !e.HasRunAt:
			r = "submit: new task of kind " + e.Kind + ", immediate → pending and due"
		case e.RunAt > h.At:
			r = "submit: new task of kind " + e.Kind + ", run_at " + fmtTime(e.RunAt) + " → pending, not due before then"
		default:
			r = "submit: new task of kind " + e.Kind + ", run_at " + fmtTime(e.RunAt) + " already passed → pending and due"
		}
		if e.IdempotencyKey != "" {
			r += "; idempotency key " + e.IdempotencyKey + " recorded for the session"
		}
		if e.WakeOnCompletion {
			r += "; wake policy on_completion"
		}
		return r
	case *events.TaskClaimed:
		var r string
		if b == nil || b.State == events.StatePending {
			r = fmt.Sprintf("claim: pending and due → running, attempt %d, lease until %s", e.Attempt, fmtTime(e.LeaseExpiresAt))
		} else {
			r = fmt.Sprintf("claim: the lease of attempt %d expired at %s → redelivered: running, attempt %d, lease until %s; attempt %d can no longer settle",
				b.Attempts, fmtTime(b.LeaseExpiresAt), e.Attempt, fmtTime(e.LeaseExpiresAt), b.Attempts)
		}
		if e.Worker != "" {
			r += "; claimed by " + e.Worker
		}
		return r
	case *events.TaskCancelRequested:
		if b != nil && b.State == events.StatePending {
			return "cancel request while pending → canceled at once"
		}
		if b != nil && b.CancelRequested {
			return "cancel request while running: already recorded at " + fmtTime(b.CancelRequestedAt) + " (the first time is kept), worker must settle"
		}
		return "cancel request while running: recorded, worker must settle"
	case *events.TaskSettled:
		r := fmt.Sprintf("settle by attempt %d: owns the claim (attempt and lease token match) → %s", e.Attempt, outcomeText(e.Outcome))
		if b != nil && h.At > b.LeaseExpiresAt {
			r += "; its lease had expired at " + fmtTime(b.LeaseExpiresAt) + ", but only a new claim fences a late worker"
		}
		if t != nil && t.WakeOnCompletion {
			r += "; a completion wake follows"
		}
		return r
	case *events.TaskSettleRejected:
		st := "?"
		var att uint32
		if b != nil {
			st, att = b.State.String(), b.Attempts
		}
		switch e.Reason {
		case events.RejectSuperseded:
			return fmt.Sprintf("stale settlement rejected: attempt %d superseded by attempt %d; state unchanged (%s)", e.Attempt, att, st)
		case events.RejectTokenMismatch:
			return fmt.Sprintf("stale settlement rejected: attempt %d is current but the lease token does not match; state unchanged (%s)", e.Attempt, st)
		case events.RejectNotClaimed:
			return fmt.Sprintf("stale settlement rejected: attempt %d holds no claim, the task is already %s; state unchanged", e.Attempt, st)
		}
		return fmt.Sprintf("stale settlement rejected (%s); state unchanged", e.Reason)
	case *events.TaskExtended:
		was := ""
		if b != nil {
			was = " (was until " + fmtTime(b.LeaseExpiresAt) + ")"
		}
		return fmt.Sprintf("heartbeat by attempt %d: owns the claim → lease extended to %s%s", e.Attempt, fmtTime(e.LeaseExpiresAt), was)
	case *events.TaskRetried:
		return fmt.Sprintf("retry of a %s task by its session: pending again at %s, outcome cleared; attempts stay %d (attempt numbers never repeat), the next claim is attempt %d",
			stateOr(b), fmtTime(e.RunAt), e.Attempts, e.Attempts+1)
	case *events.TaskSubmitRejected:
		return fmt.Sprintf("submission taken in from the inbox (postgres.SubmitTx) rejected: key %s names this task, and the request's %s differs (kind %s); no task, state unchanged",
			e.IdempotencyKey, e.Field, e.Kind)
	case *events.TaskReleased:
		reason := ""
		if e.Reason != "" {
			reason = " (reason " + clip(e.Reason, 200) + ")"
		}
		if b != nil && b.CancelRequested {
			return fmt.Sprintf("released by attempt %d while a cancel was requested: canceled%s", e.Attempt, reason)
		}
		when := "at once"
		if e.RunAt > h.At {
			when = "at " + fmtTime(e.RunAt)
		}
		return fmt.Sprintf("released by attempt %d: owns the claim → pending again %s%s, no claim", e.Attempt, when, reason)
	}
	if t != nil && b != nil && t.State != b.State {
		return fmt.Sprintf("%s: %s → %s", ev.Type(), b.State, t.State)
	}
	return ev.Type().String()
}

// wakeRule is taskRule for an event about a wake.
func wakeRule(ev events.Event, b, w *projection.Wake) string {
	switch e := ev.(type) {
	case *events.WakeRecorded:
		if e.Reason == events.WakeTaskFinished {
			return fmt.Sprintf("completion wake %s recorded: the session will be woken with outcome %s", e.WakeID, e.Outcome.State)
		}
		return "wake request: new wake, claimable at once"
	case *events.WakeClaimed:
		if b != nil && b.Claimed() {
			return fmt.Sprintf("claim of wake %s: the lease of delivery %d expired → redelivered: delivery %d, lease until %s", e.WakeID, b.Attempts, e.Attempt, fmtTime(e.LeaseExpiresAt))
		}
		return fmt.Sprintf("claim of wake %s: delivered, delivery %d, lease until %s", e.WakeID, e.Attempt, fmtTime(e.LeaseExpiresAt))
	case *events.WakeAcked:
		return fmt.Sprintf("acknowledge of wake %s by delivery %d → acknowledged, never delivered again", e.WakeID, e.Attempt)
	case *events.WakeAckRejected:
		return fmt.Sprintf("stale acknowledgment of wake %s rejected (%s); state unchanged", e.WakeID, e.Reason)
	}
	return ev.Type().String()
}

func stateOr(t *projection.Task) string {
	if t == nil {
		return "?"
	}
	return t.State.String()
}

func outcomeText(o events.Outcome) string {
	switch o.State {
	case events.StateSucceeded:
		if o.Summary != "" {
			return "succeeded (" + clip(o.Summary, 200) + ")"
		}
		return "succeeded"
	case events.StateFailed:
		return "failed: " + clip(o.Error, 200)
	}
	return o.State.String()
}

// redacted stands for a lease token wherever one would be shown: the console never shows one.
const redacted = events.Redacted

// taskJSON is docs/replay-json.md's task object (state --json): replay's own type.
type taskJSON = replayjson.Task

// jsonValue embeds b as a JSON value; bytes that are not JSON become a JSON string.
func jsonValue(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	if json.Valid(b) {
		return json.RawMessage(b)
	}
	s, _ := json.Marshal(string(b))
	return s
}

// taskObject is t's JSON form, its lease token redacted: the console never shows one.
func taskObject(t *projection.Task) *taskJSON {
	return replayjson.TaskOf(t, func(string) string { return redacted })
}
