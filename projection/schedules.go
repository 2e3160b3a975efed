package projection

import (
	"maps"
	"strings"
	"time"

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
	if old != nil {
		if err := releaseLatestTick(s, old); err != nil { // From carries its cursor now
			return err
		}
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
	if err := releaseLatestTick(s, old); err != nil {
		return nil, nil, err
	}
	c := *old
	c.Cursor, c.Next = e.Tick, e.ScheduleNext
	c.Ticks++
	return old, &c, nil
}

// TickPrefix starts the idempotency key of a tick's task: schedule:<name>:<tick, RFC 3339 in
// UTC, whole seconds>. Keys with it are the queue's own (Submit refuses them), so a task with
// one is a tick.
const TickPrefix = "schedule:"

// TickKey is the idempotency key of the task of schedule name's tick (Unix nanoseconds).
func TickKey(name string, tick int64) string {
	return TickPrefix + name + ":" + time.Unix(0, tick).UTC().Format(time.RFC3339)
}

// TickOf returns the name of the schedule whose tick t is (its key TickKey(name, t.RunAt)),
// and whether t is a tick's task at all.
func TickOf(t *Task) (string, bool) {
	if !t.HasRunAt || !strings.HasPrefix(t.IdempotencyKey, TickPrefix) {
		return "", false
	}
	suffix := ":" + time.Unix(0, t.RunAt).UTC().Format(time.RFC3339)
	name, ok := strings.CutSuffix(t.IdempotencyKey[len(TickPrefix):], suffix)
	if !ok || name == "" {
		return "", false
	}
	return name, true
}

// Retention and the ticks (docs/design.md §4.6, §11). A tick's task_submitted is also the
// event that moved its schedule's cursor (Cursor, Next, Ticks): the fold of a log without it
// would have the schedule a tick back and the tick's key free. So the task of a schedule's
// latest tick — the tick that is its Cursor, submitted after its SetSeq — is held: a prune
// passes over it (PruneHeld) however long it has been prunable. Once a later tick is
// submitted, or the schedule is set again (schedule_set carries the cursor, From), it is an
// ordinary prunable task. Pruning an earlier tick of the schedule since its SetSeq counts
// Ticks down, so Ticks is the ticks since SetSeq still in the log, which is what the fold of
// the retained log counts.

// LatestTick returns the schedule t is a tick of (nil when none: not a tick, or its schedule
// is unknown), and whether t is that schedule's latest tick, the one a prune holds.
func LatestTick(r ScheduleReader, t *Task) (*Schedule, bool, error) {
	name, ok := TickOf(t)
	if !ok {
		return nil, false, nil
	}
	sc, err := r.Schedule(t.SessionID, name)
	if err != nil || sc == nil {
		return nil, false, err
	}
	return sc, t.SubmitSeq > sc.SetSeq && t.RunAt == sc.Cursor, nil
}

// PruneHeld reports whether the retention index entry e is held back from a prune now: its
// task is its schedule's latest tick (LatestTick). Every ScanPrunable passes over such
// entries, so a prune makes progress whatever it holds (at most one entry per schedule).
func PruneHeld(r Reader, e PruneEntry) (bool, error) {
	if e.Wake {
		return false, nil
	}
	t, err := r.Task(e.ID)
	if err != nil || t == nil {
		return false, err // a missing task is PruneSubject's to report
	}
	_, held, err := LatestTick(r, t)
	return held, err
}

// PruneLowerer is a PruneIndexer whose scans of the retention index start at a low mark
// above the entries they passed over (Pebble's writer: indexLows). When a held entry is
// released (its schedule's next tick, or the schedule set again), LowerPrunable lowers the
// mark to it, so the next prune meets it. Mem and PostgreSQL scan from the start.
type PruneLowerer interface {
	LowerPrunable(PruneEntry)
}

// releaseLatestTick tells a PruneLowerer that sc's latest tick (when it has one since its
// SetSeq) is no longer held: sc's next tick or a new set is being applied.
func releaseLatestTick(s State, sc *Schedule) error {
	l, ok := s.(PruneLowerer)
	if !ok || sc.Ticks == 0 {
		return nil
	}
	id, err := s.TaskKey(sc.SessionID, TickKey(sc.Name, sc.Cursor))
	if err != nil || id == "" {
		return err
	}
	t, err := s.Task(id)
	if err != nil || t == nil {
		return err
	}
	var w *Wake
	if t.CompletionWakeID != "" {
		if w, err = s.Wake(t.CompletionWakeID); err != nil {
			return err
		}
	}
	if at, ok := t.PruneAt(w); ok {
		l.LowerPrunable(PruneEntry{At: at, Seq: t.SubmitSeq, ID: t.ID})
	}
	return nil
}

// pruneTick is PruneSubject's part for a tick's task t: a latest tick is refused (the scans
// pass over it, so only a damaged index names one); an earlier tick since its schedule's
// SetSeq counts the schedule's Ticks down.
func pruneTick(s PruneState, t *Task, bad func(string, ...any) error) error {
	sc, held, err := LatestTick(s, t)
	if err != nil || sc == nil {
		return err
	}
	if held {
		return bad("the latest tick of schedule %q is held (its task_submitted holds the cursor)", sc.Name)
	}
	if t.SubmitSeq <= sc.SetSeq {
		return nil // a tick of the schedule before it was set again: not counted
	}
	if sc.Ticks == 0 {
		return bad("schedule %q counts no tick to prune", sc.Name)
	}
	c := *sc
	c.Ticks--
	return s.PutSchedule(&c)
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
