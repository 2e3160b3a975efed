package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/narrate"
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

// fmtDuration is how every page of the console writes a duration: in the two largest human
// units, each cut down (not rounded up) to a whole number: "850 ms", "4.2 s", "3 min 12 s",
// "5 h 7 min", "2 days 3 h", "274 days". Below 10 s a tenth of a second is kept; from 10
// days on, only days. The JSON twins keep the machine values.
func fmtDuration(d time.Duration) string {
	if d < 0 {
		return "-" + fmtDuration(-d)
	}
	const day = 24 * time.Hour
	two := func(a int64, ua string, b int64, ub string) string {
		if b == 0 {
			return fmt.Sprintf("%d %s", a, ua)
		}
		return fmt.Sprintf("%d %s %d %s", a, ua, b, ub)
	}
	days := func(n int64) string {
		if n == 1 {
			return "day"
		}
		return "days"
	}
	switch {
	case d == 0:
		return "0 ms"
	case d < time.Millisecond:
		return "< 1 ms"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d/time.Millisecond)
	case d < 10*time.Second:
		t := int64(d / (100 * time.Millisecond))
		if t%10 == 0 {
			return fmt.Sprintf("%d s", t/10)
		}
		return fmt.Sprintf("%d.%d s", t/10, t%10)
	case d < time.Minute:
		return fmt.Sprintf("%d s", d/time.Second)
	case d < time.Hour:
		return two(int64(d/time.Minute), "min", int64(d%time.Minute/time.Second), "s")
	case d < day:
		return two(int64(d/time.Hour), "h", int64(d%time.Hour/time.Minute), "min")
	case d < 10*day:
		n := int64(d / day)
		return two(n, days(n), int64(d%day/time.Hour), "h")
	}
	n := int64(d / day)
	return fmt.Sprintf("%d %s", n, days(n))
}

// taskRule says which rule of the fold an event about a task applied, from the task before
// (nil before its submission) and after: narrate's text, the one `replay task` shows.
func taskRule(ev events.Event, b, t *projection.Task) string {
	if r := narrate.TaskRule(ev, b, t); r != "" {
		return r
	}
	if t != nil && b != nil && t.State != b.State {
		return fmt.Sprintf("%s: %s → %s", ev.Type(), b.State, t.State)
	}
	return ev.Type().String()
}

// wakeRule is taskRule for an event about a wake.
func wakeRule(ev events.Event, b, w *projection.Wake) string {
	if r := narrate.WakeRule(ev, b, w, false); r != "" {
		return r
	}
	return ev.Type().String()
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
