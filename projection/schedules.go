package projection

import (
	"maps"

	"github.com/worklog/worklog/events"
)

// Schedule is a session's periodic schedule as the fold keeps it (schedule_set,
// schedule_removed, and the ticks' task_submitted v3). The decide code reads it to submit
// each tick exactly once: Cursor is the last tick submitted (or the set's From), Next the
// tick after it; both move only with events, so a restart neither repeats nor loses one.
type Schedule struct {
	SessionID string
	Name      string
	Cron      string
	TimeZone  string
	Catchup   uint8 // 0 latest, 1 all

	// The template of each tick's task.
	Kind             string
	Input            []byte
	Priority         int64
	Headers          map[string]string
	WakeOnCompletion bool

	SetSeq  uint64 // the seq of the schedule_set that set it
	SetAt   int64  // that event's time
	Cursor  int64  // ticks strictly after this are still to be submitted
	Next    int64  // the first of them; 0: none (the rule names no later time)
	Ticks   uint64 // ticks submitted since SetSeq
	Removed bool   // schedule_removed: no more ticks; the record stays for its cursor
}

// ScheduleEntry is an entry of the schedule index: the next tick of a live schedule.
type ScheduleEntry struct {
	At        int64 // the schedule's Next
	SessionID string
	Name      string
}

// Less orders the index: by tick, then session, then name.
func (a ScheduleEntry) Less(b ScheduleEntry) bool {
	if a.At != b.At {
		return a.At < b.At
	}
	if a.SessionID != b.SessionID {
		return a.SessionID < b.SessionID
	}
	return a.Name < b.Name
}

// Entry is s's entry in the schedule index, and whether it has one (live, with a next tick).
func (s *Schedule) Entry() (ScheduleEntry, bool) {
	return ScheduleEntry{At: s.Next, SessionID: s.SessionID, Name: s.Name}, !s.Removed && s.Next != 0
}

// ScheduleReader is the read side of the schedules, part of Reader.
type ScheduleReader interface {
	// Schedule returns a copy of the session's schedule of that name, removed ones included,
	// or nil when it was never set.
	Schedule(sessionID, name string) (*Schedule, error)
	// ScanSessionSchedules calls fn with the session's schedules (removed ones included) in
	// name order until fn returns false.
	ScanSessionSchedules(sessionID string, fn func(*Schedule) bool) error
	// ScanScheduleDue calls fn with the schedule index's entries with At <= maxAt, in
	// ScheduleEntry.Less order, until fn returns false: a claim with nothing due reads one
	// entry.
	ScanScheduleDue(maxAt int64, fn func(ScheduleEntry) bool) error
}

// ScheduleWriter is the write side of the schedules, part of State.
type ScheduleWriter interface {
	// PutSchedule stores the record (new or changed); the state takes ownership.
	PutSchedule(*Schedule) error
	PutScheduleDue(ScheduleEntry) error
	DeleteScheduleDue(ScheduleEntry) error
}

// applyScheduleSet (re)places the session's schedule: the event's rule, template, cursor
// and next tick; the index entry moves to the new next tick.
func applyScheduleSet(s State, e *events.ScheduleSet, fail failFunc) error {
	old, err := s.Schedule(e.SessionID, e.Name)
	if err != nil {
		return err
	}
	if old != nil && e.From < old.Cursor {
		return fail("schedule %q: from %d is before its last tick %d", e.Name, e.From, old.Cursor)
	}
	if e.Next != 0 && e.Next <= e.From {
		return fail("schedule %q: next %d is not after from %d", e.Name, e.Next, e.From)
	}
	sc := &Schedule{
		SessionID: e.SessionID, Name: e.Name, Cron: e.Cron, TimeZone: e.TimeZone, Catchup: e.Catchup,
		Kind: e.Kind, Input: e.Input, Priority: e.Priority, Headers: maps.Clone(e.Headers),
		WakeOnCompletion: e.WakeOnCompletion,
		SetSeq:           e.Seq, SetAt: e.At, Cursor: e.From, Next: e.Next,
	}
	return moveSchedule(s, old, sc)
}

// applyScheduleRemoved marks the schedule removed: out of the index, its cursor kept.
func applyScheduleRemoved(s State, e *events.ScheduleRemoved, fail failFunc) error {
	old, err := s.Schedule(e.SessionID, e.Name)
	if err != nil {
		return err
	}
	if old == nil || old.Removed {
		return fail("schedule %q: no such schedule", e.Name)
	}
	sc := *old
	sc.Removed = true
	return moveSchedule(s, old, &sc)
}

// tickRule checks a schedule's tick (a task_submitted v3) against the schedule: it must be
// live, and the tick its next one or a later one its rule names (CatchupLatest skips ticks;
// the decide code computed them). It returns the changed record for applyTick.
func tickRule(s State, e *events.TaskSubmitted, fail failFunc) (old, sc *Schedule, err error) {
	old, err = s.Schedule(e.SessionID, e.Schedule)
	if err != nil {
		return nil, nil, err
	}
	if old == nil || old.Removed {
		return nil, nil, fail("schedule %q: no such schedule for a tick", e.Schedule)
	}
	if old.Next == 0 || e.Tick < old.Next {
		return nil, nil, fail("schedule %q: tick %d is before its next tick %d", e.Schedule, e.Tick, old.Next)
	}
	c := *old
	c.Cursor, c.Next = e.Tick, e.ScheduleNext
	c.Ticks++
	return old, &c, nil
}

// moveSchedule stores sc and moves its index entry from old's.
func moveSchedule(s State, old, sc *Schedule) error {
	if old != nil {
		if en, ok := old.Entry(); ok {
			if err := s.DeleteScheduleDue(en); err != nil {
				return err
			}
		}
	}
	if en, ok := sc.Entry(); ok {
		if err := s.PutScheduleDue(en); err != nil {
			return err
		}
	}
	return s.PutSchedule(sc)
}

// SeedTick is for a tool that folds one task's events alone (replay task, the console's
// task page): a tick's task_submitted checks its schedule, whose events are not the task's.
// When m has no such schedule, SeedTick puts a live one whose next tick is e's, so the fold
// accepts the event as the full log's fold did; a schedule m has is left as it is.
func SeedTick(m *Mem, e *events.TaskSubmitted) {
	if e.Schedule == "" {
		return
	}
	if sc, _ := m.Schedule(e.SessionID, e.Schedule); sc != nil {
		return
	}
	sc := &Schedule{SessionID: e.SessionID, Name: e.Schedule, Kind: e.Kind, Cursor: e.Tick - 1, Next: e.Tick}
	en, _ := sc.Entry()
	_ = m.PutScheduleDue(en)
	_ = m.PutSchedule(sc)
}
