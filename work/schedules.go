package work

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
)

// Schedule is a periodic schedule of a session (Session.SetSchedule): each tick of its rule
// becomes one task of the session, submitted by the queue itself at the first claim whose
// now is at or past the tick.
//
// A rule that names no day that exists ("0 0 30 2 *", February 30th) is refused
// (ErrInvalidRequest naming "cron"); February 29th ("0 0 29 2 *") ticks in leap years.
//
// Daylight saving: Cron is read as wall time in TimeZone. A wall time the spring change
// skips does not tick that day (in America/New_York, "30 2 * * *" has no tick on the day
// clocks go from 02:00 to 03:00); a wall time the fall change repeats ticks twice, at both
// instants (a "30 1 * * *" tick at 01:30 EDT and another at 01:30 EST). Each tick is its own
// task, with its own key (TickKey, in UTC). @every rules and UTC are not affected.
type Schedule struct {
	Name     string      // unique in the session; 1–256 bytes
	Cron     string      // 5-field cron ("*/5 * * * *") or "@every <duration>" (>= 1s, whole seconds); @hourly, @daily... too
	TimeZone string      // IANA name for Cron; "" is UTC
	Task     TaskRequest // the template of each run (IdempotencyKey and RunAt must be empty)
	Catchup  Catchup     // what happens to ticks that passed while nothing claimed

	// Read only (Schedules fills them; SetSchedule ignores them).
	Next     time.Time // the next tick still to be submitted; zero: none
	LastTick time.Time // the last tick submitted since the schedule was set; zero: none yet
}

// Catchup says which of the ticks that passed since the last one submitted a claim submits.
type Catchup int

const (
	CatchupLatest Catchup = iota // of the ticks since the last one submitted, run only the latest (default)
	// CatchupAll runs every one of them, oldest first. A claim submits at most 1,000 ticks
	// (MaxTicksPerClaim, over all schedules); the ones after wait for the next claim, none is
	// skipped.
	CatchupAll
)

// MaxTicksPerClaim bounds the ticks one claim submits, over every schedule due: a claim after
// a long pause stays bounded; the next claims go on where it stopped.
const MaxTicksPerClaim = 1000

// schedulePrefix starts the idempotency key of a tick's task: schedule:<name>:<tick, RFC 3339
// in UTC>. Keys with this prefix are the queue's own: a Submit may not use one.
const schedulePrefix = projection.TickPrefix

// TickKey is the idempotency key of the task of the schedule name's tick (Session.TaskByKey
// finds it).
func TickKey(name string, tick time.Time) string {
	return schedulePrefix + name + ":" + tick.UTC().Format(time.RFC3339) // projection.TickKey for a tick in nanoseconds
}

// ScheduleBackend is implemented by a backend that keeps schedules. worklog's own backends
// implement it; over a custom Backend given to New that does not, the schedule methods fail
// with ErrBackend naming it.
type ScheduleBackend interface {
	// SetSchedule sets (or replaces) the session's schedule (validated by the Session).
	SetSchedule(ctx context.Context, sessionID string, sc Schedule, now time.Time) error
	// RemoveSchedule removes the session's schedule name; found says it existed.
	RemoveSchedule(ctx context.Context, sessionID, name string, now time.Time) (found bool, err error)
	// Schedules lists the session's schedules in name order.
	Schedules(ctx context.Context, sessionID string) ([]Schedule, error)
}

var _ ScheduleBackend = (*logBackend)(nil)

// scheduleOps is the backend's ScheduleBackend (resolved by New), or the ErrBackend error
// naming it.
func (q *Queue) scheduleOps() (ScheduleBackend, error) {
	if q.caps.schedule == nil {
		return nil, unsupported("this method", "ScheduleBackend")
	}
	return q.caps.schedule, nil
}

// SetSchedule sets a schedule at the queue's clock's time.
func (s *Session) SetSchedule(ctx context.Context, sc Schedule) error {
	return s.SetScheduleAt(ctx, sc, s.q.now())
}

// SetScheduleAt sets the session's schedule sc.Name, replacing one of that name from now on:
// its ticks are the times its rule names strictly after now (and after the replaced
// schedule's last submitted tick, so no tick runs twice; the tasks of submitted ticks
// stay). Each tick becomes one task of the session: sc.Task with RunAt the tick and the
// idempotency key TickKey(name, tick), submitted by the first claim (ClaimDue, ClaimKinds,
// SettleAndClaim, the runner's) whose now is at or past the tick, in that claim's command,
// before its claims: that claim can take it. Ticks are decided where claims are (under the
// writer on Pebble, under the log head on PostgreSQL), from the schedule's cursor in the
// projection, so each runs exactly once however many processes claim, and a restart neither
// repeats nor loses one. One event, schedule_set.
//
// A blank name or one over 256 bytes is ErrInvalidRequest naming "name"; a rule the cron
// parser (github.com/robfig/cron/v3, standard 5 fields or a descriptor) refuses, an
// @every under a second or not in whole seconds, or a rule on a day that never exists
// ("0 0 30 2 *"), "cron"; an unknown time zone (or
// "Local"), "time_zone"; the template is checked as Submit checks a request, its fields
// named "task.kind", "task.input", ...; a template key is "task.idempotency_key" and a
// template RunAt "task.run_at"; a Catchup other than the two, "catchup".
//
// Time zones: the rule is read in the zone (time.LoadLocation); across a daylight-saving
// change (see Schedule) a wall time the spring change skips does not tick that day, and one
// the fall change repeats ticks at both instants.
func (s *Session) SetScheduleAt(ctx context.Context, sc Schedule, now time.Time) error {
	if err := s.q.begin(ctx); err != nil {
		return err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return err
	}
	if _, err := validateSchedule(&sc, s.q.maxValue); err != nil {
		return err
	}
	if _, err := nanos("now", now); err != nil {
		return err
	}
	sb, err := s.q.scheduleOps()
	if err != nil {
		return err
	}
	return wrap(sb.SetSchedule(ctx, s.id, sc, now))
}

// RemoveSchedule removes a schedule at the queue's clock's time.
func (s *Session) RemoveSchedule(ctx context.Context, name string) error {
	return s.RemoveScheduleAt(ctx, name, s.q.now())
}

// RemoveScheduleAt removes the session's schedule name: no more ticks (their tasks already
// submitted stay). One event, schedule_removed; a name with no schedule is ErrTaskNotFound
// (Error.ID is the name) and records nothing.
func (s *Session) RemoveScheduleAt(ctx context.Context, name string, now time.Time) error {
	if err := s.q.begin(ctx); err != nil {
		return err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return err
	}
	if err := validateScheduleName(name); err != nil {
		return err
	}
	if _, err := nanos("now", now); err != nil {
		return err
	}
	sb, err := s.q.scheduleOps()
	if err != nil {
		return err
	}
	found, err := sb.RemoveSchedule(ctx, s.id, name, now)
	if err != nil {
		return wrap(err)
	}
	if !found {
		return notFound(name)
	}
	return nil
}

// Schedules lists the session's schedules in name order, each with its next tick and the
// last one submitted. It reads; it records nothing.
func (s *Session) Schedules(ctx context.Context) ([]Schedule, error) {
	if err := s.q.begin(ctx); err != nil {
		return nil, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return nil, err
	}
	sb, err := s.q.scheduleOps()
	if err != nil {
		return nil, err
	}
	out, err := sb.Schedules(ctx, s.id)
	return out, wrap(err)
}

func validateScheduleName(name string) *Error {
	if blank(name) {
		return invalid("name", "must not be blank")
	}
	if len(name) > events.MaxScheduleName {
		return invalid("name", fmt.Sprintf("is %d bytes, more than the limit of %d", len(name), events.MaxScheduleName))
	}
	return nil
}

// rule is a parsed schedule: the cron library's Schedule read in its zone.
type rule struct {
	s   cron.Schedule
	loc *time.Location
}

// parser reads the standard 5-field cron and the descriptors (@every, @daily, ...).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseRule parses a schedule's rule and zone, with the error naming the field.
// loadLocation is time.LoadLocation; a test of this package makes a zone missing with it,
// as a machine whose zone database lacks the zone would.
var loadLocation = time.LoadLocation

func parseRule(spec, zone string) (rule, *Error) {
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		return rule{}, invalid("cron", "names no time zone: use Schedule.TimeZone")
	}
	if d, ok := strings.CutPrefix(spec, "@every "); ok {
		dur, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil {
			return rule{}, invalid("cron", fmt.Sprintf("@every: %v", err))
		}
		if dur < time.Second || dur%time.Second != 0 {
			return rule{}, invalid("cron", fmt.Sprintf("@every %s: must be whole seconds, at least 1s", dur))
		}
	}
	s, err := parser.Parse(spec)
	if err != nil {
		return rule{}, invalid("cron", err.Error())
	}
	if ss, ok := s.(*cron.SpecSchedule); ok && !daysExist(ss) {
		return rule{}, invalid("cron", fmt.Sprintf("%q never fires: no month it names has a day of the month it names", spec))
	}
	if zone == "Local" {
		return rule{}, invalid("time_zone", `"Local" depends on the machine: name the zone`)
	}
	loc, err := loadLocation(zone)
	if err != nil {
		return rule{}, invalid("time_zone", err.Error())
	}
	return rule{s, loc}, nil
}

// daysExist reports whether some day the rule's day-of-month and month fields name exists
// (a leap day counts). The cron library ANDs the two day fields when either is "*", else ORs
// them: a day-of-week field then always finds a day, every month has each weekday.
func daysExist(s *cron.SpecSchedule) bool {
	const star = 1 << 63 // the library's starBit: the field was "*"
	if s.Dom&star != 0 || (s.Dow&star == 0 && s.Dow != 0) {
		return true
	}
	for m := 1; m <= 12; m++ {
		if s.Month&(1<<m) == 0 {
			continue
		}
		days := time.Date(2024, time.Month(m)+1, 0, 0, 0, 0, 0, time.UTC).Day() // 2024 is a leap year
		for d := 1; d <= days; d++ {
			if s.Dom&(1<<d) != 0 {
				return true
			}
		}
	}
	return false
}

// after is the rule's first tick strictly after t (nanoseconds), or 0 when it names none
// that worklog can store. The cron library looks at most five years ahead: a leap-day rule
// from March 2097 finds its next tick in 2104, so after goes on from where it stopped.
func (r rule) after(t int64) int64 {
	from := time.Unix(0, t).In(r.loc)
	n := r.s.Next(from)
	for n.IsZero() && !from.After(maxTime) {
		from = time.Date(from.Year()+5, 12, 31, 23, 59, 59, 0, r.loc) // Next searched through that year
		n = r.s.Next(from)
	}
	if n.IsZero() || n.After(maxTime) || n.UnixNano() <= t {
		return 0
	}
	return n.UnixNano()
}

// latest is the last tick at or before now, given next, a tick at or before now: the tick
// CatchupLatest submits. For @every it is arithmetic; for a cron rule it looks back from now
// in doubling windows until one holds a tick, then walks that window, so its cost follows the
// ticks near now, not the length of the pause.
func (r rule) latest(next, now int64) int64 {
	if c, ok := r.s.(cron.ConstantDelaySchedule); ok {
		d := int64(c.Delay)
		return next + (now-next)/d*d
	}
	span := uint64(now) - uint64(next) // now >= next
	for step := uint64(time.Minute); ; step *= 2 {
		if step >= span { // the window reaches back to next: walk from it
			last := next
			for t := r.after(last); t != 0 && t <= now; t = r.after(t) {
				last = t
			}
			return last
		}
		if t := r.after(now - int64(step)); t != 0 && t <= now {
			last := t
			for t := r.after(last); t != 0 && t <= now; t = r.after(t) {
				last = t
			}
			return last
		}
	}
}

// validateSchedule checks sc and returns its parsed rule.
func validateSchedule(sc *Schedule, maxValue int) (rule, *Error) {
	if err := validateScheduleName(sc.Name); err != nil {
		return rule{}, err
	}
	r, err := parseRule(sc.Cron, sc.TimeZone)
	if err != nil {
		return rule{}, err
	}
	if sc.Task.IdempotencyKey != "" {
		return rule{}, invalid("task.idempotency_key", "must be empty: each tick's task has the key "+schedulePrefix+"<name>:<tick>")
	}
	if !sc.Task.RunAt.IsZero() {
		return rule{}, invalid("task.run_at", "must be zero: each tick's task runs at its tick")
	}
	if err := validateTaskRequest(&sc.Task, maxValue); err != nil {
		err.Field = "task." + err.Field
		return rule{}, err
	}
	if sc.Catchup != CatchupLatest && sc.Catchup != CatchupAll {
		return rule{}, invalid("catchup", fmt.Sprintf("%d is neither CatchupLatest nor CatchupAll", sc.Catchup))
	}
	return r, nil
}

// --- the backend ---

func (b *logBackend) SetSchedule(ctx context.Context, sessionID string, sc Schedule, now time.Time) error {
	at, verr := nanos("now", now)
	if verr != nil {
		return verr
	}
	r, verr := parseRule(sc.Cron, sc.TimeZone)
	if verr != nil {
		return verr
	}
	input := ownJSON(sc.Task.Input)
	headers := cloneHeaders(sc.Task.Headers)
	return backendErr(b.update(ctx, func(tx txn) error {
		old, err := tx.Schedule(sessionID, sc.Name)
		if err != nil {
			return err
		}
		from := at
		if old != nil && old.Cursor > from {
			from = old.Cursor // never a tick twice
		}
		return tx.Append(&events.ScheduleSet{
			Header: events.Header{SessionID: sessionID, At: at},
			Name:   sc.Name, Cron: sc.Cron, TimeZone: sc.TimeZone, Catchup: uint8(sc.Catchup),
			Kind: sc.Task.Kind, Input: input, Priority: int64(sc.Task.Priority), Headers: headers,
			WakeOnCompletion: sc.Task.Wake == WakeOnCompletion,
			From:             from, Next: r.after(from),
		})
	}))
}

func (b *logBackend) RemoveSchedule(ctx context.Context, sessionID, name string, now time.Time) (bool, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return false, verr
	}
	var found bool
	err := b.update(ctx, func(tx txn) error {
		old, err := tx.Schedule(sessionID, name)
		if err != nil {
			return err
		}
		found = old != nil && !old.Removed
		if !found {
			return nil
		}
		return tx.Append(&events.ScheduleRemoved{Header: events.Header{SessionID: sessionID, At: at}, Name: name})
	})
	return found, backendErr(err)
}

func (b *logBackend) Schedules(ctx context.Context, sessionID string) ([]Schedule, error) {
	var out []Schedule
	err := b.eng.View(ctx, func(r projection.Reader) error {
		out = out[:0]
		return r.ScanSessionSchedules(sessionID, func(sc *projection.Schedule) bool {
			if !sc.Removed {
				out = append(out, scheduleOf(sc))
			}
			return true
		})
	})
	if err != nil {
		return nil, backendErr(err)
	}
	return out, nil
}

// scheduleOf is the API's view of a schedule record.
func scheduleOf(sc *projection.Schedule) Schedule {
	out := Schedule{
		Name: sc.Name, Cron: sc.Cron, TimeZone: sc.TimeZone, Catchup: Catchup(sc.Catchup),
		Task: TaskRequest{
			Kind: sc.Kind, Input: append([]byte(nil), sc.Input...), Priority: int(sc.Priority),
			Headers: cloneHeaders(sc.Headers),
		},
	}
	if sc.WakeOnCompletion {
		out.Task.Wake = WakeOnCompletion
	}
	if sc.Next != 0 {
		out.Next = fromNanos(sc.Next)
	}
	if sc.Ticks > 0 {
		out.LastTick = fromNanos(sc.Cursor)
	}
	return out
}

// submitTicks is the decide code of the ticks, run by every task claim before it scans
// (claimIn): each schedule whose next tick is at or before at gets its ticks' tasks, one
// task_submitted (v3) each, which moves its cursor in the same command: CatchupLatest the
// latest tick at or before at, CatchupAll every one from its next, oldest first, up to
// MaxTicksPerClaim in all. A claim with nothing due reads one index entry.
func (b *logBackend) submitTicks(tx txn, at int64) error {
	budget := MaxTicksPerClaim
	var skip map[projection.ScheduleEntry]bool // schedules that cannot tick now (see below); made when one is
	for budget > 0 {
		var e projection.ScheduleEntry
		found := false
		err := tx.ScanScheduleDue(at, func(x projection.ScheduleEntry) bool {
			if skip[x] {
				return true
			}
			e, found = x, true
			return false
		})
		if err != nil || !found {
			return err
		}
		n, err := b.tickSchedule(tx, e, at, budget)
		if err != nil {
			return err
		}
		if n == 0 {
			if skip == nil {
				skip = map[projection.ScheduleEntry]bool{}
			}
			skip[e] = true
		}
		budget -= n
	}
	return nil
}

// tickSchedule submits the due ticks of one schedule (at most budget); n is how many. A
// schedule whose rule no longer parses (a time zone this machine's database lacks) or whose
// tick key is taken submits nothing and is skipped by this claim: the other schedules and
// the claim go on.
func (b *logBackend) tickSchedule(tx txn, e projection.ScheduleEntry, at int64, budget int) (int, error) {
	sc, err := tx.Schedule(e.SessionID, e.Name)
	if err != nil || sc == nil {
		return 0, err
	}
	r, verr := parseRule(sc.Cron, sc.TimeZone)
	if verr != nil {
		return 0, nil
	}
	tick := sc.Next
	if Catchup(sc.Catchup) == CatchupLatest {
		tick = r.latest(tick, at)
		budget = 1
	}
	// The ticks first, then their keys in one read where reads are round trips
	// (engineapi.KeyPrefetcher: PostgreSQL), not one read per tick under the log head.
	var keys []string
	var times, nexts []int64 // each tick and the one after it (its schedule_next)
	for t := tick; len(times) < budget && t != 0 && t <= at; t = nexts[len(nexts)-1] {
		times, nexts = append(times, t), append(nexts, r.after(t))
		keys = append(keys, TickKey(sc.Name, fromNanos(t)))
	}
	if p := keyPrefetcher(tx); p != nil && len(keys) > 1 {
		if err := p.PrefetchTaskKeys(sc.SessionID, keys); err != nil {
			return 0, err
		}
	}
	n := 0
	for ; n < len(times); n++ {
		tick, key := times[n], keys[n]
		if id, err := tx.TaskKey(sc.SessionID, key); err != nil || id != "" {
			return n, err
		}
		id, err := b.ids.id("task", at)
		if err != nil {
			return n, err
		}
		next := nexts[n]
		err = tx.Append(&events.TaskSubmitted{
			Header: events.Header{SessionID: sc.SessionID, At: at},
			TaskID: id, Kind: sc.Kind, Input: sc.Input, HasRunAt: true, RunAt: tick,
			IdempotencyKey: key, WakeOnCompletion: sc.WakeOnCompletion,
			Priority: sc.Priority, Headers: cloneHeaders(sc.Headers),
			Schedule: sc.Name, Tick: tick, ScheduleNext: next,
		})
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// keyPrefetcher is tx's engine transaction as an engineapi.KeyPrefetcher (through the
// command's watchCall, which wraps it), or nil when it is none.
func keyPrefetcher(tx txn) engineapi.KeyPrefetcher {
	p, _ := engineTxn(tx).(engineapi.KeyPrefetcher)
	return p
}

// nextTickOf calls first with the next tick of the first schedule (in tick order) whose
// task is of one of kinds (any kind when kinds is empty) and that a claim at now could
// submit: WaitTasks' timer. A schedule whose tick is already due at now but whose rule does
// not parse here (its time zone missing from this machine's database) is passed over: a claim
// skips it (tickSchedule), so waking for it would only wake again at once, a spin. It ticks
// again at the first claim after its zone is back.
func nextTickOf(r projection.Reader, kinds []string, now int64, first func(projection.IndexEntry) bool) error {
	var ferr error
	err := r.ScanScheduleDue(math.MaxInt64, func(e projection.ScheduleEntry) bool {
		if len(kinds) > 0 || e.At <= now {
			sc, err := r.Schedule(e.SessionID, e.Name)
			if err != nil || sc == nil {
				ferr = err
				return err == nil
			}
			if len(kinds) > 0 && !slices.Contains(kinds, sc.Kind) {
				return true
			}
			if e.At <= now {
				if _, verr := parseRule(sc.Cron, sc.TimeZone); verr != nil {
					return true
				}
			}
		}
		first(projection.IndexEntry{At: e.At})
		return false
	})
	return errors.Join(err, ferr)
}
