package proptest

import (
	"fmt"
	"math/rand"
	"slices"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// --- schedules (work-api-3.md, "Periodic schedules") -------------------------------------------
//
// The model keeps each session's schedules: set (a new one, or a replacement), removed, and
// listed (Session.Schedules) in name order with their kind, next tick and last tick. Their
// rule is @every 1s or 2s, so that their ticks fall inside a history (model time moves by
// up to 2 s a step), or @every 8760h, which never ticks in one. Every task claim (ClaimDue,
// ClaimKinds, SettleAndClaim with a limit) first submits the due ticks (model.submitTicks,
// restated from the spec and design §4.6): one task per tick, of the schedule's session,
// with the key schedule:<name>:<tick>, scheduled at the tick, CatchupLatest the latest tick
// at or before now, CatchupAll every one from the schedule's next, oldest first; schedules in
// the order of their next tick, then session, then name. The claim can take the new tasks.
// A removed schedule ticks no more; a set, new or replacing, ticks strictly after its now, or
// after the name's last tick when that is later (no key twice). The system binds each tick
// task's handle from the TaskSubmitted events the step appended (bindTicks), in order.
// Time zones, cron rules and MaxTicksPerClaim are the conformance suite's
// (work/worktest/schedules.go) and the crash test's (TestCrashScheduleTicks).

var scheduleNames = []string{"daily", "hourly"}

// scheduleEvery are the rules' periods: two that tick inside a history, one that never does.
var scheduleEvery = []time.Duration{time.Second, 2 * time.Second, 8760 * time.Hour}

type mSchedule struct {
	sess, name, kind, input int
	every                   int64 // the period (@every), nanoseconds
	all                     bool  // CatchupAll, else CatchupLatest
	removed                 bool
	cursor                  int64 // the last tick submitted, or the set's from
	next                    int64 // the next tick
	ticks                   int   // ticks submitted since the schedule was set (LastTick)
	// latest is the task of the last tick submitted since the schedule was set (-1: none):
	// retention holds it (model.prunableTask), since its task_submitted holds the cursor.
	latest int
}

// SetScheduleOp sets session S's schedule Name: @every scheduleEvery[Every], catch-up all or
// latest, a template of kind Kind and input Input.
type SetScheduleOp struct {
	S, Name, Kind int
	Every, Input  int
	All           bool
}

func (o SetScheduleOp) String() string {
	catchup := "latest"
	if o.All {
		catchup = "all"
	}
	return fmt.Sprintf("setSchedule %s %s @every %v catchup=%s kind=%s input=%s", sessionNames[o.S], scheduleNames[o.Name],
		scheduleEvery[o.Every], catchup, kindNames[o.Kind], showJSON(o.Input))
}
func (o SetScheduleOp) valid(m *model) bool { return o.S < m.nSess }
func (o SetScheduleOp) apply(m *model) {
	m.setSchedule(o.S, o.Name, o.Kind, o.Input, int64(scheduleEvery[o.Every]), o.All)
}

func (o SetScheduleOp) exec(s *system, r *result) {
	sc := work.Schedule{
		Name: scheduleNames[o.Name], Cron: "@every " + scheduleEvery[o.Every].String(),
		Task: work.TaskRequest{Kind: kindNames[o.Kind], Input: raw(o.Input)},
	}
	if o.All {
		sc.Catchup = work.CatchupAll
	}
	r.err = s.q().Session(sessionNames[o.S]).SetScheduleAt(s.ctx, sc, s.at())
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

// listSchedules is the session's Schedules after the op, as "name/kind/next/last tick"
// (nil on error: the check names it).
func (s *system) listSchedules(sess int) []string {
	sc, err := s.q().Session(sessionNames[sess]).Schedules(s.ctx)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	out := []string{}
	for _, x := range sc {
		out = append(out, fmt.Sprintf("%s/%s/next %s/last %s", x.Name, x.Task.Kind, showT(x.Next), showT(x.LastTick)))
	}
	return out
}

// checkSchedules compares the session's listing with the model's.
func checkSchedules(m *model, sess int, r *result) []string {
	want := []string{}
	for _, name := range []int{0, 1} { // scheduleNames is in name order
		if x := m.schedule(sess, name); x != nil && !x.removed {
			last := time.Time{}
			if x.ticks > 0 {
				last = at(x.cursor)
			}
			want = append(want, fmt.Sprintf("%s/%s/next %s/last %s", scheduleNames[name], kindNames[x.kind], showT(at(x.next)), showT(last)))
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

// tickAfter is an @every rule's first tick strictly after t: t's second, plus the period
// (robfig/cron's ConstantDelaySchedule, which work uses). Model times are whole seconds
// after t0 plus their nanoseconds, and never negative.
func tickAfter(t, every int64) int64 {
	return t - t%int64(time.Second) + every
}

// setSchedule sets or replaces the schedule: one schedule_set. Its ticks are the rule's
// strictly after now, or after the name's last tick when that is later (a replacement, or a
// schedule set again after a removal, never repeats a tick's key).
func (m *model) setSchedule(sess, name, kind, input int, every int64, all bool) {
	x := m.schedule(sess, name)
	if x == nil {
		m.schedules = append(m.schedules, mSchedule{sess: sess, name: name, cursor: m.now, latest: -1})
		x = &m.schedules[len(m.schedules)-1]
	}
	from := max(m.now, x.cursor)
	x.kind, x.input, x.every, x.all, x.removed = kind, input, every, all, false
	x.cursor, x.next, x.ticks = from, tickAfter(from, every), 0 // LastTick: since the set
	x.latest = -1                                               // the set carries the cursor: no tick is held
	m.exp.events = 1
}

// submitTicks is what a task claim does first: the tasks of the due ticks of every live
// schedule, schedule by schedule in the order of (next tick, session, name), one event each.
func (m *model) submitTicks() {
	budget := 1000 // work.MaxTicksPerClaim
	for budget > 0 {
		var due *mSchedule
		for i := range m.schedules {
			x := &m.schedules[i]
			if x.removed || x.next > m.now {
				continue
			}
			if due == nil || x.next < due.next || x.next == due.next && (x.sess < due.sess ||
				x.sess == due.sess && scheduleNames[x.name] < scheduleNames[due.name]) {
				due = x
			}
		}
		if due == nil {
			return
		}
		tick, n := due.next, budget
		if !due.all {
			tick, n = tick+(m.now-tick)/due.every*due.every, 1
		}
		for ; n > 0 && tick <= m.now; n-- {
			m.exp.newTicks = append(m.exp.newTicks, len(m.tasks))
			m.tasks = append(m.tasks, mTask{
				sess: due.sess, kind: due.kind, input: due.input, key: -1, hasRunAt: true, runAt: tick,
				created: m.now, scheduled: tick, outcome: -1, cwake: -1, sched: due.name, tick: tick, isTick: true,
			})
			m.exp.events++
			due.cursor, due.ticks, due.next = tick, due.ticks+1, tickAfter(tick, due.every)
			due.latest = len(m.tasks) - 1
			budget--
			tick = due.next
		}
	}
}

// tickKey is the idempotency key of a tick's task (work.TickKey).
func tickKey(name int, tick int64) string {
	return work.TickKey(scheduleNames[name], at(tick))
}

// bindTicks binds the tick tasks the model says this step submitted to the TaskSubmitted
// events of ticks the system appended, in order: exactly one per tick, of the schedule's
// session, name and tick, under the tick's key.
func (s *system) bindTicks(m *model, r *result) []string {
	var got []*events.TaskSubmitted
	for _, e := range r.events {
		if t, ok := e.(*events.TaskSubmitted); ok && t.Schedule != "" {
			got = append(got, t)
		}
	}
	show := func(sess, name string, tick int64) string {
		return fmt.Sprintf("%s/%s@%s", sess, name, showT(time.Unix(0, tick).UTC()))
	}
	var have, want []string
	for _, t := range got {
		have = append(have, show(t.SessionID, t.Schedule, t.Tick)+" "+t.IdempotencyKey)
	}
	for _, h := range m.exp.newTicks {
		t := m.tasks[h]
		want = append(want, show(sessionNames[t.sess], scheduleNames[t.sched], at(t.tick).UnixNano())+" "+tickKey(t.sched, t.tick))
	}
	if !slices.Equal(have, want) {
		return []string{fmt.Sprintf("[schedule] the step submitted the ticks %v, want %v", have, want)}
	}
	var fails []string
	for i, h := range m.exp.newTicks {
		if p := s.bindTask(h, got[i].TaskID, got[i].SessionID); p != "" {
			fails = append(fails, p)
		}
	}
	return fails
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
	return SetScheduleOp{S: r.Intn(m.nSess), Name: r.Intn(len(scheduleNames)), Kind: r.Intn(len(kindNames)),
		Every: pick(r, 0, 0, 1, 1, 2), Input: r.Intn(len(jsonPool)), All: r.Intn(2) == 0}
}

func genRemoveSchedule(r *rand.Rand, m *model) op {
	return RemoveScheduleOp{S: r.Intn(m.nSess), Name: r.Intn(len(scheduleNames))}
}

// classifyTicks names the tick cases of a claim (any op whose model step submitted ticks).
func classifyTicks(add func(...string), m, n *model) {
	e := n.exp
	if len(e.newTicks) == 0 {
		return
	}
	add("claim submits a tick")
	per := map[[2]int]int{}
	for _, h := range e.newTicks {
		t := n.tasks[h]
		per[[2]int{t.sess, t.sched}]++
	}
	for k, c := range per {
		x := n.schedule(k[0], k[1])
		if c > 1 {
			add("claim submits several ticks of a schedule (catch-up all)")
		}
		if old := m.schedule(k[0], k[1]); !x.all && old != nil && n.now-old.next >= 2*x.every {
			add("claim submits the latest tick only (catch-up latest)")
		}
	}
	for _, c := range e.claims {
		if n.tasks[c.h].isTick && c.attempt == 1 && slices.Contains(e.newTicks, c.h) {
			add("claim takes a tick it submitted")
			break
		}
	}
}

func classifySchedule(add func(...string), o op, m *model, e expect) {
	switch o := o.(type) {
	case SetScheduleOp:
		if x := m.schedule(o.S, o.Name); x != nil && !x.removed {
			add("set schedule replace")
		} else {
			add("set schedule new")
		}
		if x := m.schedule(o.S, o.Name); x != nil && x.ticks > 0 {
			add("set schedule after its ticks") // the cursor carries over
		}
	case RemoveScheduleOp:
		if e.err == errNotFound {
			add("remove schedule unknown")
		} else {
			add("remove schedule")
		}
	}
}
