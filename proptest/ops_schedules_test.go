package proptest

import (
	"fmt"
	"math/rand"
	"slices"

	"github.com/worklog/worklog/work"
)

// --- schedules (work-api-3.md, "Periodic schedules") -------------------------------------------
//
// The model keeps each session's schedules: set (a new one, or a replacement), removed, and
// listed (Session.Schedules) in name order with their kind. Their rule is @every 8760h, so
// no tick falls inside a history (model time moves by seconds): the ticks, their exactly-once
// submission and the catch-up rules are the conformance suite's (work/worktest/schedules.go)
// and the crash test's (TestCrashScheduleTicks), not this model's.

var scheduleNames = []string{"daily", "hourly"}

// scheduleRule ticks once a year: never inside a history.
const scheduleRule = "@every 8760h"

type mSchedule struct {
	sess, name, kind int
	removed          bool
}

// SetScheduleOp sets session S's schedule Name with a template of kind Kind.
type SetScheduleOp struct{ S, Name, Kind int }

func (o SetScheduleOp) String() string {
	return fmt.Sprintf("setSchedule %s %s kind=%s", sessionNames[o.S], scheduleNames[o.Name], kindNames[o.Kind])
}
func (o SetScheduleOp) valid(m *model) bool { return o.S < m.nSess }
func (o SetScheduleOp) apply(m *model)      { m.setSchedule(o.S, o.Name, o.Kind) }

func (o SetScheduleOp) exec(s *system, r *result) {
	r.err = s.q().Session(sessionNames[o.S]).SetScheduleAt(s.ctx, work.Schedule{
		Name: scheduleNames[o.Name], Cron: scheduleRule, Task: work.TaskRequest{Kind: kindNames[o.Kind]},
	}, s.at())
	r.schedules = s.listSchedules(o.S)
}

func (o SetScheduleOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] setSchedule failed: %v", r.err)}
	}
	return checkSchedules(m, o.S, r)
}

// RemoveScheduleOp removes session S's schedule Name.
type RemoveScheduleOp struct{ S, Name int }

func (o RemoveScheduleOp) String() string {
	return fmt.Sprintf("removeSchedule %s %s", sessionNames[o.S], scheduleNames[o.Name])
}
func (o RemoveScheduleOp) valid(m *model) bool { return o.S < m.nSess }
func (o RemoveScheduleOp) apply(m *model)      { m.removeSchedule(o.S, o.Name) }

func (o RemoveScheduleOp) exec(s *system, r *result) {
	r.id = scheduleNames[o.Name] // what a not-found error names
	r.err = s.q().Session(sessionNames[o.S]).RemoveScheduleAt(s.ctx, scheduleNames[o.Name], s.at())
	r.schedules = s.listSchedules(o.S)
}

func (o RemoveScheduleOp) check(m *model, r *result) []string {
	if m.exp.err == errNotFound {
		return append(checkErr(r, errNotFound, "model", m.exp), checkSchedules(m, o.S, r)...)
	}
	if r.err != nil {
		return []string{fmt.Sprintf("[model] removeSchedule failed: %v", r.err)}
	}
	return checkSchedules(m, o.S, r)
}

// listSchedules is the session's Schedules after the op, as "name/kind" (nil on error: the
// check names it).
func (s *system) listSchedules(sess int) []string {
	sc, err := s.q().Session(sessionNames[sess]).Schedules(s.ctx)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	out := []string{}
	for _, x := range sc {
		out = append(out, x.Name+"/"+x.Task.Kind)
	}
	return out
}

// checkSchedules compares the session's listing with the model's.
func checkSchedules(m *model, sess int, r *result) []string {
	want := []string{}
	for _, name := range []int{0, 1} { // scheduleNames is in name order
		if x := m.schedule(sess, name); x != nil && !x.removed {
			want = append(want, scheduleNames[name]+"/"+kindNames[x.kind])
		}
	}
	if !slices.Equal(r.schedules, want) {
		return []string{fmt.Sprintf("[schedules] session %s lists %v, want %v", sessionNames[sess], r.schedules, want)}
	}
	return nil
}

func (m *model) schedule(sess, name int) *mSchedule {
	for i := range m.schedules {
		if x := &m.schedules[i]; x.sess == sess && x.name == name {
			return x
		}
	}
	return nil
}

// setSchedule sets or replaces the schedule: one schedule_set.
func (m *model) setSchedule(sess, name, kind int) {
	if x := m.schedule(sess, name); x != nil {
		x.kind, x.removed = kind, false
	} else {
		m.schedules = append(m.schedules, mSchedule{sess: sess, name: name, kind: kind})
	}
	m.exp.events = 1
}

// removeSchedule removes a live schedule (one schedule_removed); none is ErrTaskNotFound.
func (m *model) removeSchedule(sess, name int) {
	x := m.schedule(sess, name)
	if x == nil || x.removed {
		m.exp.err = errNotFound
		return
	}
	x.removed = true
	m.exp.events = 1
}

func genSetSchedule(r *rand.Rand, m *model) op {
	return SetScheduleOp{S: r.Intn(m.nSess), Name: r.Intn(len(scheduleNames)), Kind: r.Intn(len(kindNames))}
}

func genRemoveSchedule(r *rand.Rand, m *model) op {
	return RemoveScheduleOp{S: r.Intn(m.nSess), Name: r.Intn(len(scheduleNames))}
}

func classifySchedule(add func(...string), o op, m *model, e expect) {
	switch o := o.(type) {
	case SetScheduleOp:
		if x := m.schedule(o.S, o.Name); x != nil && !x.removed {
			add("set schedule replace")
		} else {
			add("set schedule new")
		}
	case RemoveScheduleOp:
		if e.err == errNotFound {
			add("remove schedule unknown")
		} else {
			add("remove schedule")
		}
	}
}
