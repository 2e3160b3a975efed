package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/worklog/worklog/events"
)

// A session's story: each task's and wake's life, built from the session's events alone.
// Lease expiries are not events: a claim of a task that is still running means the previous
// lease expired first, so the story places an inferred expiry mark at that lease's end.
// A heartbeat (task_extended) moves the end of the lease it extends, so a lease draws as one
// bar however often it was extended; a release (task_released) ends the bar at its time.

type leaseEnd string

const (
	endSettled leaseEnd = "settled"  // the task was settled by this delivery
	endAcked   leaseEnd = "acked"    // the wake was acknowledged by this delivery
	endExpired leaseEnd = "expired"  // the lease ran out without a settlement
	endOpen    leaseEnd = "open"     // still leased at the end of the log
	endRelease leaseEnd = "released" // the delivery gave the task back (pending again, or canceled)
)

type leaseSpan struct {
	Attempt     uint32
	ClaimSeq    uint64
	ClaimAt     int64
	Until       int64
	EndAt       int64
	End         leaseEnd
	Redelivered bool // expired, and a later attempt claimed it
	Extensions  int  // heartbeats that moved Until
	Canceled    bool // released while a cancel was requested: the release canceled the task
}

// waitSpan is a task pending again after a release: from the release until the next claim
// (or its cancellation), due from DueAt on; Until is set once Ended.
type waitSpan struct {
	From, DueAt, Until int64
	Ended              bool
}

// markKind classifies a point of a story; the HTML page draws each kind its own way.
type markKind string

const (
	markSubmitted markKind = "submitted"
	markClaimed   markKind = "claimed"
	markExpired   markKind = "expired"
	markCancel    markKind = "cancel"
	markSettled   markKind = "settled"
	markRejected  markKind = "rejected"
	markWake      markKind = "wake"
	markAcked     markKind = "acked"
	markRecorded  markKind = "recorded"
	markExtended  markKind = "extended" // a heartbeat moved a lease's expiry
	markReleased  markKind = "released" // a delivery gave its task back
	markRetried   markKind = "retried"  // an operator retried a failed or canceled task
	markSchedule  markKind = "schedule" // a schedule was set or removed, or a tick submitted
	markUnknown   markKind = "unknown"  // an event type add has no case for (see unknownEventNote)
)

type mark struct {
	Seq   uint64 // 0: inferred, not an event (a lease expiry)
	At    int64
	Kind  markKind
	Text  string
	State events.TaskState // for settled marks: the outcome
}

type taskStory struct {
	ID               string
	Kind             string
	SubmitSeq        uint64
	SubmitAt         int64
	ScheduledAt      int64
	DueAt            int64 // when it is (or was) next due: ScheduledAt, then each release's RunAt
	HasRunAt         bool
	WakeOnCompletion bool
	Key              string
	Input            []byte
	Leases           []*leaseSpan
	Waits            []*waitSpan // pending again after each release that did not cancel it
	Marks            []mark
	State            events.TaskState
	Outcome          events.Outcome
	FinishedAt       int64
	Attempts         uint32
	CompletionWake   string
	CancelAt         int64
	CancelRequested  bool
	Rejections       int
	Redeliveries     int
	Extensions       int
	Releases         int
}

type wakeStory struct {
	ID           string
	Reason       events.WakeReason
	TaskID       string
	Outcome      events.Outcome
	Payload      []byte
	Key          string
	RecordSeq    uint64
	CreatedAt    int64
	Leases       []*leaseSpan
	Marks        []mark
	Acked        bool
	AckedAt      int64
	Attempts     uint32
	Rejections   int
	Redeliveries int
}

type sessionStory struct {
	Session string
	Tasks   []*taskStory
	Wakes   []*wakeStory
	// Schedules: the session's schedules, each with its sets, removal and ticks.
	Schedules []*scheduleStory
	FirstSeq  uint64
	LastSeq   uint64
	FirstAt   int64
	LastAt    int64
	Events    int
	// EndAt is the time of the store's last event: a lease that ended before it without a
	// settlement has expired; one that ends after it is still open.
	EndAt   int64
	tasks   map[string]*taskStory
	wakes   map[string]*wakeStory
	dayOnly bool
}

// readStory reads one session's events through the per-session index and builds its story.
func readStory(ctx context.Context, st store, session string) (*sessionStory, error) {
	s := &sessionStory{Session: session, tasks: map[string]*taskStory{}, wakes: map[string]*wakeStory{}}
	err := st.SessionLog(ctx, session, 0, func(ev events.Event) error {
		s.add(ev)
		return nil
	})
	if err != nil {
		return nil, err
	}
	last, err := st.LastSeq(ctx)
	if err != nil {
		return nil, err
	}
	s.EndAt = s.LastAt
	if last > 0 {
		ev, err := st.Event(ctx, last)
		if err != nil {
			return nil, err
		}
		s.EndAt = max(s.EndAt, ev.Head().At)
	}
	s.finish()
	return s, nil
}

// add puts an event into the story; known is false for a type it has no case for, which
// still gets a mark on its task or wake, so that the timeline shows it was there.
func (s *sessionStory) add(ev events.Event) (known bool) {
	h := ev.Head()
	if s.Events == 0 {
		s.FirstSeq, s.FirstAt, s.LastAt = h.Seq, h.At, h.At
	}
	s.Events++
	s.LastSeq = h.Seq
	s.FirstAt, s.LastAt = min(s.FirstAt, h.At), max(s.LastAt, h.At)
	ev1 := func(kind markKind, format string, args ...any) mark {
		return mark{Seq: h.Seq, At: h.At, Kind: kind, Text: fmt.Sprintf(format, args...)}
	}
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		t := &taskStory{ID: e.TaskID, Kind: e.Kind, SubmitSeq: h.Seq, SubmitAt: h.At, ScheduledAt: e.ScheduledAt(), DueAt: e.ScheduledAt(),
			HasRunAt: e.HasRunAt, WakeOnCompletion: e.WakeOnCompletion, Key: e.IdempotencyKey, Input: e.Input,
			State: events.StatePending}
		s.tasks[t.ID] = t
		s.Tasks = append(s.Tasks, t)
		text := "submitted"
		if e.HasRunAt && e.RunAt > h.At {
			text += ", scheduled for " + s.when(e.RunAt)
		} else if e.HasRunAt {
			text += ", run at " + s.when(e.RunAt) + " (already due)"
		}
		if e.IdempotencyKey != "" {
			text += ", key " + word(e.IdempotencyKey)
		}
		if e.WakeOnCompletion {
			text += ", wake on completion"
		}
		text += ", input " + shortJSON(e.Input, 80)
		if e.Schedule != "" {
			text += fmt.Sprintf(", the tick %s of schedule %s", s.when(e.Tick), word(e.Schedule))
			sc := s.schedule(e.Schedule)
			sc.Marks = append(sc.Marks, ev1(markSchedule, "tick %s submitted as task %s; next tick %s", s.when(e.Tick), e.TaskID, nextText(s, e.ScheduleNext)))
		}
		t.Marks = append(t.Marks, ev1(markSubmitted, "%s", text))
	case *events.TaskClaimed:
		t := s.task(e.TaskID)
		redelivery := s.expire(&t.Leases, &t.Marks, "attempt", "a settlement: due again")
		if redelivery {
			t.Redeliveries++
		}
		t.endWait(h.At)
		t.Leases = append(t.Leases, &leaseSpan{Attempt: e.Attempt, ClaimSeq: h.Seq, ClaimAt: h.At, Until: e.LeaseExpiresAt, End: endOpen})
		t.State, t.Attempts = events.StateRunning, e.Attempt
		what := ""
		if redelivery {
			what = " (redelivery)"
		}
		what += claimedBy(e.Worker)
		t.Marks = append(t.Marks, ev1(markClaimed, "attempt %d claimed%s, lease until %s (%s)", e.Attempt, what,
			s.when(e.LeaseExpiresAt), fmtDuration(time.Duration(e.LeaseExpiresAt-h.At))))
	case *events.TaskSettled:
		t := s.task(e.TaskID)
		if l := current(t.Leases); l != nil && l.Attempt == e.Attempt {
			l.End, l.EndAt = endSettled, h.At
		}
		t.State, t.Outcome, t.FinishedAt = e.Outcome.State, e.Outcome, h.At
		m := ev1(markSettled, "settled by attempt %d: %s", e.Attempt, outcomeText(e.Outcome))
		m.State = e.Outcome.State
		t.Marks = append(t.Marks, m)
	case *events.TaskCancelRequested:
		t := s.task(e.TaskID)
		if !t.CancelRequested {
			t.CancelRequested, t.CancelAt = true, h.At
		}
		if t.State == events.StatePending {
			t.endWait(h.At)
			t.State, t.FinishedAt, t.Outcome = events.StateCanceled, h.At, events.Outcome{State: events.StateCanceled}
			m := ev1(markCancel, "cancel requested while pending: canceled at once")
			m.State = events.StateCanceled
			t.Marks = append(t.Marks, m)
		} else {
			t.Marks = append(t.Marks, ev1(markCancel, "cancel requested while running: recorded, the worker must settle"))
		}
	case *events.TaskSettleRejected:
		t := s.task(e.TaskID)
		t.Rejections++
		t.Marks = append(t.Marks, ev1(markRejected, "stale settlement by attempt %d rejected: %s", e.Attempt,
			rejectText(e.Reason, e.Attempt, t.Attempts, t.State)))
	case *events.TaskSubmitRejected:
		t := s.task(e.TaskID)
		t.Marks = append(t.Marks, ev1(markRejected, "a submission committed in an application transaction reused key %s of a %s request with another %s: rejected, no task",
			e.IdempotencyKey, e.Kind, e.Field))
	case *events.TaskExtended:
		t := s.task(e.TaskID)
		t.Extensions++
		text := fmt.Sprintf("heartbeat by attempt %d: lease extended to %s (%s)", e.Attempt, s.when(e.LeaseExpiresAt),
			fmtDuration(time.Duration(e.LeaseExpiresAt-h.At)))
		// The lease it extends keeps its bar, which now ends at the new expiry.
		if l := current(t.Leases); l != nil && l.Attempt == e.Attempt && l.End == endOpen {
			text += ", was until " + s.when(l.Until)
			l.Until = e.LeaseExpiresAt
			l.Extensions++
		}
		t.Marks = append(t.Marks, ev1(markExtended, "%s", text))
	case *events.TaskReleased:
		t := s.task(e.TaskID)
		t.Releases++
		l := current(t.Leases)
		if l != nil && (l.Attempt != e.Attempt || l.End != endOpen) {
			l = nil
		}
		if l != nil {
			l.End, l.EndAt = endRelease, h.At
		}
		var m mark
		if t.CancelRequested {
			// The fold settles it as a cancel of pending work would.
			if l != nil {
				l.Canceled = true
			}
			t.State, t.FinishedAt, t.Outcome = events.StateCanceled, h.At, events.Outcome{State: events.StateCanceled}
			m = ev1(markReleased, "released by attempt %d while a cancel was requested: canceled", e.Attempt)
			m.State = events.StateCanceled
		} else {
			t.State, t.DueAt = events.StatePending, e.RunAt
			t.Waits = append(t.Waits, &waitSpan{From: h.At, DueAt: e.RunAt})
			when := "at once"
			if e.RunAt > h.At {
				when = fmt.Sprintf("at %s (in %s)", s.when(e.RunAt), fmtDuration(time.Duration(e.RunAt-h.At)))
			}
			m = ev1(markReleased, "released by attempt %d: pending again %s", e.Attempt, when)
		}
		if e.Reason != "" {
			m.Text += ", reason " + shortWord(e.Reason, 80)
		}
		t.Marks = append(t.Marks, m)
	case *events.TaskRetried:
		t := s.task(e.TaskID)
		was := t.State
		t.State, t.DueAt, t.Outcome, t.FinishedAt = events.StatePending, e.RunAt, events.Outcome{}, 0
		t.CancelRequested, t.CancelAt, t.CompletionWake = false, 0, ""
		t.Waits = append(t.Waits, &waitSpan{From: h.At, DueAt: e.RunAt})
		when := "at once"
		if e.RunAt > h.At {
			when = fmt.Sprintf("at %s (in %s)", s.when(e.RunAt), fmtDuration(time.Duration(e.RunAt-h.At)))
		}
		t.Marks = append(t.Marks, ev1(markRetried, "retried after %d attempt(s) (was %s): pending again %s; the next claim is attempt %d",
			e.Attempts, was, when, e.Attempts+1))
	case *events.KindPolicySet:
		// A kind's event: no session's task or wake, so no mark (replay log shows it).
	case *events.WakeRecorded:
		w := &wakeStory{ID: e.WakeID, Reason: e.Reason, TaskID: e.TaskID, Outcome: e.Outcome, Payload: e.Payload,
			Key: e.IdempotencyKey, RecordSeq: h.Seq, CreatedAt: h.At}
		s.wakes[w.ID] = w
		s.Wakes = append(s.Wakes, w)
		if e.Reason == events.WakeTaskFinished {
			t := s.task(e.TaskID)
			t.CompletionWake = e.WakeID
			t.Marks = append(t.Marks, ev1(markWake, "completion wake %s recorded", e.WakeID))
			w.Marks = append(w.Marks, ev1(markRecorded, "recorded: task %s (%s) %s", e.TaskID, word(t.Kind), e.Outcome.State))
		} else {
			text := "recorded on request"
			if e.IdempotencyKey != "" {
				text += ", key " + word(e.IdempotencyKey)
			}
			w.Marks = append(w.Marks, ev1(markRecorded, "%s, payload %s", text, shortJSON(e.Payload, 80)))
		}
	case *events.WakeClaimed:
		w := s.wake(e.WakeID)
		redelivery := s.expire(&w.Leases, &w.Marks, "delivery", "an acknowledgment: claimable again")
		if redelivery {
			w.Redeliveries++
		}
		w.Leases = append(w.Leases, &leaseSpan{Attempt: e.Attempt, ClaimSeq: h.Seq, ClaimAt: h.At, Until: e.LeaseExpiresAt, End: endOpen})
		w.Attempts = e.Attempt
		what := ""
		if redelivery {
			what = " (redelivery)"
		}
		what += claimedBy(e.Worker)
		w.Marks = append(w.Marks, ev1(markClaimed, "delivery %d claimed%s, lease until %s (%s)", e.Attempt, what,
			s.when(e.LeaseExpiresAt), fmtDuration(time.Duration(e.LeaseExpiresAt-h.At))))
	case *events.WakeAcked:
		w := s.wake(e.WakeID)
		if l := current(w.Leases); l != nil && l.Attempt == e.Attempt {
			l.End, l.EndAt = endAcked, h.At
		}
		w.Acked, w.AckedAt = true, h.At
		w.Marks = append(w.Marks, ev1(markAcked, "acknowledged by delivery %d", e.Attempt))
	case *events.WakeAckRejected:
		w := s.wake(e.WakeID)
		w.Rejections++
		w.Marks = append(w.Marks, ev1(markRejected, "stale acknowledgment by delivery %d rejected: %s", e.Attempt,
			wakeRejectText(e.Reason, e.Attempt, w.Attempts, w.Acked)))
	case *events.ScheduleSet:
		sc := s.schedule(e.Name)
		sc.Removed = false
		zone := ""
		if e.TimeZone != "" {
			zone = " in " + word(e.TimeZone)
		}
		sc.Marks = append(sc.Marks, ev1(markSchedule, "set: %s%s, catch-up %s, task of kind %s; ticks after %s, the first %s",
			word(e.Cron), zone, catchupName(e.Catchup), word(e.Kind), s.when(e.From), nextText(s, e.Next)))
	case *events.ScheduleRemoved:
		sc := s.schedule(e.Name)
		sc.Removed = true
		sc.Marks = append(sc.Marks, ev1(markSchedule, "removed: no more ticks"))
	default:
		m := ev1(markUnknown, "%s %s", ev.Type(), unknownEventNote)
		if taskID, wakeID := ev.Subject(); taskID != "" {
			t := s.task(taskID)
			t.Marks = append(t.Marks, m)
		} else {
			w := s.wake(wakeID)
			w.Marks = append(w.Marks, m)
		}
		return false
	}
	return true
}

// task returns the story of a task, making a placeholder for a task whose submission is not
// in the session (a damaged store): the story still shows what happened.
func (s *sessionStory) task(id string) *taskStory {
	t, ok := s.tasks[id]
	if !ok {
		t = &taskStory{ID: id, Kind: "?", State: events.StatePending}
		s.tasks[id] = t
		s.Tasks = append(s.Tasks, t)
	}
	return t
}

// scheduleStory is one schedule of the session: its sets, its removal and its ticks.
type scheduleStory struct {
	Name    string
	Removed bool
	Marks   []mark
}

func (s *sessionStory) schedule(name string) *scheduleStory {
	for _, x := range s.Schedules {
		if x.Name == name {
			return x
		}
	}
	x := &scheduleStory{Name: name}
	s.Schedules = append(s.Schedules, x)
	return x
}

func nextText(s *sessionStory, next int64) string {
	if next == 0 {
		return "none"
	}
	return s.when(next)
}

func (s *sessionStory) wake(id string) *wakeStory {
	w, ok := s.wakes[id]
	if !ok {
		w = &wakeStory{ID: id}
		s.wakes[id] = w
		s.Wakes = append(s.Wakes, w)
	}
	return w
}

// endWait ends the wait of a task pending again after a release (a claim or a cancellation).
func (t *taskStory) endWait(at int64) {
	if n := len(t.Waits); n > 0 && !t.Waits[n-1].Ended {
		t.Waits[n-1].Until, t.Waits[n-1].Ended = at, true
	}
}

func current(ls []*leaseSpan) *leaseSpan {
	if len(ls) == 0 {
		return nil
	}
	return ls[len(ls)-1]
}

// expire closes the open lease before a new claim: it can only have expired. It reports
// whether there was one (the new claim is a redelivery).
func (s *sessionStory) expire(ls *[]*leaseSpan, marks *[]mark, noun, after string) bool {
	l := current(*ls)
	if l == nil || l.End != endOpen {
		return false
	}
	l.End, l.EndAt, l.Redelivered = endExpired, l.Until, true
	*marks = append(*marks, mark{At: l.Until, Kind: markExpired,
		Text: fmt.Sprintf("lease of %s %d expired without %s", noun, l.Attempt, after)})
	return true
}

// finish closes the leases still open at the end of the log, and orders every story's marks
// by time (an inferred expiry sits between the events around it).
func (s *sessionStory) finish() {
	for _, t := range s.Tasks {
		if l := current(t.Leases); l != nil && l.End == endOpen {
			l.EndAt = l.Until
			if l.Until <= s.EndAt {
				l.End = endExpired
				t.Marks = append(t.Marks, mark{At: l.Until, Kind: markExpired,
					Text: fmt.Sprintf("lease of attempt %d expired without a settlement: due for redelivery (not claimed again yet)", l.Attempt)})
			}
		}
		sortMarks(t.Marks)
	}
	for _, w := range s.Wakes {
		if l := current(w.Leases); l != nil && l.End == endOpen {
			l.EndAt = l.Until
			if l.Until <= s.EndAt {
				l.End = endExpired
				w.Marks = append(w.Marks, mark{At: l.Until, Kind: markExpired,
					Text: fmt.Sprintf("lease of delivery %d expired without an acknowledgment: claimable again (not claimed yet)", l.Attempt)})
			}
		}
		sortMarks(w.Marks)
	}
	s.dayOnly = sameDay(s.FirstAt, max(s.EndAt, s.lastLeaseEnd()))
}

func (s *sessionStory) lastLeaseEnd() int64 {
	end := s.LastAt
	for _, t := range s.Tasks {
		for _, l := range t.Leases {
			end = max(end, l.EndAt)
		}
	}
	for _, w := range s.Wakes {
		for _, l := range w.Leases {
			end = max(end, l.EndAt)
		}
	}
	return end
}

func sortMarks(ms []mark) {
	slices.SortStableFunc(ms, func(a, b mark) int {
		if c := cmp.Compare(a.At, b.At); c != 0 {
			return c
		}
		// At the same time, an inferred expiry (seq 0) comes before the claim that follows it.
		return cmp.Compare(a.Seq, b.Seq)
	})
}

func sameDay(a, b int64) bool {
	ya, ma, da := time.Unix(0, a).UTC().Date()
	yb, mb, db := time.Unix(0, b).UTC().Date()
	return ya == yb && ma == mb && da == db
}

// when formats a time inside a mark's text: the clock alone (the time column and the header
// carry the date).
func (s *sessionStory) when(ns int64) string { return clock(ns) }

// rejectText explains a rejected settlement from the task as it was.
func rejectText(r events.RejectReason, presented, attempts uint32, state events.TaskState) string {
	switch r {
	case events.RejectSuperseded:
		return fmt.Sprintf("superseded by attempt %d", attempts)
	case events.RejectTokenMismatch:
		return fmt.Sprintf("attempt %d is current but the lease token does not match", presented)
	case events.RejectNotClaimed:
		return fmt.Sprintf("not claimed: the task is already %s", state)
	}
	return r.String()
}

// claimedBy names the worker of a claim in a mark ("" for a claim written before workers were
// recorded), quoted like every user string.
func claimedBy(worker string) string {
	if worker == "" {
		return ""
	}
	return " by " + word(worker)
}
