package worktest

import (
	"errors"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// scheduleScenarios: periodic schedules (shared/spec/work-api-3.md, "Periodic schedules").
func scheduleScenarios() []scenario {
	return []scenario{
		{"schedules/tick_once", scheduleTickOnce},
		{"schedules/catchup_latest", scheduleCatchupLatest},
		{"schedules/catchup_all", scheduleCatchupAll},
		{"schedules/catchup_all_bounded", scheduleCatchupAllBounded},
		{"schedules/time_zone_dst", scheduleTimeZone},
		{"schedules/leap_day", scheduleLeapDay},
		{"schedules/replace", scheduleReplace},
		{"schedules/remove", scheduleRemove},
		{"schedules/reopen", scheduleReopen},
		{"schedules/list", scheduleList},
		{"schedules/claim_kinds_and_settle", scheduleOtherClaims},
		{"schedules/validation", scheduleValidation},
		{"schedules/prune_holds_the_latest_tick", schedulePruneHoldsLatestTick},
	}
}

// hour is the schedules' lease (a day): long, so a tick's task claimed once is not claimed again
// when a later claim submits the next ticks.
const hour = 24 * time.Hour

func (e *env) setSchedule(session string, sc work.Schedule, now time.Time) {
	e.t.Helper()
	e.ok("SetScheduleAt "+sc.Name, e.session(session).SetScheduleAt(e.ctx, sc, now))
}

func every(name, d string, kind string) work.Schedule {
	return work.Schedule{Name: name, Cron: "@every " + d, Task: work.TaskRequest{Kind: kind, Input: js(`{"n":1}`)}}
}

// tickKeys are the idempotency keys of ds, in order.
func tickKeys(ds []work.TaskDelivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Task.IdempotencyKey)
	}
	return out
}

func (e *env) sameKeys(what string, got []string, want ...string) {
	e.t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		e.t.Errorf("%s: keys %q, want %q", what, got, want)
	}
}

// scheduleTickOnce: a tick becomes one task of the session at the first claim at or past
// it (one task_submitted before that claim's task_claimed, in the same command), with the
// template, scheduled at the tick, key schedule:<name>:<tick>; the same claim takes it, and
// no later claim submits it again. Ticks are strictly after the set's now.
func scheduleTickOnce(e *env) {
	const s = "session_sched"
	n := e.logLen()
	sc := every("minutely", "60s", "report")
	sc.Task.Priority, sc.Task.Headers, sc.Task.Wake = 3, map[string]string{"tenant": "acme"}, work.WakeOnCompletion
	e.setSchedule(s, sc, at(0))
	e.appended("SetSchedule", n, events.TypeScheduleSet)
	e.claimNone(at(59))
	n = e.logLen()
	ds := e.claim(at(60), hour, 5)
	e.appended("the claim at the tick", n, events.TypeTaskSubmitted, events.TypeTaskClaimed)
	e.sameKeys("the claim at the tick", tickKeys(ds), "schedule:minutely:2026-03-01T12:01:00Z")
	got := ds[0].Task
	if got.SessionID != s || got.Kind != "report" || got.Priority != 3 || got.Headers["tenant"] != "acme" {
		e.t.Errorf("the tick's task = %+v", got)
	}
	e.eqJSON("input", got.Input, `{"n":1}`)
	e.eqTime("ScheduledAt", got.ScheduledAt, at(60))
	e.eqTime("CreatedAt", got.CreatedAt, at(60))
	if byKey, err := e.session(s).TaskByKey(e.ctx, work.TickKey("minutely", at(60))); err != nil || byKey.ID != got.ID {
		e.t.Errorf("TaskByKey(TickKey) = %v, %v; want %s", byKey.ID, err, got.ID)
	}
	n = e.logLen()
	e.claimNone(at(61))
	e.nothingAppended("a claim with nothing due", n)
	ds = e.claim(at(125), hour, 5)
	e.sameKeys("the next tick", tickKeys(ds), "schedule:minutely:2026-03-01T12:02:00Z")
	e.finish(ds[0], work.Outcome{State: work.TaskSucceeded}, at(126))
}

// scheduleCatchupLatest: of the ticks that passed since the last one submitted, only the
// latest runs (the default).
func scheduleCatchupLatest(e *env) {
	const s = "session_sched_latest"
	e.setSchedule(s, every("m", "60s", "k"), at(0))
	ds := e.claim(at(250), hour, 10)
	e.sameKeys("after four ticks", tickKeys(ds), "schedule:m:2026-03-01T12:04:00Z")
	e.eqTime("ScheduledAt", ds[0].Task.ScheduledAt, at(240))
	ds = e.claim(at(300), hour, 10)
	e.sameKeys("the next", tickKeys(ds), "schedule:m:2026-03-01T12:05:00Z")
	// A cron rule: every five minutes, an hour and more later.
	e.setSchedule(s, work.Schedule{Name: "c", Cron: "*/5 * * * *", Task: work.TaskRequest{Kind: "k"}}, at(300))
	ds = e.claim(at(300+3700), hour, 10)
	e.sameKeys("a cron rule", tickKeys(ds), "schedule:c:2026-03-01T13:05:00Z", "schedule:m:2026-03-01T13:06:00Z")
}

// scheduleCatchupAll: every tick that passed runs, oldest first.
func scheduleCatchupAll(e *env) {
	const s = "session_sched_all"
	sc := every("m", "60s", "k")
	sc.Catchup = work.CatchupAll
	e.setSchedule(s, sc, at(30))
	n := e.logLen()
	ds := e.claim(at(250), hour, 10)
	e.appended("three ticks and their claims", n,
		events.TypeTaskSubmitted, events.TypeTaskSubmitted, events.TypeTaskSubmitted,
		events.TypeTaskClaimed, events.TypeTaskClaimed, events.TypeTaskClaimed)
	e.sameKeys("three ticks, oldest first", tickKeys(ds),
		"schedule:m:2026-03-01T12:01:30Z", "schedule:m:2026-03-01T12:02:30Z", "schedule:m:2026-03-01T12:03:30Z")
	e.claimNone(at(251))
}

// scheduleCatchupAllBounded: one claim submits at most work.MaxTicksPerClaim ticks; the next
// claim goes on where it stopped, none skipped.
func scheduleCatchupAllBounded(e *env) {
	const s = "session_sched_bound"
	sc := every("fast", "1s", "k")
	sc.Catchup = work.CatchupAll
	e.setSchedule(s, sc, at(0))
	_, err := e.q.ClaimDueAt(e.ctx, at(1500), hour, 1)
	e.ok("claim", err)
	st, err := e.session(s).Schedules(e.ctx)
	e.ok("Schedules", err)
	e.eqTime("LastTick after one claim", st[0].LastTick, at(work.MaxTicksPerClaim))
	_, err = e.q.ClaimDueAt(e.ctx, at(1500), hour, 1)
	e.ok("claim", err)
	st, err = e.session(s).Schedules(e.ctx)
	e.ok("Schedules", err)
	e.eqTime("LastTick after two", st[0].LastTick, at(1500))
	e.eqTime("Next", st[0].Next, at(1501))
}

// scheduleTimeZone: a cron rule is read in its time zone, across a daylight-saving change
// (America/New_York moves to EDT on 2026-03-08): 09:00 local is 14:00 UTC, then 13:00 UTC.
func scheduleTimeZone(e *env) {
	const s = "session_sched_tz"
	sc := work.Schedule{Name: "nine", Cron: "0 9 * * *", TimeZone: "America/New_York", Catchup: work.CatchupAll,
		Task: work.TaskRequest{Kind: "k"}}
	set := time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)
	e.setSchedule(s, sc, set)
	ds := e.claim(time.Date(2026, 3, 9, 13, 30, 0, 0, time.UTC), hour, 10)
	e.sameKeys("three mornings", tickKeys(ds),
		"schedule:nine:2026-03-07T14:00:00Z", "schedule:nine:2026-03-08T13:00:00Z", "schedule:nine:2026-03-09T13:00:00Z")

	// The DST rules of robfig/cron v3.0.1: a wall time the spring change skips (02:30 on
	// 2026-03-08) does not tick that day; one the fall change repeats (01:30 on 2026-11-01)
	// ticks at both instants.
	spring := sc
	spring.Name, spring.Cron = "skipped", "30 2 * * *"
	e.setSchedule(s, spring, set)
	fall := sc
	fall.Name, fall.Cron, fall.Task.Kind = "twice", "30 1 * * *", "fall"
	e.setSchedule(s, fall, time.Date(2026, 10, 31, 12, 0, 0, 0, time.UTC))
	ds = e.claim(time.Date(2026, 3, 9, 7, 0, 0, 0, time.UTC), hour, 10)
	e.sameKeys("spring forward (set after 02:30 on the 7th)", tickKeys(ds), "schedule:skipped:2026-03-09T06:30:00Z")
	e.ok("RemoveSchedule", e.session(s).RemoveScheduleAt(e.ctx, "skipped", time.Date(2026, 3, 9, 7, 0, 0, 0, time.UTC)))
	e.ok("RemoveSchedule", e.session(s).RemoveScheduleAt(e.ctx, "nine", time.Date(2026, 3, 9, 7, 0, 0, 0, time.UTC)))
	ds, err := e.q.ClaimKindsAt(e.ctx, []string{"fall"}, time.Date(2026, 11, 1, 7, 0, 0, 0, time.UTC), hour, 10)
	e.ok("ClaimKinds", err)
	e.sameKeys("fall back", tickKeys(ds), "schedule:twice:2026-11-01T05:30:00Z", "schedule:twice:2026-11-01T06:30:00Z")
}

// scheduleLeapDay: February 29th is a day that exists: the rule is accepted and ticks in the
// next leap year; set in March 2097, its next tick is in 2104 (2100 is no leap year), past
// the five years the cron library searches. A rule on a day that never exists is refused
// (scheduleValidation), as is a day-of-month no month it names has; a day-of-week saves it.
func scheduleLeapDay(e *env) {
	const s = "session_sched_leap"
	sc := work.Schedule{Name: "leap", Cron: "0 0 29 2 *", Task: work.TaskRequest{Kind: "leap"}}
	e.setSchedule(s, sc, at(0))
	st, err := e.session(s).Schedules(e.ctx)
	e.ok("Schedules", err)
	e.eqTime("Next", st[0].Next, time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC))
	ds, err := e.q.ClaimKindsAt(e.ctx, []string{"leap"}, time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), hour, 10)
	e.ok("ClaimKinds", err)
	e.sameKeys("the leap day", tickKeys(ds), "schedule:leap:2028-02-29T00:00:00Z")

	sc.Name = "leap2100"
	e.setSchedule(s, sc, time.Date(2097, 3, 1, 0, 0, 0, 0, time.UTC))
	st, err = e.session(s).Schedules(e.ctx)
	e.ok("Schedules", err)
	e.eqTime("Next from 2097", st[1].Next, time.Date(2104, 2, 29, 0, 0, 0, 0, time.UTC))

	sc.Name, sc.Cron = "fridays", "0 0 30 2 FRI" // the day fields are ORed: every Friday of February
	e.setSchedule(s, sc, at(0))
}

// scheduleReplace: SetSchedule on an existing name replaces it from now on; a tick already
// submitted is never submitted again, even when the new now is earlier.
func scheduleReplace(e *env) {
	const s = "session_sched_replace"
	e.setSchedule(s, every("r", "60s", "k"), at(0))
	e.sameKeys("first", tickKeys(e.claim(at(60), hour, 5)), "schedule:r:2026-03-01T12:01:00Z")
	e.setSchedule(s, every("r", "100s", "k2"), at(30)) // a caller's clock behind
	e.claimNone(at(159))
	ds := e.claim(at(160), hour, 5)
	e.sameKeys("from the last tick on", tickKeys(ds), "schedule:r:2026-03-01T12:02:40Z")
	if ds[0].Task.Kind != "k2" {
		e.t.Errorf("the replaced template's kind = %q", ds[0].Task.Kind)
	}
}

// scheduleRemove: a removed schedule ticks no more; removing an unknown name is
// ErrTaskNotFound and records nothing; a schedule set again under the name never repeats a
// tick.
func scheduleRemove(e *env) {
	const s = "session_sched_rm"
	e.setSchedule(s, every("x", "60s", "k"), at(0))
	e.claim(at(60), hour, 5)
	n := e.logLen()
	e.ok("RemoveScheduleAt", e.session(s).RemoveScheduleAt(e.ctx, "x", at(61)))
	e.appended("RemoveSchedule", n, events.TypeScheduleRemoved)
	e.claimNone(at(500))
	n = e.logLen()
	e.wantErr("a second remove", e.session(s).RemoveScheduleAt(e.ctx, "x", at(501)), work.ErrTaskNotFound)
	e.wantErr("an unknown name", e.session("other").RemoveScheduleAt(e.ctx, "x", at(501)), work.ErrTaskNotFound)
	e.nothingAppended("removes of nothing", n)
	if st, err := e.session(s).Schedules(e.ctx); err != nil || len(st) != 0 {
		e.t.Errorf("Schedules after the remove = %v, %v", st, err)
	}
	e.setSchedule(s, every("x", "60s", "k"), at(0)) // behind its last tick (60)
	ds := e.claim(at(125), hour, 5)
	e.sameKeys("set again", tickKeys(ds), "schedule:x:2026-03-01T12:02:00Z")
}

// scheduleReopen: the cursor is projection state: a reopened queue neither repeats nor
// loses a tick.
func scheduleReopen(e *env) {
	const s = "session_sched_reopen"
	sc := every("p", "60s", "k")
	sc.Catchup = work.CatchupAll
	e.setSchedule(s, sc, at(0))
	e.claim(at(60), hour, 5)
	e.reopen()
	e.claimNone(at(61))
	ds := e.claim(at(185), hour, 5)
	e.sameKeys("after reopen", tickKeys(ds), "schedule:p:2026-03-01T12:02:00Z", "schedule:p:2026-03-01T12:03:00Z")
}

// scheduleList: Schedules lists the session's schedules in name order, as set, with their
// next and last ticks; another session's are its own.
func scheduleList(e *env) {
	const s = "session_sched_list"
	b := every("b", "60s", "kb")
	b.TimeZone, b.Catchup = "Europe/Paris", work.CatchupAll
	b.Task.Headers = map[string]string{"h": "v"}
	e.setSchedule(s, b, at(0))
	e.setSchedule(s, every("a", "30s", "ka"), at(0))
	e.setSchedule("other", every("a", "10s", "kother"), at(0))
	e.claim(at(60), hour, 10)
	st, err := e.session(s).Schedules(e.ctx)
	e.ok("Schedules", err)
	if len(st) != 2 || st[0].Name != "a" || st[1].Name != "b" {
		e.t.Fatalf("Schedules = %+v", st)
	}
	got := st[1]
	if got.Cron != "@every 60s" || got.TimeZone != "Europe/Paris" || got.Catchup != work.CatchupAll ||
		got.Task.Kind != "kb" || got.Task.Headers["h"] != "v" {
		e.t.Errorf("schedule b = %+v", got)
	}
	e.eqJSON("template input", got.Task.Input, `{"n":1}`)
	e.eqTime("b's last tick", got.LastTick, at(60))
	e.eqTime("b's next", got.Next, at(120))
	e.eqTime("a's last tick", st[0].LastTick, at(60))
	if o, _ := e.session("other").Schedules(e.ctx); len(o) != 1 || o[0].Task.Kind != "kother" {
		e.t.Errorf("the other session's = %+v", o)
	}
}

// scheduleOtherClaims: ClaimKinds and SettleAndClaim submit the due ticks too (of every
// kind: a tick of another kind is then pending for its own claimers).
func scheduleOtherClaims(e *env) {
	const s = "session_sched_kinds"
	e.setSchedule(s, every("o", "60s", "other.kind"), at(0))
	n := e.logLen()
	ds, err := e.q.ClaimKindsAt(e.ctx, []string{"mine"}, at(60), hour, 5)
	e.ok("ClaimKinds", err)
	if len(ds) != 0 {
		e.t.Errorf("ClaimKinds of another kind claimed %d", len(ds))
	}
	e.appended("ClaimKinds at the tick", n, events.TypeTaskSubmitted)
	e.sameKeys("the other kind's claim", tickKeys(e.claim(at(61), hour, 5)), "schedule:o:2026-03-01T12:01:00Z")
	_, _, err = e.q.SettleAndClaimAt(e.ctx, nil, []string{"other.kind"}, at(120), hour, 5)
	e.ok("SettleAndClaim", err)
	if _, err := e.session(s).TaskByKey(e.ctx, "schedule:o:2026-03-01T12:02:00Z"); err != nil {
		e.t.Errorf("SettleAndClaim did not submit the tick: %v", err)
	}
}

// scheduleValidation: every bad field is ErrInvalidRequest naming it, and nothing is stored.
func scheduleValidation(e *env) {
	const s = "session_sched_bad"
	n := e.logLen()
	ok := func() work.Schedule { return every("v", "60s", "k") }
	cases := []struct {
		field string
		edit  func(*work.Schedule)
	}{
		{"name", func(sc *work.Schedule) { sc.Name = " " }},
		{"name", func(sc *work.Schedule) { sc.Name = strings.Repeat("n", 257) }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "61 * * * *" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "* * * *" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "0 * * * * *" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "@every 500ms" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "@every 1.5s" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "@every soon" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "TZ=UTC 0 9 * * *" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "0 0 30 2 *" }}, // February 30th: it would never fire
		{"cron", func(sc *work.Schedule) { sc.Cron = "0 12 30-31 2 *" }},
		{"cron", func(sc *work.Schedule) { sc.Cron = "0 0 31 2,4,6,9,11 *" }},
		{"time_zone", func(sc *work.Schedule) { sc.TimeZone = "Mars/Olympus_Mons" }},
		{"time_zone", func(sc *work.Schedule) { sc.TimeZone = "Local" }},
		{"task.idempotency_key", func(sc *work.Schedule) { sc.Task.IdempotencyKey = "k" }},
		{"task.run_at", func(sc *work.Schedule) { sc.Task.RunAt = at(5) }},
		{"task.kind", func(sc *work.Schedule) { sc.Task.Kind = "" }},
		{"task.input", func(sc *work.Schedule) { sc.Task.Input = js(`{`) }},
		{"task.priority", func(sc *work.Schedule) { sc.Task.Priority = 1001 }},
		{"catchup", func(sc *work.Schedule) { sc.Catchup = 7 }},
	}
	for _, c := range cases {
		sc := ok()
		c.edit(&sc)
		e.wantInvalid("SetSchedule "+c.field, e.session(s).SetScheduleAt(e.ctx, sc, at(0)), c.field)
	}
	e.wantInvalid("RemoveSchedule", e.session(s).RemoveScheduleAt(e.ctx, "", at(0)), "name")
	err := e.submitErr(s, work.TaskRequest{Kind: "k", IdempotencyKey: "schedule:v:2026-03-01T12:01:00Z"}, at(0))
	e.wantInvalid("a Submit with the schedules' key prefix", err, "idempotency_key")
	e.nothingAppended("refused calls", n)
	if !errors.Is(e.session(s).SetScheduleAt(e.ctx, ok(), at(0)), nil) {
		e.t.Error("the valid schedule was refused")
	}
}

// schedulePruneHoldsLatestTick: retention never takes the task of a schedule's latest tick
// (its task_submitted is the event that moved the cursor, docs/design.md §4.6); it takes the
// earlier ticks' tasks, and the latest one once a later tick is submitted or the schedule is
// set again, but not after a remove. After each prune the fold of the retained log (what
// Verify, a rebuild or an import folds) has the live cursor, next tick and tick count, so it
// would submit no tick again.
func schedulePruneHoldsLatestTick(e *env) {
	const s = "session_sched_prune"
	sc := every("p", "60s", "k")
	sc.Catchup = work.CatchupAll
	e.setSchedule(s, sc, at(0))
	settle := func(ds []work.TaskDelivery, now time.Time) {
		e.t.Helper()
		for _, d := range ds {
			e.finish(d, work.Success(js(`{"ok":true}`)), now)
		}
	}
	settle(e.claim(at(185), hour, 10), at(186)) // ticks 60, 120, 180
	e.prune(at(1000), 2, 0)                     // 60 and 120; 180 is held
	e.tickTasks("after the first prune", s, "p", []int{180}, []int{60, 120})
	e.foldedSchedule("after the first prune", s, "p", at(180), at(240), 1)
	e.claimNone(at(186)) // no tick again
	e.ok("Verify", e.q.Verify(e.ctx))

	settle(e.claim(at(245), hour, 10), at(246)) // tick 240 releases 180
	e.prune(at(1000), 1, 0)
	e.tickTasks("after the next tick", s, "p", []int{240}, []int{180})
	e.foldedSchedule("after the next tick", s, "p", at(240), at(300), 1)

	// A removed schedule keeps its latest tick; set again, the set carries the cursor. The
	// prune of a task that finished after the held one passes over it (Pebble's writer then
	// scans from above it), and the set releases it to the next prune.
	e.ok("RemoveScheduleAt", e.session(s).RemoveScheduleAt(e.ctx, "p", at(250)))
	e.done(s, work.TaskRequest{Kind: "other"}, at(260))
	e.prune(at(1000), 1, 0)
	e.tickTasks("removed", s, "p", []int{240}, nil)
	e.foldedSchedule("removed", s, "p", at(240), at(300), 1)
	e.setSchedule(s, sc, at(250))
	e.prune(at(1000), 1, 0)
	e.tickTasks("set again", s, "p", nil, []int{240})
	e.foldedSchedule("set again", s, "p", at(250), at(310), 0)
	ds := e.claim(at(315), hour, 10)
	e.sameKeys("set again", tickKeys(ds), "schedule:p:2026-03-01T12:05:10Z")
	e.ok("Verify", e.q.Verify(e.ctx))
}

// tickTasks requires the tasks of schedule name's ticks kept (found by TaskByKey) and gone.
func (e *env) tickTasks(what, session, name string, kept, gone []int) {
	e.t.Helper()
	for _, sec := range kept {
		if _, err := e.session(session).TaskByKey(e.ctx, work.TickKey(name, at(sec))); err != nil {
			e.t.Errorf("%s: the task of tick %d: %v, want it kept", what, sec, err)
		}
	}
	for _, sec := range gone {
		if _, err := e.session(session).TaskByKey(e.ctx, work.TickKey(name, at(sec))); !errors.Is(err, work.ErrTaskNotFound) {
			e.t.Errorf("%s: the task of tick %d: %v, want it pruned", what, sec, err)
		}
	}
}

// foldedSchedule folds the retained log (ReadLog, across its pruned gaps: what a rebuild or
// an import folds) and requires schedule name's cursor, next tick and tick count, and the
// live Schedules' LastTick and Next to agree with them.
func (e *env) foldedSchedule(what, session, name string, cursor, next time.Time, ticks uint64) {
	e.t.Helper()
	m := projection.NewMem()
	err := e.q.ReadLog(e.ctx, 0, func(ev events.Event) error {
		if last, _ := m.LastSeq(); ev.Head().Seq > last+1 {
			if err := m.SetLastSeq(ev.Head().Seq - 1); err != nil { // a pruned gap (Verify checks it is one)
				return err
			}
		}
		return projection.Apply(m, ev)
	})
	e.ok("folding the retained log", err)
	sc, err := m.Schedule(session, name)
	if err != nil || sc == nil {
		e.t.Fatalf("%s: the fold has no schedule %q (%v)", what, name, err)
	}
	if sc.Cursor != cursor.UnixNano() || sc.Next != next.UnixNano() || sc.Ticks != ticks {
		e.t.Errorf("%s: the fold of the retained log has cursor %v, next %v, %d ticks; want %v, %v, %d",
			what, time.Unix(0, sc.Cursor).UTC(), time.Unix(0, sc.Next).UTC(), sc.Ticks, cursor.UTC(), next.UTC(), ticks)
	}
	if ticks > 0 {
		if id, _ := m.TaskKey(session, work.TickKey(name, cursor)); id == "" {
			e.t.Errorf("%s: the fold has the latest tick's key free", what)
		}
	}
	list, err := e.session(session).Schedules(e.ctx)
	e.ok("Schedules", err)
	for _, x := range list {
		if x.Name == name && (!x.Next.Equal(next) || (ticks > 0) != !x.LastTick.IsZero() || ticks > 0 && !x.LastTick.Equal(cursor)) {
			e.t.Errorf("%s: Schedules lists next %v last tick %v; the fold: next %v, cursor %v, %d ticks", what, x.Next, x.LastTick, next, cursor, ticks)
		}
	}
}
