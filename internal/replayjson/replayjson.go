// Package replayjson is the task object of docs/replay-json.md (`replay state --json`,
// `replay task --json`), which the console's JSON API answers too: one definition, so that
// the two cannot drift apart. Fields are only ever added.
package replayjson

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Time is a time of the JSON outputs: RFC 3339 with nanoseconds, in UTC.
func Time(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// Value embeds a stored JSON value, compacted; nothing is null, and bytes that are not JSON
// become a JSON string (a store never holds such bytes, but a tool must not fail on them).
func Value(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		q, _ := json.Marshal(string(b))
		return q
	}
	return buf.Bytes()
}

// Outcome is a task's (or a completion wake's) outcome.
type Outcome struct {
	State   string          `json:"state"`
	Summary string          `json:"summary,omitempty"`
	Output  json.RawMessage `json:"output,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// OutcomeOf is o's JSON form; the output only of a success.
func OutcomeOf(o events.Outcome) *Outcome {
	out := &Outcome{State: o.State.String(), Summary: o.Summary, Error: o.Error}
	if o.State == events.StateSucceeded {
		out.Output = Value(o.Output)
	}
	return out
}

// Task is one task of `state --json` and `task --json`, and the console's /api/tasks/{id}.
type Task struct {
	ID                string            `json:"id"`
	Session           string            `json:"session"`
	Kind              string            `json:"kind"`
	State             string            `json:"state"`
	Attempts          uint32            `json:"attempts"`
	Input             json.RawMessage   `json:"input"`
	IdempotencyKey    string            `json:"idempotency_key,omitempty"`
	WakeOnCompletion  bool              `json:"wake_on_completion"`
	Priority          int64             `json:"priority,omitempty"`
	Headers           map[string]string `json:"headers,omitempty"`
	CreatedAt         string            `json:"created_at"`
	ScheduledAt       string            `json:"scheduled_at"`
	RunAt             string            `json:"run_at,omitempty"`
	CancelRequestedAt string            `json:"cancel_requested_at,omitempty"`
	LeaseToken        string            `json:"lease_token,omitempty"`
	LeaseExpiresAt    string            `json:"lease_expires_at,omitempty"`
	FinishedAt        string            `json:"finished_at,omitempty"`
	Outcome           *Outcome          `json:"outcome,omitempty"`
	CompletionWakeID  string            `json:"completion_wake_id,omitempty"`
	RejectedAttempt   uint32            `json:"rejected_attempt,omitempty"`
	AttemptsAtRetry   uint32            `json:"attempts_at_retry,omitempty"`
	// UnackedEarlierWakes: completion wakes of earlier runs, detached by a retry before
	// they were acknowledged, still unacknowledged; the task is not pruned while any is.
	UnackedEarlierWakes uint32 `json:"unacked_earlier_wakes,omitempty"`
	SubmitSeq           uint64 `json:"submit_seq"`
	UpdatedSeq          uint64 `json:"updated_seq"`
}

// TaskOf is t's JSON form; token says what to show for a running task's lease token
// (events.Redacted unless the tool was asked to show tokens).
func TaskOf(t *projection.Task, token func(string) string) *Task {
	j := &Task{
		ID: t.ID, Session: t.SessionID, Kind: t.Kind, State: t.State.String(), Attempts: t.Attempts,
		Input: Value(t.Input), IdempotencyKey: t.IdempotencyKey, WakeOnCompletion: t.WakeOnCompletion,
		CreatedAt: Time(t.CreatedAt), ScheduledAt: Time(t.ScheduledAt),
		CompletionWakeID: t.CompletionWakeID, RejectedAttempt: t.RejectedAttempt, AttemptsAtRetry: t.AttemptsAtRetry,
		UnackedEarlierWakes: t.UnackedEarlierWakes,
		SubmitSeq:           t.SubmitSeq, UpdatedSeq: t.UpdatedSeq, Priority: t.Priority, Headers: t.Headers,
	}
	if t.HasRunAt {
		j.RunAt = Time(t.RunAt)
	}
	if t.CancelRequested {
		j.CancelRequestedAt = Time(t.CancelRequestedAt)
	}
	if t.State == events.StateRunning {
		j.LeaseToken, j.LeaseExpiresAt = token(t.LeaseToken), Time(t.LeaseExpiresAt)
	}
	if t.State.Terminal() {
		j.FinishedAt, j.Outcome = Time(t.FinishedAt), OutcomeOf(t.Outcome)
	}
	return j
}
