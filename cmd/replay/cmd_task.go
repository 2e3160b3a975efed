package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/narrate"
	"github.com/worklog/worklog/internal/pastfold"
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

	// The events about id: its own, and for a task its completion wakes' (each run's: a
	// wake of an earlier run may be delivered and acknowledged after the task was retried,
	// and its acknowledgment counts it off the task).
	var evs []events.Event
	completion := ""                 // the last one
	completions := map[string]bool{} // all of them
	collect := func(ev events.Event) error {
		taskID, wakeID := ev.Subject()
		switch {
		case taskID == id || wakeID == id:
		case related != "" && taskID == related:
		case wakeID != "" && completions[wakeID]:
		default:
			wr, ok := ev.(*events.WakeRecorded)
			if !ok || wr.TaskID != id || wr.Reason != events.WakeTaskFinished {
				return nil
			}
			completion = wr.WakeID
			completions[completion] = true
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
	s := &pastfold.SeqFree{Mem: m}
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
		s.Next = h.Seq
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
	if r := narrate.TaskRule(ev, b, t); r != "" {
		return r, true
	}
	return ev.Type().String() + " " + unknownEventNote, false
}

// wakeRule is taskRule for an event about a wake; completion says the wake is the completion
// wake of the task being explained.
func wakeRule(ev events.Event, b, w *projection.Wake, completion bool) (rule string, ok bool) {
	if r := narrate.WakeRule(ev, b, w, completion); r != "" {
		return r, true
	}
	return ev.Type().String() + " " + unknownEventNote, false
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
