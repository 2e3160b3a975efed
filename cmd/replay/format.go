package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

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
	h := ev.Head()
	var b strings.Builder
	fmt.Fprintf(&b, "%*d  %s  %-*s  %-21s", seqWidth, h.Seq, fmtTime(h.At), sessionWidth, word(h.SessionID), ev.Type())
	details, ok := a.eventDetails(ev)
	if !ok {
		details = append(details, unknownEventNote)
	}
	for _, kv := range details {
		b.WriteString("  ")
		b.WriteString(kv)
	}
	return strings.TrimRight(b.String(), " ")
}

// unknownEventNote marks the output of an event type that a switch of replay has no case
// for: a type added to the events catalogue and forgotten here. Decoding refuses types the
// catalogue does not know, so only a forgotten case can print it; TestEveryTypeEveryOutput
// makes sure none does.
const unknownEventNote = "(replay has no description of this event type)"

// eventDetails is what an event says, as key=value pairs; ok is false for a type it has no
// case for.
func (a *app) eventDetails(ev events.Event) (details []string, ok bool) {
	var d []string
	add := func(format string, args ...any) { d = append(d, fmt.Sprintf(format, args...)) }
	outcome := func(o events.Outcome) {
		add("outcome=%s", o.State)
		if o.Summary != "" {
			add("summary=%s", word(o.Summary))
		}
		if o.State == events.StateSucceeded && len(o.Output) > 0 {
			add("output=%s", shortJSON(o.Output, 80))
		}
		if o.Error != "" {
			add("error=%s", word(o.Error))
		}
	}
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		add("task=%s", e.TaskID)
		add("kind=%s", word(e.Kind))
		if e.HasRunAt {
			add("run_at=%s", fmtTime(e.RunAt))
		}
		if e.IdempotencyKey != "" {
			add("key=%s", word(e.IdempotencyKey))
		}
		if e.WakeOnCompletion {
			add("wake=on_completion")
		}
		if e.Priority != 0 {
			add("priority=%d", e.Priority)
		}
		for _, kv := range headerWords(e.Headers) {
			add("header:%s", kv)
		}
		if e.Schedule != "" {
			add("schedule=%s", word(e.Schedule))
			add("tick=%s", fmtTime(e.Tick))
			add("schedule_next=%s", fmtNext(e.ScheduleNext))
		}
		add("input=%s", shortJSON(e.Input, 80))
	case *events.TaskClaimed:
		add("task=%s", e.TaskID)
		add("attempt=%d", e.Attempt)
		add("lease_until=%s", fmtTime(e.LeaseExpiresAt))
		if e.Worker != "" {
			add("worker=%s", word(e.Worker))
		}
		add("token=%s", a.token(e.LeaseToken))
	case *events.TaskSettled:
		add("task=%s", e.TaskID)
		add("attempt=%d", e.Attempt)
		outcome(e.Outcome)
		add("token=%s", a.token(e.LeaseToken))
	case *events.TaskCancelRequested:
		add("task=%s", e.TaskID)
	case *events.WakeRecorded:
		add("wake=%s", e.WakeID)
		add("reason=%s", e.Reason)
		if e.Reason == events.WakeTaskFinished {
			add("task=%s", e.TaskID)
			add("outcome=%s", e.Outcome.State)
		} else {
			if e.IdempotencyKey != "" {
				add("key=%s", word(e.IdempotencyKey))
			}
			add("payload=%s", shortJSON(e.Payload, 80))
		}
	case *events.WakeClaimed:
		add("wake=%s", e.WakeID)
		add("attempt=%d", e.Attempt)
		add("lease_until=%s", fmtTime(e.LeaseExpiresAt))
		if e.Worker != "" {
			add("worker=%s", word(e.Worker))
		}
		add("token=%s", a.token(e.LeaseToken))
	case *events.WakeAcked:
		add("wake=%s", e.WakeID)
		add("attempt=%d", e.Attempt)
		add("token=%s", a.token(e.LeaseToken))
	case *events.TaskSettleRejected:
		add("task=%s", e.TaskID)
		add("attempt=%d", e.Attempt)
		add("reason=%s", e.Reason)
	case *events.WakeAckRejected:
		add("wake=%s", e.WakeID)
		add("attempt=%d", e.Attempt)
		add("reason=%s", e.Reason)
	case *events.TaskExtended:
		add("task=%s", e.TaskID)
		add("attempt=%d", e.Attempt)
		add("lease_until=%s", fmtTime(e.LeaseExpiresAt))
	case *events.TaskReleased:
		add("task=%s", e.TaskID)
		add("attempt=%d", e.Attempt)
		add("run_at=%s", fmtTime(e.RunAt))
		if e.Reason != "" {
			add("reason=%s", shortWord(e.Reason, 80))
		}
	case *events.TaskRetried:
		add("task=%s", e.TaskID)
		add("attempts=%d", e.Attempts)
		add("run_at=%s", fmtTime(e.RunAt))
	case *events.ScheduleSet:
		add("schedule=%s", word(e.Name))
		add("cron=%s", word(e.Cron))
		if e.TimeZone != "" {
			add("tz=%s", word(e.TimeZone))
		}
		add("catchup=%s", catchupName(e.Catchup))
		add("kind=%s", word(e.Kind))
		if e.WakeOnCompletion {
			add("wake=on_completion")
		}
		if e.Priority != 0 {
			add("priority=%d", e.Priority)
		}
		for _, kv := range headerWords(e.Headers) {
			add("header:%s", kv)
		}
		add("from=%s", fmtTime(e.From))
		add("next=%s", fmtNext(e.Next))
		add("input=%s", shortJSON(e.Input, 80))
	case *events.ScheduleRemoved:
		add("schedule=%s", word(e.Name))
	case *events.TaskSubmitRejected:
		add("task=%s", e.TaskID)
		add("key=%s", word(e.IdempotencyKey))
		add("differs=%s", word(e.Field))
		add("kind=%s", word(e.Kind))
	case *events.KindPolicySet:
		add("kind=%s", word(e.Kind))
		if e.Zero() {
			add("policy=removed")
			break
		}
		if e.Paused {
			add("paused")
		}
		if e.MaxRunning > 0 {
			add("max_running=%d", e.MaxRunning)
		}
		if e.Rate > 0 {
			add("rate=%g/s", e.Rate)
			add("burst=%d", e.Burst)
		}
		if e.FairSessions {
			add("fair_sessions")
		}
		if e.MaxRunningPerSession > 0 {
			add("max_running_per_session=%d", e.MaxRunningPerSession)
		}
	default:
		return subjectDetails(ev), false
	}
	return d, true
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

// subjectDetails is what every event says whatever its type: its task or wake.
func subjectDetails(ev events.Event) []string {
	taskID, wakeID := ev.Subject()
	if taskID != "" {
		return []string{"task=" + taskID}
	}
	return []string{"wake=" + wakeID}
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
