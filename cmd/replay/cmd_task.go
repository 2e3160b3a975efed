package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

const taskLong = `Explain why a task is in its state: its events in order, each with the rule of the fold
(projection.Apply) that it applied and what it changed. The events are folded again here,
from the task's submission on, so the explanation is computed, not guessed; an event the fold
refuses is shown as such (and replay verify would report it).

The task's completion wake, if it has one, follows the task: recorded, delivered, and
acknowledged. ID may also be a wake id: then the wake's life is explained the same way.

The task is found through the stored projection and its session's index, so this reads only
that session's events; an id the projection does not know is looked for in the whole log.`

type taskOptions struct {
	json bool
}

func (a *app) taskCommand() *cobra.Command {
	o := &taskOptions{}
	c := &cobra.Command{
		Use:   "task DIR ID",
		Short: "Why is this task in its state: its events, each with the rule it applied",
		Long:  taskLong,
		Example: `  replay task ./store task_0195f0c2a5b87c3e9d2f1a0b4c6d8e7f
  replay task ./store wake_0195f0c2a7d1... --json`,
		Args: storeArgs("ID"),
		RunE: func(c *cobra.Command, args []string) error {
			return a.runTask(c, displayName(args[0]), args[1], o)
		},
	}
	c.Flags().BoolVar(&o.json, "json", false, "print JSON (docs/replay-json.md)")
	return c
}

// step is one event of an explanation and the rule it applied.
type step struct {
	ev   events.Event
	rule string
	bad  bool // the fold refused it
}

type explanation struct {
	id      string
	isWake  bool
	session string
	steps   []step
	task    *projection.Task // the folded record, when id is a task
	wake    *projection.Wake // the folded record, when id is a wake (or the completion wake)
	stored  []string         // differences between the stored record and the fold
}

func (a *app) runTask(c *cobra.Command, dir, id string, o *taskOptions) error {
	st, err := a.openStore(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	x, err := explain(c.Context(), st, id)
	if err != nil {
		return readError(dir, err)
	}
	if x == nil {
		return fmt.Errorf("no task or wake %q in %s%s", id, dir, prunedNote(c.Context(), st))
	}
	if o.json {
		return a.writeExplanationJSON(x)
	}
	a.writeExplanation(x)
	return nil
}

// explain gathers the events about id and folds them.
func explain(ctx context.Context, st store, id string) (*explanation, error) {
	x := &explanation{id: id}
	var storedTask *projection.Task
	var storedWake *projection.Wake
	from := uint64(0)
	// A completion wake cannot be folded without its task: its task's events come along.
	related := ""
	err := st.View(ctx, func(r projection.Reader) error {
		t, err := r.Task(id)
		if err != nil || t != nil {
			storedTask = t
			return err
		}
		if storedWake, err = r.Wake(id); err != nil || storedWake == nil {
			return err
		}
		if storedWake.Reason == events.WakeTaskFinished {
			related = storedWake.TaskID
			if t, err := r.Task(related); err == nil && t != nil {
				from = t.SubmitSeq
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch {
	case storedTask != nil:
		x.session, from = storedTask.SessionID, storedTask.SubmitSeq
	case storedWake != nil:
		x.session, x.isWake = storedWake.SessionID, true
		if related == "" {
			from = storedWake.RecordSeq
		}
	}

	// The events about id: its own, and for a task its completion wake's.
	var evs []events.Event
	completion := ""
	collect := func(ev events.Event) error {
		taskID, wakeID := ev.Subject()
		switch {
		case taskID == id || wakeID == id:
		case related != "" && taskID == related:
		case completion != "" && wakeID == completion:
		default:
			wr, ok := ev.(*events.WakeRecorded)
			if !ok || wr.TaskID != id || wr.Reason != events.WakeTaskFinished {
				return nil
			}
			completion = wr.WakeID
		}
		if wakeID == id {
			x.isWake = true
		}
		if x.session == "" {
			x.session = ev.Head().SessionID
		}
		evs = append(evs, ev)
		return nil
	}
	if x.session != "" {
		err = st.SessionLog(ctx, x.session, from, collect)
	} else {
		// Not in the projection (unknown, or pruned and read from an archive): look through
		// the whole log. A completion wake's task comes before it, so find the task first.
		err = st.ReadRange(ctx, 0, 0, func(ev events.Event) error {
			if wr, ok := ev.(*events.WakeRecorded); ok && wr.WakeID == id && wr.Reason == events.WakeTaskFinished {
				related = wr.TaskID
				return errStop
			}
			return nil
		})
		if errors.Is(err, errStop) {
			err = nil
		}
		if err == nil {
			err = st.ReadRange(ctx, 0, 0, collect)
		}
	}
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 {
		return nil, nil
	}

	m := projection.NewMem()
	s := &seqFree{Mem: m}
	failed := false
	for _, ev := range evs {
		h := ev.Head()
		if failed {
			x.steps = append(x.steps, step{ev: ev, rule: "not folded: an earlier event was refused", bad: true})
			continue
		}
		taskID, wakeID := ev.Subject()
		var bt *projection.Task
		var bw *projection.Wake
		if taskID != "" {
			bt, _ = m.Task(taskID)
		} else {
			bw, _ = m.Wake(wakeID)
		}
		s.next = h.Seq
		if e, ok := ev.(*events.TaskSubmitted); ok {
			projection.SeedTick(m, e) // its schedule's events are not the task's
		}
		if err := projection.Apply(s, ev); err != nil {
			rule := err.Error()
			var ae *projection.ApplyError
			if errors.As(err, &ae) {
				rule = ae.Rule
			}
			x.steps = append(x.steps, step{ev: ev, rule: "REFUSED by the fold: " + rule + " (the log is inconsistent here; run replay verify)", bad: true})
			failed = true
			continue
		}
		var rule string
		if taskID != "" {
			at, _ := m.Task(taskID)
			rule, _ = taskRule(ev, bt, at)
		} else {
			aw, _ := m.Wake(wakeID)
			rule, _ = wakeRule(ev, bw, aw, wakeID != id)
		}
		x.steps = append(x.steps, step{ev: ev, rule: rule})
	}
	if x.isWake {
		x.wake, _ = m.Wake(id)
		if storedWake != nil && x.wake != nil && !failed {
			x.stored = projection.DiffRecords("wake "+id, storedWake, x.wake)
		}
	} else {
		x.task, _ = m.Task(id)
		if completion != "" {
			x.wake, _ = m.Wake(completion)
		}
		if storedTask != nil && x.task != nil && !failed {
			x.stored = projection.DiffRecords("task "+id, storedTask, x.task)
		}
	}
	return x, nil
}

// taskRule says which rule of the fold an event about a task applied, from the task before
// (nil before its submission) and after; ok is false for a type it has no case for.
func taskRule(ev events.Event, b, t *projection.Task) (rule string, ok bool) {
	if r := taskRuleText(ev, b, t); r != "" {
		return r, true
	}
	return ev.Type().String() + " " + unknownEventNote, false
}

// taskRuleText is taskRule's text, "" for a type it has no case for.
func taskRuleText(ev events.Event, b, t *projection.Task) string {
	h := ev.Head()
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		var r string
		switch {
		case !e.HasRunAt:
			r = fmt.Sprintf("submit: new task of kind %s, immediate (scheduled_at = submit time %s) → pending and due", word(e.Kind), fmtTime(h.At))
		case e.RunAt > h.At:
			r = fmt.Sprintf("submit: new task of kind %s, run_at %s → pending, not due before then", word(e.Kind), fmtTime(e.RunAt))
		default:
			r = fmt.Sprintf("submit: new task of kind %s, run_at %s already passed → pending and due", word(e.Kind), fmtTime(e.RunAt))
		}
		if e.IdempotencyKey != "" {
			r += fmt.Sprintf("; idempotency key %s recorded for the session (a repeat returns this task)", word(e.IdempotencyKey))
		}
		if e.WakeOnCompletion {
			r += "; wake policy on_completion"
		}
		if e.Priority != 0 {
			r += fmt.Sprintf("; priority %d (claimed before due tasks of lower priority)", e.Priority)
		}
		if len(e.Headers) > 0 {
			r += "; headers " + strings.Join(headerWords(e.Headers), " ")
		}
		if e.Schedule != "" {
			r += fmt.Sprintf("; the tick %s of schedule %s, submitted by the claim at %s (the schedule's next tick: %s)",
				fmtTime(e.Tick), word(e.Schedule), fmtTime(h.At), fmtNext(e.ScheduleNext))
		}
		return r
	case *events.TaskClaimed:
		var r string
		if b.State == events.StatePending {
			r = fmt.Sprintf("claim: pending and due (scheduled_at %s <= now %s) → running, attempt %d, lease until %s",
				fmtTime(b.ScheduledAt), fmtTime(h.At), e.Attempt, fmtTime(e.LeaseExpiresAt))
		} else {
			r = fmt.Sprintf("claim: running, but the lease of attempt %d expired at %s (<= now %s) → redelivered: running, attempt %d, lease until %s; attempt %d can no longer settle",
				b.Attempts, fmtTime(b.LeaseExpiresAt), fmtTime(h.At), e.Attempt, fmtTime(e.LeaseExpiresAt), b.Attempts)
		}
		if e.Worker != "" {
			r += "; claimed by " + word(e.Worker)
		}
		if b.CancelRequested {
			r += fmt.Sprintf("; the cancel request of %s stays recorded: the worker should settle with Cancellation", fmtTime(b.CancelRequestedAt))
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
			return fmt.Sprintf("cancel request while running: already recorded at %s (the first time is kept), worker must settle", fmtTime(b.CancelRequestedAt))
		}
		return "cancel request while running: recorded, worker must settle"
	case *events.TaskSettled:
		r := fmt.Sprintf("settle by attempt %d: owns the claim (attempt and lease token match) → %s", e.Attempt, outcomeText(e.Outcome))
		if e.Outcome.State == events.StateCanceled && !b.CancelRequested {
			r += " (cancellation without a cancel request)"
		}
		if h.At > b.LeaseExpiresAt {
			r += fmt.Sprintf("; its lease had expired at %s, but only a new claim fences a late worker", fmtTime(b.LeaseExpiresAt))
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
			e.Attempt, fmtTime(e.LeaseExpiresAt), fmtTime(b.LeaseExpiresAt))
		if h.At > b.LeaseExpiresAt {
			r += fmt.Sprintf("; its lease had expired at %s, but only a new claim fences a late worker", fmtTime(b.LeaseExpiresAt))
		}
		if b.CancelRequested {
			r += fmt.Sprintf("; a cancel was requested at %s, which the worker sees in the task this heartbeat returns", fmtTime(b.CancelRequestedAt))
		}
		return r
	case *events.TaskReleased:
		reason := ""
		if e.Reason != "" {
			reason = " (reason " + shortWord(e.Reason, 200) + ")"
		}
		if b.CancelRequested {
			r := fmt.Sprintf("released by attempt %d while a cancel was requested (at %s): canceled at %s, as a cancel of pending work%s",
				e.Attempt, fmtTime(b.CancelRequestedAt), fmtTime(h.At), reason)
			if t.WakeOnCompletion {
				r += "; a completion wake follows (policy on_completion)"
			}
			return r
		}
		when := "at once (" + fmtTime(h.At) + ")"
		if e.RunAt > h.At {
			when = "at " + fmtTime(e.RunAt)
		}
		return fmt.Sprintf("released by attempt %d: owns the claim → pending again %s%s, no claim; attempts stay %d, the next claim is attempt %d",
			e.Attempt, when, reason, b.Attempts, b.Attempts+1)
	case *events.TaskRetried:
		when := "at once (" + fmtTime(h.At) + ")"
		if e.RunAt > h.At {
			when = "at " + fmtTime(e.RunAt)
		}
		r := fmt.Sprintf("retried by an operator: %s after %d attempt(s) → pending again %s; outcome and finish cleared, attempts stay %d, the next claim is attempt %d (a runner's MaxAttempts counts from here)",
			b.State, e.Attempts, when, e.Attempts, e.Attempts+1)
		if b.CompletionWakeID != "" {
			r += fmt.Sprintf("; completion wake %s stays recorded, and the next end records a new one", b.CompletionWakeID)
		}
		return r
	}
	return ""
}

// wakeRule is taskRule for an event about a wake; completion says the wake is the completion
// wake of the task being explained.
func wakeRule(ev events.Event, b, w *projection.Wake, completion bool) (rule string, ok bool) {
	if r := wakeRuleText(ev, b, w, completion); r != "" {
		return r, true
	}
	return ev.Type().String() + " " + unknownEventNote, false
}

// wakeRuleText is wakeRule's text, "" for a type it has no case for.
func wakeRuleText(ev events.Event, b, w *projection.Wake, completion bool) string {
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
			r += fmt.Sprintf("; idempotency key %s recorded for the session", word(e.IdempotencyKey))
		}
		return r
	case *events.WakeClaimed:
		if b.Claimed() {
			return fmt.Sprintf("claim%s: the lease of delivery %d expired at %s (<= now %s) → redelivered: delivery %d, lease until %s; delivery %d can no longer acknowledge",
				of, b.Attempts, fmtTime(b.LeaseExpiresAt), fmtTime(h.At), e.Attempt, fmtTime(e.LeaseExpiresAt), b.Attempts)
		}
		return fmt.Sprintf("claim%s: available (recorded %s <= now %s) → delivered, delivery %d, lease until %s",
			of, fmtTime(b.CreatedAt), fmtTime(h.At), e.Attempt, fmtTime(e.LeaseExpiresAt))
	case *events.WakeAcked:
		what := ""
		if completion {
			what = " completion wake " + w.ID
		}
		return fmt.Sprintf("acknowledge%s by delivery %d: owns the claim → acknowledged, never delivered again", what, e.Attempt)
	case *events.WakeAckRejected:
		return fmt.Sprintf("stale acknowledgment%s rejected: %s; state unchanged", of, wakeRejectText(e.Reason, e.Attempt, b.Attempts, b.Acked))
	}
	return ""
}

func (a *app) writeExplanation(x *explanation) {
	w := a.out
	switch {
	case x.isWake && x.wake != nil:
		wk := x.wake
		fmt.Fprintf(w, "wake %s (session %s, %s) is %s after %s.\n", wk.ID, word(wk.SessionID), wk.Reason, wakeState(wk),
			plural(int(wk.Attempts), "delivery", "deliveries"))
	case x.task != nil:
		t := x.task
		if t.State == events.StateCanceled && t.Attempts == 0 {
			fmt.Fprintf(w, "task %s (kind %s, session %s) is canceled: it was canceled while pending at %s, never claimed.\n",
				t.ID, word(t.Kind), word(t.SessionID), fmtTime(t.FinishedAt))
			break
		}
		fmt.Fprintf(w, "task %s (kind %s, session %s) is %s after %s", t.ID, word(t.Kind), word(t.SessionID), t.State,
			plural(int(t.Attempts), "attempt", "attempts"))
		if t.State.Terminal() {
			fmt.Fprintf(w, ", finished %s", fmtTime(t.FinishedAt))
		}
		fmt.Fprintln(w, ".")
	default:
		fmt.Fprintf(w, "%s (session %s): its events could not be folded.\n", x.id, word(x.session))
	}
	fmt.Fprintln(w, "\nWhy, event by event:")
	seqW := 1
	for _, s := range x.steps {
		seqW = max(seqW, digits(s.ev.Head().Seq)+1)
	}
	for _, s := range x.steps {
		h := s.ev.Head()
		fmt.Fprintf(w, "\n  %*s  %s  %s\n", seqW, fmt.Sprintf("#%d", h.Seq), fmtTime(h.At), s.ev.Type())
		fmt.Fprintf(w, "  %*s  %s\n", seqW, "", s.rule)
	}
	if len(x.stored) > 0 {
		fmt.Fprintf(w, "\nThe stored projection differs from this fold (run replay verify):\n")
		for _, d := range x.stored {
			fmt.Fprintf(w, "  %s (stored vs folded)\n", d)
		}
	}
}

type stepJSON struct {
	Event   *eventJSON `json:"event"`
	Rule    string     `json:"rule"`
	Refused bool       `json:"refused,omitempty"`
}

type explanationJSON struct {
	ID          string     `json:"id"`
	Type        string     `json:"type"`
	Session     string     `json:"session"`
	Task        *taskJSON  `json:"task,omitempty"`
	Wake        *wakeJSON  `json:"wake,omitempty"`
	Steps       []stepJSON `json:"steps"`
	StoredDiffs []string   `json:"stored_differs,omitempty"`
}

func (a *app) writeExplanationJSON(x *explanation) error {
	j := explanationJSON{ID: x.id, Type: "task", Session: x.session, StoredDiffs: x.stored}
	if x.isWake {
		j.Type = "wake"
	}
	if x.task != nil {
		j.Task = a.taskJSON(x.task)
	}
	if x.wake != nil {
		j.Wake = a.wakeJSON(x.wake)
	}
	for _, s := range x.steps {
		j.Steps = append(j.Steps, stepJSON{Event: a.eventJSON(s.ev), Rule: s.rule, Refused: s.bad})
	}
	return writeJSONLine(a.out, j)
}
