// Package narrate says, in words, which rule of the fold an event applied to a task or a
// wake: the one explanation of a task's history that `replay task` and the console's task
// page both show. Values from the log (kinds, keys, worker names, errors) are quoted when
// they hold spaces, quotes or characters a terminal would act on (Word), so the text is
// safe to print; HTML escaping stays the page's.
package narrate

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// TextTime is how a time is printed in text: UTC, millisecond precision.
const TextTime = "2006-01-02T15:04:05.000Z"

// Time prints Unix nanoseconds as TextTime.
func Time(ns int64) string { return time.Unix(0, ns).UTC().Format(TextTime) }

func next(ns int64) string {
	if ns == 0 {
		return "none"
	}
	return Time(ns)
}

// Word is s as one word of text: quoted (strconv.Quote) when it is empty, holds white
// space, '"', '=', '\\', a character that does not print, or invalid UTF-8.
func Word(s string) string {
	if s == "" {
		return `""`
	}
	// Invalid UTF-8 is quoted too: ranging over it yields U+FFFD, which is printable, while the
	// bytes themselves would reach the terminal raw (0x9B is CSI to an 8-bit terminal).
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if unicode.IsSpace(r) || r == '"' || r == '=' || r == '\\' || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// HeaderWords is each header as key=value, sorted by key, both quoted as Word does.
func HeaderWords(h map[string]string) []string {
	if len(h) == 0 {
		return nil // most events have none: no sort of nothing through an iterator
	}
	keys := slices.Sorted(maps.Keys(h))
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = Word(k) + "=" + Word(h[k])
	}
	return out
}

// ShortWord is Word(s) with s cut to max bytes (at a character boundary): a worker's free
// text (a release reason, up to 64 KiB) stays on one readable line.
func ShortWord(s string, max int) string {
	return Word(cut(s, max))
}

// ShortJSON is a JSON value on one line, cut to max bytes. Bytes that are not JSON come
// back as a JSON string of them.
func ShortJSON(b []byte, max int) string {
	return string(AppendShortJSON(nil, b, max))
}

func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	c := max
	for c > 0 && s[c]&0xC0 == 0x80 {
		c--
	}
	return s[:c] + "…"
}

// OutcomeText is an outcome in words: its state, the summary and a short output of a
// success, the error of a failure.
func OutcomeText(o events.Outcome) string {
	s := o.State.String()
	switch o.State {
	case events.StateSucceeded:
		if o.Summary != "" {
			s += " " + Word(o.Summary)
		}
		if len(o.Output) > 0 && string(o.Output) != "null" {
			s += ", output " + ShortJSON(o.Output, 50)
		}
	case events.StateFailed:
		s += ": " + Word(o.Error)
	case events.StateCanceled:
		s += " (the worker stopped after a cancel request)"
	}
	return s
}

// WakeRejectText explains a rejected acknowledgment from the wake as it was.
func WakeRejectText(r events.RejectReason, presented, attempts uint32, acked bool) string {
	switch r {
	case events.RejectSuperseded:
		return fmt.Sprintf("superseded by delivery %d", attempts)
	case events.RejectTokenMismatch:
		return fmt.Sprintf("delivery %d is current but the lease token does not match", presented)
	case events.RejectNotClaimed:
		if acked {
			return "not claimed: the wake is already acknowledged"
		}
		return "not claimed: no delivery holds the wake"
	}
	return r.String()
}

// TaskRule says which rule of the fold an event about a task applied, from the task before
// (b: nil before its submission) and after (t); "" for a type it has no case for, which
// TestEveryTypeExplained keeps from happening.
func TaskRule(ev events.Event, b, t *projection.Task) string {
	// A reader that lacks the task before or after (its earlier events pruned) still gets
	// the rule, with zero values where the record would be.
	if b == nil {
		b = new(projection.Task)
	}
	if t == nil {
		t = new(projection.Task)
	}
	h := ev.Head()
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		var r string
		switch {
		case !e.HasRunAt:
			r = fmt.Sprintf("submit: new task of kind %s, immediate (scheduled_at = submit time %s) → pending and due", Word(e.Kind), Time(h.At))
		case e.RunAt > h.At:
			r = fmt.Sprintf("submit: new task of kind %s, run_at %s → pending, not due before then", Word(e.Kind), Time(e.RunAt))
		default:
			r = fmt.Sprintf("submit: new task of kind %s, run_at %s already passed → pending and due", Word(e.Kind), Time(e.RunAt))
		}
		if e.IdempotencyKey != "" {
			r += fmt.Sprintf("; idempotency key %s recorded for the session (a repeat returns this task)", Word(e.IdempotencyKey))
		}
		if e.WakeOnCompletion {
			r += "; wake policy on_completion"
		}
		if e.Priority != 0 {
			r += fmt.Sprintf("; priority %d (claimed before due tasks of lower priority)", e.Priority)
		}
		if len(e.Headers) > 0 {
			r += "; headers " + strings.Join(HeaderWords(e.Headers), " ")
		}
		if e.Schedule != "" {
			r += fmt.Sprintf("; the tick %s of schedule %s, submitted by the claim at %s (the schedule's next tick: %s)",
				Time(e.Tick), Word(e.Schedule), Time(h.At), next(e.ScheduleNext))
		}
		return r
	case *events.TaskClaimed:
		var r string
		if b.State == events.StatePending {
			r = fmt.Sprintf("claim: pending and due (scheduled_at %s <= now %s) → running, attempt %d, lease until %s",
				Time(b.ScheduledAt), Time(h.At), e.Attempt, Time(e.LeaseExpiresAt))
		} else {
			r = fmt.Sprintf("claim: running, but the lease of attempt %d expired at %s (<= now %s) → redelivered: running, attempt %d, lease until %s; attempt %d can no longer settle",
				b.Attempts, Time(b.LeaseExpiresAt), Time(h.At), e.Attempt, Time(e.LeaseExpiresAt), b.Attempts)
		}
		if e.Worker != "" {
			r += "; claimed by " + Word(e.Worker)
		}
		if b.CancelRequested {
			r += fmt.Sprintf("; the cancel request of %s stays recorded: the worker should settle with Cancellation", Time(b.CancelRequestedAt))
		}
		return r
	case *events.TaskCancelRequested:
		if b.State == events.StatePending {
			r := "cancel request while pending → canceled at once"
			if b.WakeOnCompletion {
				r += " (a completion wake follows: policy on_completion)"
			}
			return r
		}
		if b.CancelRequested {
			return fmt.Sprintf("cancel request while running: already recorded at %s (the first time is kept), worker must settle", Time(b.CancelRequestedAt))
		}
		return "cancel request while running: recorded, worker must settle"
	case *events.TaskSettled:
		r := fmt.Sprintf("settle by attempt %d: owns the claim (attempt and lease token match) → %s", e.Attempt, OutcomeText(e.Outcome))
		if e.Outcome.State == events.StateCanceled && !b.CancelRequested {
			r += " (cancellation without a cancel request)"
		}
		if h.At > b.LeaseExpiresAt {
			r += fmt.Sprintf("; its lease had expired at %s, but only a new claim fences a late worker", Time(b.LeaseExpiresAt))
		}
		if t.WakeOnCompletion {
			r += "; a completion wake follows (policy on_completion)"
		}
		return r
	case *events.TaskSettleRejected:
		switch e.Reason {
		case events.RejectSuperseded:
			return fmt.Sprintf("stale settlement rejected: attempt %d superseded by attempt %d; state unchanged (%s)", e.Attempt, b.Attempts, b.State)
		case events.RejectTokenMismatch:
			return fmt.Sprintf("stale settlement rejected: attempt %d is current but the lease token does not match; state unchanged (%s)", e.Attempt, b.State)
		case events.RejectNotClaimed:
			return fmt.Sprintf("stale settlement rejected: attempt %d holds no claim, the task is already %s; state unchanged", e.Attempt, b.State)
		}
		return fmt.Sprintf("stale settlement rejected (%s); state unchanged", e.Reason)
	case *events.TaskSubmitRejected:
		return fmt.Sprintf("a submission taken in from the inbox (postgres.SubmitTx) reused this task's key %s with another %s (a %s request): rejected, no task; state unchanged (%s)",
			e.IdempotencyKey, e.Field, e.Kind, b.State)
	case *events.TaskExtended:
		r := fmt.Sprintf("heartbeat by attempt %d: owns the claim → lease extended to %s (was until %s)",
			e.Attempt, Time(e.LeaseExpiresAt), Time(b.LeaseExpiresAt))
		if h.At > b.LeaseExpiresAt {
			r += fmt.Sprintf("; its lease had expired at %s, but only a new claim fences a late worker", Time(b.LeaseExpiresAt))
		}
		if b.CancelRequested {
			r += fmt.Sprintf("; a cancel was requested at %s, which the worker sees in the task this heartbeat returns", Time(b.CancelRequestedAt))
		}
		return r
	case *events.TaskReleased:
		reason := ""
		if e.Reason != "" {
			reason = " (reason " + ShortWord(e.Reason, 200) + ")"
		}
		if b.CancelRequested {
			r := fmt.Sprintf("released by attempt %d while a cancel was requested (at %s): canceled at %s, as a cancel of pending work%s",
				e.Attempt, Time(b.CancelRequestedAt), Time(h.At), reason)
			if t.WakeOnCompletion {
				r += "; a completion wake follows (policy on_completion)"
			}
			return r
		}
		when := "at once (" + Time(h.At) + ")"
		if e.RunAt > h.At {
			when = "at " + Time(e.RunAt)
		}
		return fmt.Sprintf("released by attempt %d: owns the claim → pending again %s%s, no claim; attempts stay %d, the next claim is attempt %d",
			e.Attempt, when, reason, b.Attempts, b.Attempts+1)
	case *events.TaskRetried:
		when := "at once (" + Time(h.At) + ")"
		if e.RunAt > h.At {
			when = "at " + Time(e.RunAt)
		}
		r := fmt.Sprintf("retry of a %s task by its session, after %d attempt(s) → pending again %s; outcome and finish cleared, attempts stay %d, the next claim is attempt %d (a runner's MaxAttempts counts from here)",
			b.State, e.Attempts, when, e.Attempts, e.Attempts+1)
		switch {
		case b.CompletionWakeID != "" && t.UnackedEarlierWakes > b.UnackedEarlierWakes:
			r += fmt.Sprintf("; completion wake %s is not acknowledged yet: it stays deliverable with its outcome (%s), and the task is not pruned before it is acknowledged; the next end records a new one",
				b.CompletionWakeID, b.Outcome.State)
		case b.CompletionWakeID != "":
			r += fmt.Sprintf("; completion wake %s (acknowledged) stays recorded until a prune takes it, and the next end records a new one", b.CompletionWakeID)
		}
		return r
	}
	return ""
}

// WakeRule is TaskRule for an event about a wake (b before, w after); completion says the
// wake is the completion wake of the task being explained.
func WakeRule(ev events.Event, b, w *projection.Wake, completion bool) string {
	if b == nil {
		b = new(projection.Wake)
	}
	if w == nil {
		w = new(projection.Wake)
	}
	h := ev.Head()
	// "claim: ..." for the wake being explained, "claim of completion wake W: ..." for a
	// task's completion wake.
	of := ""
	if completion {
		of = " of completion wake " + w.ID
	}
	switch e := ev.(type) {
	case *events.WakeRecorded:
		if e.Reason == events.WakeTaskFinished {
			if completion {
				return fmt.Sprintf("completion wake %s recorded (policy on_completion): the session will be woken with outcome %s; claimable at once", e.WakeID, e.Outcome.State)
			}
			return fmt.Sprintf("completion wake of task %s (outcome %s) recorded: claimable at once", e.TaskID, e.Outcome.State)
		}
		r := "wake request: new wake, claimable at once"
		if e.IdempotencyKey != "" {
			r += fmt.Sprintf("; idempotency key %s recorded for the session", Word(e.IdempotencyKey))
		}
		return r
	case *events.WakeClaimed:
		if b.Claimed() {
			return fmt.Sprintf("claim%s: the lease of delivery %d expired at %s (<= now %s) → redelivered: delivery %d, lease until %s; delivery %d can no longer acknowledge",
				of, b.Attempts, Time(b.LeaseExpiresAt), Time(h.At), e.Attempt, Time(e.LeaseExpiresAt), b.Attempts)
		}
		return fmt.Sprintf("claim%s: available (recorded %s <= now %s) → delivered, delivery %d, lease until %s",
			of, Time(b.CreatedAt), Time(h.At), e.Attempt, Time(e.LeaseExpiresAt))
	case *events.WakeAcked:
		what := ""
		if completion {
			what = " completion wake " + w.ID
		}
		return fmt.Sprintf("acknowledge%s by delivery %d: owns the claim → acknowledged, never delivered again", what, e.Attempt)
	case *events.WakeAckRejected:
		return fmt.Sprintf("stale acknowledgment%s rejected: %s; state unchanged", of, WakeRejectText(e.Reason, e.Attempt, b.Attempts, b.Acked))
	}
	return ""
}
