// Package goldenstore writes the golden stores of the store formats this release keeps
// (docs/pebble.md and docs/postgres.md, "Store formats and the upgrade promise") and reads
// their state back in a stable form. Populate runs through the public API (work.Queue), so the
// same history is written to a Pebble store and to a PostgreSQL schema; Dump renders what a
// queue holds as JSON for the golden tests to compare (pebblelog's and postgres's
// TestGoldenStore, whose -update flag writes the golden store and its expected state).
package goldenstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// T0 is the time of the first event; every event is at T0 plus some minutes.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Sessions are the sessions Populate writes.
var Sessions = []string{"old", "alpha", "beta"}

// BigOutput is the length of the one large output Populate writes into a Pebble store, which
// keeps it in a blob file (pebblelog.BlobMin, 256 KiB). PostgreSQL keeps every value in its
// rows: its golden dump takes a smaller one.
const BigOutput = 256 << 10

// Populate writes the golden history into q: tasks in every state (pending, scheduled, running,
// succeeded with an output of bigOutput bytes, failed, canceled, released, retried), with idempotency keys,
// priorities and headers; wakes available, leased, acknowledged and on completion; a schedule
// with its first tick, and a removed one; kind policies; and a pruned range (session "old",
// finished and pruned before the rest).
func Populate(ctx context.Context, q *work.Queue, bigOutput int) error {
	at := func(min int) time.Time { return T0.Add(time.Duration(min) * time.Minute) }
	step := func(err error, what string) error {
		if err != nil {
			return fmt.Errorf("goldenstore: %s: %w", what, err)
		}
		return nil
	}
	claim := func(kind string, now time.Time) (work.TaskDelivery, error) {
		ds, err := q.ClaimKindsAt(ctx, []string{kind}, now, time.Hour, 1)
		if err != nil {
			return work.TaskDelivery{}, err
		}
		if len(ds) != 1 {
			return work.TaskDelivery{}, fmt.Errorf("claimed %d tasks of kind %q, want 1", len(ds), kind)
		}
		return ds[0], nil
	}

	// The pruned history: a task finished and a requested wake acknowledged, both pruned.
	old := q.Session("old")
	if _, err := old.SubmitAt(ctx, work.TaskRequest{Kind: "old.kind", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "old-1"}, at(0)); err != nil {
		return step(err, "submit old")
	}
	d, err := claim("old.kind", at(1))
	if err != nil {
		return step(err, "claim old")
	}
	if _, err := q.FinishAt(ctx, d, work.Outcome{State: work.TaskSucceeded, Output: json.RawMessage(`"done"`)}, at(2)); err != nil {
		return step(err, "finish old")
	}
	if _, err := old.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"w":"old"}`)}, at(3)); err != nil {
		return step(err, "wake old")
	}
	ws, err := q.ClaimSessionWakesAt(ctx, []string{"old"}, at(4), time.Hour, 10)
	if err != nil || len(ws) != 1 {
		return step(fmt.Errorf("%d wakes, %v", len(ws), err), "claim old wake")
	}
	if err := q.AckWakeAt(ctx, ws[0], at(5)); err != nil {
		return step(err, "ack old wake")
	}
	if _, err := q.Prune(ctx, at(10)); err != nil {
		return step(err, "prune")
	}

	// Policies and schedules.
	if err := q.SetKindPolicyAt(ctx, "build", work.KindPolicy{MaxRunning: 2, Rate: 5, Burst: 10}, at(20)); err != nil {
		return step(err, "policy build")
	}
	if err := q.SetKindPolicyAt(ctx, "paused.kind", work.KindPolicy{Paused: true}, at(20)); err != nil {
		return step(err, "policy paused")
	}
	alpha, beta := q.Session("alpha"), q.Session("beta")
	if err := alpha.SetScheduleAt(ctx, work.Schedule{Name: "hourly-report", Cron: "@every 1h",
		Task: work.TaskRequest{Kind: "report", Input: json.RawMessage(`{"r":true}`), Priority: 1}}, at(21)); err != nil {
		return step(err, "schedule")
	}
	if err := beta.SetScheduleAt(ctx, work.Schedule{Name: "gone", Cron: "*/5 * * * *", TimeZone: "Europe/Paris",
		Task: work.TaskRequest{Kind: "report"}}, at(21)); err != nil {
		return step(err, "schedule gone")
	}
	if err := beta.RemoveScheduleAt(ctx, "gone", at(22)); err != nil {
		return step(err, "remove schedule")
	}

	// Tasks in every state.
	submit := func(s *work.Session, r work.TaskRequest, min int) error {
		_, err := s.SubmitAt(ctx, r, at(min))
		return step(err, "submit "+r.Kind)
	}
	for _, e := range []struct {
		s *work.Session
		r work.TaskRequest
	}{
		{alpha, work.TaskRequest{Kind: "email", Input: json.RawMessage(`{"to":"a@example.com"}`), IdempotencyKey: "email-1",
			Priority: 5, Headers: map[string]string{"trace": "t-1"}, Wake: work.WakeOnCompletion}},
		{alpha, work.TaskRequest{Kind: "email", Input: json.RawMessage(`{"to":"later@example.com"}`), RunAt: at(24 * 60)}},
		{alpha, work.TaskRequest{Kind: "build", Input: json.RawMessage(`{"ref":"main"}`), Wake: work.WakeOnCompletion}},
		{alpha, work.TaskRequest{Kind: "big", Input: json.RawMessage(`{"size":"large"}`), Wake: work.WakeOnCompletion}},
		{beta, work.TaskRequest{Kind: "flaky", Input: json.RawMessage(`[1,2,3]`), IdempotencyKey: "flaky-1"}},
		{beta, work.TaskRequest{Kind: "cancel.me", Wake: work.WakeOnCompletion}},
		{beta, work.TaskRequest{Kind: "release.me", Priority: -3}},
		{beta, work.TaskRequest{Kind: "retry.me"}},
		{beta, work.TaskRequest{Kind: "paused.kind"}},
	} {
		if err := submit(e.s, e.r, 30); err != nil {
			return err
		}
	}
	// running: build, under its policy
	if _, err := claim("build", at(31)); err != nil {
		return step(err, "claim build")
	}
	// succeeded with a large output (a blob), its completion wake leased
	d, err = claim("big", at(32))
	if err != nil {
		return step(err, "claim big")
	}
	big := `"` + strings.Repeat("b", bigOutput) + `"`
	if _, err := q.FinishAt(ctx, d, work.Outcome{State: work.TaskSucceeded, Summary: "large", Output: json.RawMessage(big)}, at(33)); err != nil {
		return step(err, "finish big")
	}
	// failed
	d, err = claim("flaky", at(34))
	if err != nil {
		return step(err, "claim flaky")
	}
	if _, err := q.FinishAt(ctx, d, work.Outcome{State: work.TaskFailed, Error: "it broke"}, at(35)); err != nil {
		return step(err, "fail flaky")
	}
	// canceled while pending, with its completion wake
	ts, err := beta.Tasks(ctx, work.TaskFilter{Kinds: []string{"cancel.me"}, Limit: 1})
	if err != nil || len(ts) != 1 {
		return step(fmt.Errorf("%d tasks, %v", len(ts), err), "find cancel.me")
	}
	if _, err := beta.CancelAt(ctx, ts[0].ID, at(36)); err != nil {
		return step(err, "cancel")
	}
	// released back to pending, later
	d, err = claim("release.me", at(37))
	if err != nil {
		return step(err, "claim release.me")
	}
	if _, err := q.ReleaseAt(ctx, d, work.ReleaseRequest{RunAt: at(120), Reason: "not yet"}, at(38)); err != nil {
		return step(err, "release")
	}
	// failed, then retried: pending again
	d, err = claim("retry.me", at(39))
	if err != nil {
		return step(err, "claim retry.me")
	}
	if _, err := q.FinishAt(ctx, d, work.Outcome{State: work.TaskFailed, Error: "once"}, at(40)); err != nil {
		return step(err, "fail retry.me")
	}
	if _, err := beta.RetryAt(ctx, d.Task.ID, at(41), at(41)); err != nil {
		return step(err, "retry")
	}
	// the email succeeds; its completion wake, and the cancel's, are claimed: one acknowledged, one leased
	d, err = claim("email", at(42))
	if err != nil {
		return step(err, "claim email")
	}
	if _, err := q.FinishAt(ctx, d, work.Outcome{State: work.TaskSucceeded, Summary: "sent", Output: json.RawMessage(`{"id":"m-1"}`)}, at(43)); err != nil {
		return step(err, "finish email")
	}
	ws, err = q.ClaimSessionWakesAt(ctx, []string{"alpha"}, at(44), time.Hour, 10)
	if err != nil || len(ws) == 0 {
		return step(fmt.Errorf("%d wakes, %v", len(ws), err), "claim alpha wakes")
	}
	if err := q.AckWakeAt(ctx, ws[0], at(45)); err != nil {
		return step(err, "ack alpha wake")
	}
	if _, err := q.ClaimSessionWakesAt(ctx, []string{"beta"}, at(46), time.Hour, 10); err != nil {
		return step(err, "claim beta wakes")
	}
	// requested wakes: one with a key, left available
	if _, err := beta.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"ping":1}`), IdempotencyKey: "ping-1"}, at(47)); err != nil {
		return step(err, "wake beta")
	}
	// the schedule's first tick, claimed by nothing yet: ClaimKinds of another kind submits it
	if _, err := q.ClaimKindsAt(ctx, []string{"nothing"}, at(81), time.Hour, 1); err != nil {
		return step(err, "tick")
	}
	return nil
}

// State is what Dump reads from a queue: enough to tell a misread of any record kind.
type State struct {
	Log       []string // every event of the log: "seq type json" (long values by their SHA-256)
	Tasks     map[string][]work.Task
	Schedules map[string][]work.Schedule
	Policies  map[string]work.KindPolicy
	Stats     work.QueueStats
}

// Dump reads q's state at now, with values of more than 1024 bytes by their SHA-256.
func Dump(ctx context.Context, q *work.Queue, now time.Time) (*State, error) {
	st := &State{Tasks: map[string][]work.Task{}, Schedules: map[string][]work.Schedule{}}
	err := q.ReadLog(ctx, 0, func(ev events.Event) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		st.Log = append(st.Log, fmt.Sprintf("%d %T %s", ev.Head().Seq, ev, short(b)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range Sessions {
		s := q.Session(id)
		ts, err := s.Tasks(ctx, work.TaskFilter{Limit: 1000})
		if err != nil {
			return nil, err
		}
		for i := range ts {
			ts[i].Input = json.RawMessage(short(ts[i].Input))
			if o := ts[i].Outcome; o != nil {
				o.Output = json.RawMessage(short(o.Output))
			}
		}
		st.Tasks[id] = ts
		if st.Schedules[id], err = s.Schedules(ctx); err != nil {
			return nil, err
		}
	}
	if st.Policies, err = q.KindPolicies(ctx); err != nil {
		return nil, err
	}
	if st.Stats, err = q.StatsAt(ctx, now); err != nil {
		return nil, err
	}
	return st, nil
}

// short is b, or, past 1024 bytes, a JSON string naming its length and SHA-256.
func short(b []byte) []byte {
	if len(b) <= 1024 {
		return b
	}
	sum := sha256.Sum256(b)
	return []byte(fmt.Sprintf(`"%d bytes, sha256 %s"`, len(b), hex.EncodeToString(sum[:])))
}

// Marshal renders a State as the indented JSON the golden files hold.
func Marshal(st *State) ([]byte, error) {
	b, err := json.MarshalIndent(st, "", "  ")
	return append(b, '\n'), err
}

// Check dumps q's state at now and compares it with the golden state stored in file (as
// Marshal writes it): nil when they are equal, else an error naming the file and listing the
// lines that differ. A test of every backend's golden store calls it after Open and Verify.
func Check(ctx context.Context, q *work.Queue, now time.Time, file string) error {
	st, err := Dump(ctx, q, now)
	if err != nil {
		return err
	}
	got, err := Marshal(st)
	if err != nil {
		return err
	}
	want, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if bytes.Equal(got, want) {
		return nil
	}
	return fmt.Errorf("the store reads a state other than %s:\n%s", file, lineDiff(want, got))
}

// lineDiff lists the lines where want and got differ (up to about 4 KB of them).
func lineDiff(want, got []byte) string {
	w, g := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	var out bytes.Buffer
	for i := 0; i < max(len(w), len(g)) && out.Len() < 4000; i++ {
		var a, b []byte
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if !bytes.Equal(a, b) {
			fmt.Fprintf(&out, "line %d:\n- %s\n+ %s\n", i+1, a, b)
		}
	}
	return out.String()
}
