package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/narrate"
	"github.com/worklog/worklog/internal/replayjson"
	"github.com/worklog/worklog/projection"
)

// The words of text output are narrate's, so that `replay task` and the console tell a
// task's history alike.
var (
	fmtTime        = narrate.Time
	word           = narrate.Word
	shortWord      = narrate.ShortWord
	headerWords    = narrate.HeaderWords
	shortJSON      = narrate.ShortJSON
	outcomeText    = narrate.OutcomeText
	wakeRejectText = narrate.WakeRejectText
)

func jsonTime(ns int64) string { return replayjson.Time(ns) }

// clock is the short form used inside a story: the date is in the header.
func clock(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05.000") }

func fmtDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return d.String()
	}
	return d.Round(time.Millisecond).String()
}

// token shows a lease token, or events.Redacted.
func (a *app) token(t string) string {
	if t == "" || a.showTokens {
		return t
	}
	return events.Redacted
}

// compactJSON is the caller's JSON on one line. Bytes that are not JSON (a store written by
// hand) come back as a JSON string of them, so the output always parses.
func compactJSON(b []byte) json.RawMessage { return replayjson.Value(b) }

// eventLine is the one-line text form of an event: sequence, time, session, event type,
// then what the event says (ids, attempt, lease, outcome) as key=value pairs.
func (a *app) eventLine(ev events.Event, seqWidth, sessionWidth int) string {
	return string(a.appendEventLine(nil, ev, seqWidth, sessionWidth))
}

// appendEventLine appends eventLine: log writes its lines into one buffer (a follower of a
// busy queue prints every event), with no allocation per field.
func (a *app) appendEventLine(b []byte, ev events.Event, seqWidth, sessionWidth int) []byte {
	h := ev.Head()
	start := len(b)
	var scratch [64]byte // a column before its padding
	b = padLeft(b, seqWidth, strconv.AppendUint(scratch[:0], h.Seq, 10))
	b = append(b, "  "...)
	b = narrate.AppendTime(b, h.At)
	b = append(b, "  "...)
	b = padRight(b, sessionWidth, narrate.AppendWord(scratch[:0], h.SessionID))
	b = append(b, "  "...)
	b = padRight(b, 21, append(scratch[:0], ev.Type().String()...))
	b, ok := a.appendDetails(b, ev)
	if !ok {
		b = append(b, "  "+unknownEventNote...)
	}
	for len(b) > start && b[len(b)-1] == ' ' {
		b = b[:len(b)-1]
	}
	return b
}

// padLeft and padRight append s padded with spaces to width characters, as fmt's %*s and
// %-*s do.
func padLeft(b []byte, width int, s []byte) []byte {
	for n := utf8.RuneCount(s); n < width; n++ {
		b = append(b, ' ')
	}
	return append(b, s...)
}

func padRight(b []byte, width int, s []byte) []byte {
	b = append(b, s...)
	for n := utf8.RuneCount(s); n < width; n++ {
		b = append(b, ' ')
	}
	return b
}

// unknownEventNote marks the output of an event type that a switch of replay has no case
// for: a type added to the events catalogue and forgotten here. Decoding refuses types the
// catalogue does not know, so only a forgotten case can print it; TestEveryTypeEveryOutput
// makes sure none does.
const unknownEventNote = "(replay has no description of this event type)"

// details appends an event's key=value pairs to a line, each after two spaces.
type details struct{ b []byte }

func (d *details) key(k string) { d.b = append(append(d.b, "  "...), k...) }

func (d *details) str(k, v string) { d.key(k); d.b = append(d.b, v...) }

func (d *details) word(k, v string) { d.key(k); d.b = narrate.AppendWord(d.b, v) }

func (d *details) uint(k string, n uint64) { d.key(k); d.b = strconv.AppendUint(d.b, n, 10) }

func (d *details) int(k string, n int64) { d.key(k); d.b = strconv.AppendInt(d.b, n, 10) }

func (d *details) time(k string, ns int64) { d.key(k); d.b = narrate.AppendTime(d.b, ns) }

func (d *details) json(k string, v []byte) { d.key(k); d.b = narrate.AppendShortJSON(d.b, v, 80) }

// appendDetails appends what an event says, as key=value pairs each after two spaces; ok is
// false for a type it has no case for.
func (a *app) appendDetails(b []byte, ev events.Event) (_ []byte, ok bool) {
	d := &details{b: b}
	outcome := func(o events.Outcome) {
		d.str("outcome=", o.State.String())
		if o.Summary != "" {
			d.word("summary=", o.Summary)
		}
		if o.State == events.StateSucceeded && len(o.Output) > 0 {
			d.json("output=", o.Output)
		}
		if o.Error != "" {
			d.word("error=", o.Error)
		}
	}
	headers := func(h map[string]string) {
		for _, kv := range headerWords(h) {
			d.str("header:", kv)
		}
	}
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		d.str("task=", e.TaskID)
		d.word("kind=", e.Kind)
		if e.HasRunAt {
			d.time("run_at=", e.RunAt)
		}
		if e.IdempotencyKey != "" {
			d.word("key=", e.IdempotencyKey)
		}
		if e.WakeOnCompletion {
			d.key("wake=on_completion")
		}
		if e.Priority != 0 {
			d.int("priority=", e.Priority)
		}
		headers(e.Headers)
		if e.Schedule != "" {
			d.word("schedule=", e.Schedule)
			d.time("tick=", e.Tick)
			d.str("schedule_next=", fmtNext(e.ScheduleNext))
		}
		d.json("input=", e.Input)
	case *events.TaskClaimed:
		d.str("task=", e.TaskID)
		d.uint("attempt=", uint64(e.Attempt))
		d.time("lease_until=", e.LeaseExpiresAt)
		if e.Worker != "" {
			d.word("worker=", e.Worker)
		}
		d.str("token=", a.token(e.LeaseToken))
	case *events.TaskSettled:
		d.str("task=", e.TaskID)
		d.uint("attempt=", uint64(e.Attempt))
		outcome(e.Outcome)
		d.str("token=", a.token(e.LeaseToken))
	case *events.TaskCancelRequested:
		d.str("task=", e.TaskID)
	case *events.WakeRecorded:
		d.str("wake=", e.WakeID)
		d.str("reason=", e.Reason.String())
		if e.Reason == events.WakeTaskFinished {
			d.str("task=", e.TaskID)
			d.str("outcome=", e.Outcome.State.String())
		} else {
			if e.IdempotencyKey != "" {
				d.word("key=", e.IdempotencyKey)
			}
			d.json("payload=", e.Payload)
		}
	case *events.WakeClaimed:
		d.str("wake=", e.WakeID)
		d.uint("attempt=", uint64(e.Attempt))
		d.time("lease_until=", e.LeaseExpiresAt)
		if e.Worker != "" {
			d.word("worker=", e.Worker)
		}
		d.str("token=", a.token(e.LeaseToken))
	case *events.WakeAcked:
		d.str("wake=", e.WakeID)
		d.uint("attempt=", uint64(e.Attempt))
		d.str("token=", a.token(e.LeaseToken))
	case *events.TaskSettleRejected:
		d.str("task=", e.TaskID)
		d.uint("attempt=", uint64(e.Attempt))
		d.str("reason=", e.Reason.String())
	case *events.WakeAckRejected:
		d.str("wake=", e.WakeID)
		d.uint("attempt=", uint64(e.Attempt))
		d.str("reason=", e.Reason.String())
	case *events.TaskExtended:
		d.str("task=", e.TaskID)
		d.uint("attempt=", uint64(e.Attempt))
		d.time("lease_until=", e.LeaseExpiresAt)
	case *events.TaskReleased:
		d.str("task=", e.TaskID)
		d.uint("attempt=", uint64(e.Attempt))
		d.time("run_at=", e.RunAt)
		if e.Reason != "" {
			d.str("reason=", shortWord(e.Reason, 80))
		}
	case *events.TaskRetried:
		d.str("task=", e.TaskID)
		d.uint("attempts=", uint64(e.Attempts))
		d.time("run_at=", e.RunAt)
	case *events.ScheduleSet:
		d.word("schedule=", e.Name)
		d.word("cron=", e.Cron)
		if e.TimeZone != "" {
			d.word("tz=", e.TimeZone)
		}
		d.str("catchup=", catchupName(e.Catchup))
		d.word("kind=", e.Kind)
		if e.WakeOnCompletion {
			d.key("wake=on_completion")
		}
		if e.Priority != 0 {
			d.int("priority=", e.Priority)
		}
		headers(e.Headers)
		d.time("from=", e.From)
		d.str("next=", fmtNext(e.Next))
		d.json("input=", e.Input)
	case *events.ScheduleRemoved:
		d.word("schedule=", e.Name)
	case *events.TaskSubmitRejected:
		d.str("task=", e.TaskID)
		d.word("key=", e.IdempotencyKey)
		d.word("differs=", e.Field)
		d.word("kind=", e.Kind)
	case *events.KindPolicySet:
		d.word("kind=", e.Kind)
		if e.Zero() {
			d.key("policy=removed")
			break
		}
		if e.Paused {
			d.key("paused")
		}
		if e.MaxRunning > 0 {
			d.key(fmt.Sprintf("max_running=%d", e.MaxRunning))
		}
		if e.Rate > 0 {
			d.key(fmt.Sprintf("rate=%g/s", e.Rate))
			d.key(fmt.Sprintf("burst=%d", e.Burst))
		}
		if e.FairSessions {
			d.key("fair_sessions")
		}
		if e.MaxRunningPerSession > 0 {
			d.key(fmt.Sprintf("max_running_per_session=%d", e.MaxRunningPerSession))
		}
	default:
		taskID, wakeID := ev.Subject()
		if taskID != "" {
			d.str("task=", taskID)
		} else {
			d.str("wake=", wakeID)
		}
		return d.b, false
	}
	return d.b, true
}

// fmtNext is a schedule's next tick, or "none".
func fmtNext(ns int64) string {
	if ns == 0 {
		return "none"
	}
	return fmtTime(ns)
}

func catchupName(c uint8) string {
	if c == 1 {
		return "all"
	}
	return "latest"
}

// --- JSON: the contract in docs/replay-json.md. Fields are only ever added. ---

type outcomeJSON = replayjson.Outcome

func outcomeOf(o events.Outcome) *outcomeJSON { return replayjson.OutcomeOf(o) }

// eventJSON is one event of `log --json` and `export`. A type without a case below still
// prints its header and its subject.
type eventJSON struct {
	Seq              uint64            `json:"seq"`
	At               string            `json:"at"`
	Session          string            `json:"session"`
	Event            string            `json:"event"`
	TaskID           string            `json:"task_id,omitempty"`
	WakeID           string            `json:"wake_id,omitempty"`
	Attempt          uint32            `json:"attempt,omitempty"`
	Attempts         uint32            `json:"attempts,omitempty"` // task_retried: the task's attempts at the retry
	Kind             string            `json:"kind,omitempty"`
	Input            json.RawMessage   `json:"input,omitempty"`
	RunAt            string            `json:"run_at,omitempty"`
	ScheduledAt      string            `json:"scheduled_at,omitempty"`
	IdempotencyKey   string            `json:"idempotency_key,omitempty"`
	WakeOnCompletion *bool             `json:"wake_on_completion,omitempty"`
	Priority         int64             `json:"priority,omitempty"`
	Headers          map[string]string `json:"headers,omitempty"`
	LeaseToken       string            `json:"lease_token,omitempty"`
	LeaseExpiresAt   string            `json:"lease_expires_at,omitempty"`
	Worker           string            `json:"worker,omitempty"`
	Outcome          *outcomeJSON      `json:"outcome,omitempty"`
	Reason           string            `json:"reason,omitempty"`
	Field            string            `json:"field,omitempty"` // task_submit_rejected: the first differing field
	Payload          json.RawMessage   `json:"payload,omitempty"`
	// The schedules: schedule_set, schedule_removed, and a tick's task_submitted.
	Schedule     string `json:"schedule,omitempty"`
	Tick         string `json:"tick,omitempty"`
	ScheduleNext string `json:"schedule_next,omitempty"` // "": none
	Cron         string `json:"cron,omitempty"`
	TimeZone     string `json:"time_zone,omitempty"`
	Catchup      string `json:"catchup,omitempty"`
	From         string `json:"from,omitempty"`
	// kind_policy_set: the whole policy (all four fields, zero ones included).
	Paused     *bool    `json:"paused,omitempty"`
	MaxRunning *int64   `json:"max_running,omitempty"`
	Rate       *float64 `json:"rate,omitempty"`
	Burst      *int64   `json:"burst,omitempty"`
	// kind_policy_set of schema 2: present only when set.
	FairSessions         bool  `json:"fair_sessions,omitempty"`
	MaxRunningPerSession int64 `json:"max_running_per_session,omitempty"`
}

func (a *app) eventJSON(ev events.Event) *eventJSON {
	j, _ := a.eventJSONOK(ev)
	return j
}

// eventJSONOK is eventJSON; ok is false for a type it has no case for.
func (a *app) eventJSONOK(ev events.Event) (*eventJSON, bool) {
	h := ev.Head()
	j := &eventJSON{Seq: h.Seq, At: jsonTime(h.At), Session: h.SessionID, Event: ev.Type().String()}
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		j.TaskID, j.Kind, j.Input = e.TaskID, e.Kind, compactJSON(e.Input)
		if e.HasRunAt {
			j.RunAt = jsonTime(e.RunAt)
		}
		j.ScheduledAt = jsonTime(e.ScheduledAt())
		j.IdempotencyKey = e.IdempotencyKey
		w := e.WakeOnCompletion
		j.WakeOnCompletion = &w
		j.Priority, j.Headers = e.Priority, e.Headers
		if e.Schedule != "" {
			j.Schedule, j.Tick = e.Schedule, jsonTime(e.Tick)
			if e.ScheduleNext != 0 {
				j.ScheduleNext = jsonTime(e.ScheduleNext)
			}
		}
	case *events.TaskClaimed:
		j.TaskID, j.Attempt, j.Worker = e.TaskID, e.Attempt, e.Worker
		j.LeaseToken, j.LeaseExpiresAt = a.token(e.LeaseToken), jsonTime(e.LeaseExpiresAt)
	case *events.TaskSettled:
		j.TaskID, j.Attempt, j.LeaseToken = e.TaskID, e.Attempt, a.token(e.LeaseToken)
		j.Outcome = outcomeOf(e.Outcome)
	case *events.TaskCancelRequested:
		j.TaskID = e.TaskID
	case *events.WakeRecorded:
		j.WakeID, j.Reason = e.WakeID, e.Reason.String()
		if e.Reason == events.WakeTaskFinished {
			j.TaskID, j.Outcome = e.TaskID, outcomeOf(e.Outcome)
		} else {
			j.Payload, j.IdempotencyKey = compactJSON(e.Payload), e.IdempotencyKey
		}
	case *events.WakeClaimed:
		j.WakeID, j.Attempt, j.Worker = e.WakeID, e.Attempt, e.Worker
		j.LeaseToken, j.LeaseExpiresAt = a.token(e.LeaseToken), jsonTime(e.LeaseExpiresAt)
	case *events.WakeAcked:
		j.WakeID, j.Attempt, j.LeaseToken = e.WakeID, e.Attempt, a.token(e.LeaseToken)
	case *events.TaskSettleRejected:
		j.TaskID, j.Attempt, j.Reason = e.TaskID, e.Attempt, e.Reason.String()
	case *events.WakeAckRejected:
		j.WakeID, j.Attempt, j.Reason = e.WakeID, e.Attempt, e.Reason.String()
	case *events.TaskExtended:
		j.TaskID, j.Attempt, j.LeaseExpiresAt = e.TaskID, e.Attempt, jsonTime(e.LeaseExpiresAt)
	case *events.TaskReleased:
		// reason is the worker's own text here (whole: up to 64 KiB), not a reject reason.
		j.TaskID, j.Attempt, j.RunAt, j.Reason = e.TaskID, e.Attempt, jsonTime(e.RunAt), e.Reason
	case *events.TaskRetried:
		j.TaskID, j.Attempts, j.RunAt = e.TaskID, e.Attempts, jsonTime(e.RunAt)
	case *events.ScheduleSet:
		j.Schedule, j.Cron, j.TimeZone, j.Catchup = e.Name, e.Cron, e.TimeZone, catchupName(e.Catchup)
		j.Kind, j.Input, j.Priority, j.Headers = e.Kind, compactJSON(e.Input), e.Priority, e.Headers
		w := e.WakeOnCompletion
		j.WakeOnCompletion = &w
		j.From = jsonTime(e.From)
		if e.Next != 0 {
			j.ScheduleNext = jsonTime(e.Next)
		}
	case *events.ScheduleRemoved:
		j.Schedule = e.Name
	case *events.TaskSubmitRejected:
		j.TaskID, j.IdempotencyKey, j.Field, j.Kind = e.TaskID, e.IdempotencyKey, e.Field, e.Kind
	case *events.KindPolicySet:
		paused, maxRunning, rate, burst := e.Paused, e.MaxRunning, e.Rate, e.Burst
		j.Kind, j.Paused, j.MaxRunning, j.Rate, j.Burst = e.Kind, &paused, &maxRunning, &rate, &burst
		j.FairSessions, j.MaxRunningPerSession = e.FairSessions, e.MaxRunningPerSession
	default:
		j.TaskID, j.WakeID = ev.Subject()
		return j, false
	}
	return j, true
}

// taskJSON is one task of `state --json` and `task --json` (internal/replayjson: the
// console answers the same object).
type taskJSON = replayjson.Task

func (a *app) taskJSON(t *projection.Task) *taskJSON { return replayjson.TaskOf(t, a.token) }

// wakeJSON is one wake of `state --json` and `task --json`.
type wakeJSON struct {
	ID              string          `json:"id"`
	Session         string          `json:"session"`
	Reason          string          `json:"reason"`
	State           string          `json:"state"`
	Attempts        uint32          `json:"attempts"`
	Payload         json.RawMessage `json:"payload,omitempty"`
	IdempotencyKey  string          `json:"idempotency_key,omitempty"`
	TaskID          string          `json:"task_id,omitempty"`
	Outcome         *outcomeJSON    `json:"outcome,omitempty"`
	CreatedAt       string          `json:"created_at"`
	LeaseToken      string          `json:"lease_token,omitempty"`
	LeaseExpiresAt  string          `json:"lease_expires_at,omitempty"`
	Acked           bool            `json:"acked"`
	RejectedAttempt uint32          `json:"rejected_attempt,omitempty"`
	RecordSeq       uint64          `json:"record_seq"`
	UpdatedSeq      uint64          `json:"updated_seq"`
}

// wakeState names a wake's state: available (never claimed, or its lease expired and it
// waits for a new claim), claimed (held by a lease) or acked.
func wakeState(w *projection.Wake) string {
	switch {
	case w.Acked:
		return "acked"
	case w.Claimed():
		return "claimed"
	}
	return "available"
}

func (a *app) wakeJSON(w *projection.Wake) *wakeJSON {
	j := &wakeJSON{
		ID: w.ID, Session: w.SessionID, Reason: w.Reason.String(), State: wakeState(w), Attempts: w.Attempts,
		CreatedAt: jsonTime(w.CreatedAt), Acked: w.Acked, RejectedAttempt: w.RejectedAttempt,
		RecordSeq: w.RecordSeq, UpdatedSeq: w.UpdatedSeq,
	}
	if w.Reason == events.WakeTaskFinished {
		j.TaskID, j.Outcome = w.TaskID, outcomeOf(w.Outcome)
	} else {
		j.Payload, j.IdempotencyKey = compactJSON(w.Payload), w.IdempotencyKey
	}
	if w.Claimed() {
		j.LeaseToken, j.LeaseExpiresAt = a.token(w.LeaseToken), jsonTime(w.LeaseExpiresAt)
	}
	return j
}

// writeJSONLine writes v as one line of JSON.
func writeJSONLine(w interface{ Write([]byte) (int, error) }, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

func digits(n uint64) int { return len(strconv.FormatUint(n, 10)) }

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
