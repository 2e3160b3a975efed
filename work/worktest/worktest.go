package worktest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// Harness makes the queues the suite runs against.
type Harness struct {
	// New returns a fresh, empty queue; the suite closes it.
	New func(t *testing.T) *work.Queue
	// Reopen returns a new queue over the same stored state as q. A durable backend closes q
	// and reopens its directory; the in-memory one wraps q's backend with work.New. The suite
	// uses only the returned queue afterwards, and closes both.
	Reopen func(t *testing.T, q *work.Queue) *work.Queue
	// MaxValueBytes is the largest JSON value New's queues accept; 0 means
	// work.DefaultMaxValueBytes.
	MaxValueBytes int
	// SubmitTx, when set, submits r for session in a transaction of the backend's own
	// (postgres.SubmitTx) and commits it, or rolls it back when commit is false, returning
	// SubmitTx's answer (a refused or conflicting submission's transaction is rolled back);
	// the SubmitTx scenarios skip without it.
	SubmitTx func(t *testing.T, q *work.Queue, session string, r work.TaskRequest, commit bool) (work.Task, error)
}

// scenario is one subtest of the suite.
type scenario struct {
	name string
	run  func(e *env)
}

func scenarios() []scenario {
	var all []scenario
	for _, group := range [][]scenario{
		seedScenarios(),
		taskScenarios(),
		wakeScenarios(),
		validationScenarios(),
		lifecycleScenarios(),
		logScenarios(),
		concurrencyScenarios(),
		runningScenarios(),
		pruneScenarios(),
		workerScenarios(),
		sessionWakeScenarios(),
		priorityScenarios(),
		followScenarios(),
		sessionScenarios(),
		scheduleScenarios(),
		inboxScenarios(),
		kindPolicyScenarios(),
	} {
		all = append(all, group...)
	}
	return all
}

// Run runs every scenario as a subtest of t against queues made by h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Reopen == nil {
		t.Fatal("worktest: Harness needs New and Reopen")
	}
	if h.MaxValueBytes == 0 {
		h.MaxValueBytes = work.DefaultMaxValueBytes
	}
	seen := map[string]bool{}
	for _, s := range scenarios() {
		if seen[s.name] {
			t.Fatalf("worktest: two scenarios named %s", s.name)
		}
		seen[s.name] = true
		t.Run(s.name, func(t *testing.T) {
			s.run(newEnv(t, h))
		})
	}
}

// The suite's clock: explicit instants, seconds after a fixed epoch, as the seed's instant().
var epoch = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

func at(sec int) time.Time { return epoch.Add(time.Duration(sec) * time.Second) }

// lease is the seed's LEASE.
const lease = 30 * time.Second

func js(s string) json.RawMessage { return json.RawMessage(s) }

// env is one subtest's world: the live queue and everything the suite has seen.
type env struct {
	t      *testing.T
	h      Harness
	ctx    context.Context
	q      *work.Queue   // the live queue
	opened []*work.Queue // every queue made, closed at the end
	tokens map[string]bool
	closed bool // the scenario closed q itself; the final Verify is skipped
}

func newEnv(t *testing.T, h Harness) *env {
	e := &env{t: t, h: h, ctx: context.Background(), tokens: map[string]bool{}}
	e.q = e.fresh()
	// Cleanups run last-in first-out: Verify the live queue, then close every queue.
	t.Cleanup(func() {
		for _, q := range e.opened {
			if err := q.Close(); err != nil {
				e.check(err)
				t.Errorf("Close at the end of the test: %v", err)
			}
		}
	})
	t.Cleanup(func() {
		if e.closed || e.q == nil {
			return
		}
		if err := e.q.Verify(context.Background()); err != nil {
			e.check(err)
			t.Errorf("consistency check after the test: %v", err)
		}
	})
	return e
}

// fresh returns a new empty queue from the harness, closed at the end of the test.
func (e *env) fresh() *work.Queue {
	e.t.Helper()
	q := e.h.New(e.t)
	if q == nil {
		e.t.Fatal("Harness.New returned nil")
	}
	e.opened = append(e.opened, q)
	return q
}

// reopen replaces the live queue with one reopened over the same state.
func (e *env) reopen() {
	e.t.Helper()
	q := e.h.Reopen(e.t, e.q)
	if q == nil {
		e.t.Fatal("Harness.Reopen returned nil")
	}
	e.opened = append(e.opened, q)
	e.q = q
}

// --- errors ---

// check verifies err against the error rules (CheckError) and that its text holds no lease
// token the suite has seen; it returns the detail, or nil when errors.As finds none.
func (e *env) check(err error) *work.Error {
	e.t.Helper()
	we, problem := CheckError(err)
	if problem != nil {
		e.t.Errorf("error %q breaks the error rules: %v", err, problem)
	}
	if err != nil {
		for tok := range e.tokens {
			if strings.Contains(err.Error(), tok) {
				e.t.Errorf("error text %q contains a lease token", err)
			}
		}
	}
	return we
}

// ok fails the test on an unexpected error.
func (e *env) ok(what string, err error) {
	e.t.Helper()
	if err != nil {
		e.check(err)
		e.t.Fatalf("%s: unexpected error: %v", what, err)
	}
}

// wantErr fails the test unless err is an error of kind; it returns the detail.
func (e *env) wantErr(what string, err, kind error) *work.Error {
	e.t.Helper()
	if err == nil {
		e.t.Fatalf("%s: no error, want %v", what, kind)
	}
	we := e.check(err)
	if !errors.Is(err, kind) {
		e.t.Fatalf("%s: got %v, want an error of kind %v", what, err, kind)
	}
	if we == nil {
		e.t.Fatalf("%s: errors.As finds no *work.Error in %v", what, err)
	}
	return we
}

// wantInvalid fails the test unless err is ErrInvalidRequest naming field.
func (e *env) wantInvalid(what string, err error, field string) *work.Error {
	e.t.Helper()
	we := e.wantErr(what, err, work.ErrInvalidRequest)
	if we.Field != field {
		e.t.Fatalf("%s: invalid field %q (%v), want %q", what, we.Field, err, field)
	}
	return we
}

// wantText fails the test unless err's text is exactly want.
func (e *env) wantText(what string, err error, want string) {
	e.t.Helper()
	if err == nil || err.Error() != want {
		e.t.Errorf("%s: error text %q, want %q", what, err, want)
	}
}

// --- calls ---

func (e *env) session(id string) *work.Session { return e.q.Session(id) }

func (e *env) submit(session string, r work.TaskRequest, now time.Time) work.Task {
	e.t.Helper()
	task, err := e.q.Session(session).SubmitAt(e.ctx, r, now)
	e.ok("SubmitAt", err)
	if !strings.HasPrefix(task.ID, "task_") {
		e.t.Errorf("task id %q lacks the task_ prefix", task.ID)
	}
	if task.SessionID != session {
		e.t.Errorf("task %s session %q, want %q", task.ID, task.SessionID, session)
	}
	return task
}

func (e *env) submitErr(session string, r work.TaskRequest, now time.Time) error {
	e.t.Helper()
	task, err := e.q.Session(session).SubmitAt(e.ctx, r, now)
	if err == nil {
		e.t.Fatalf("SubmitAt(%+v) succeeded with task %s, want an error", r, task.ID)
	}
	e.zeroOnError("SubmitAt", task)
	return err
}

func (e *env) task(session, id string) (work.Task, bool) {
	e.t.Helper()
	task, found, err := e.q.Session(session).Task(e.ctx, id)
	e.ok("Task", err)
	if !found && !isZero(task) {
		e.t.Errorf("Task(%s) not found but returned %+v, want the zero Task", id, task)
	}
	return task, found
}

// mustTask reads a task that must exist.
func (e *env) mustTask(session, id string) work.Task {
	e.t.Helper()
	task, found := e.task(session, id)
	if !found {
		e.t.Fatalf("task %s not found in session %s", id, session)
	}
	return task
}

func (e *env) cancel(session, id string, now time.Time) work.Task {
	e.t.Helper()
	task, err := e.q.Session(session).CancelAt(e.ctx, id, now)
	e.ok("CancelAt", err)
	return task
}

func (e *env) claim(now time.Time, leaseFor time.Duration, limit int) []work.TaskDelivery {
	e.t.Helper()
	ds, err := e.q.ClaimDueAt(e.ctx, now, leaseFor, limit)
	e.ok("ClaimDueAt", err)
	if len(ds) > limit {
		e.t.Fatalf("ClaimDueAt(limit %d) returned %d deliveries", limit, len(ds))
	}
	for _, d := range ds {
		e.noteToken(d.LeaseToken())
		e.noLeak(d, d.LeaseToken())
		if d.Attempt == 0 || d.Attempt != d.Task.Attempts {
			e.t.Errorf("delivery of %s: attempt %d, task attempts %d", d.Task.ID, d.Attempt, d.Task.Attempts)
		}
		if d.Task.State != work.TaskRunning {
			e.t.Errorf("delivery of %s: task state %s, want running", d.Task.ID, d.Task.State)
		}
		if !d.LeaseExpiresAt.Equal(now.Add(leaseFor)) {
			e.t.Errorf("delivery of %s: lease expires %v, want %v", d.Task.ID, d.LeaseExpiresAt, now.Add(leaseFor))
		}
	}
	return ds
}

// claimOne claims with limit 1 and requires a delivery.
func (e *env) claimOne(now time.Time) work.TaskDelivery {
	e.t.Helper()
	ds := e.claim(now, lease, 1)
	if len(ds) != 1 {
		e.t.Fatalf("ClaimDueAt(%v) claimed %d tasks, want 1", now, len(ds))
	}
	return ds[0]
}

// claimNone requires that nothing is due at now.
func (e *env) claimNone(now time.Time) {
	e.t.Helper()
	if ds := e.claim(now, lease, 100); len(ds) != 0 {
		e.t.Fatalf("ClaimDueAt(%v) claimed %d tasks (first %s attempt %d), want none",
			now, len(ds), ds[0].Task.ID, ds[0].Attempt)
	}
}

func (e *env) finish(d work.TaskDelivery, o work.Outcome, now time.Time) work.Task {
	e.t.Helper()
	task, err := e.q.FinishAt(e.ctx, d, o, now)
	e.ok("FinishAt", err)
	if !task.State.Terminal() || task.Outcome == nil {
		e.t.Errorf("FinishAt returned task %s in state %s with outcome %v", task.ID, task.State, task.Outcome)
	}
	return task
}

func (e *env) finishErr(d work.TaskDelivery, o work.Outcome, now time.Time) error {
	e.t.Helper()
	task, err := e.q.FinishAt(e.ctx, d, o, now)
	if err == nil {
		e.t.Fatalf("FinishAt(%s attempt %d) succeeded, want an error", d.Task.ID, d.Attempt)
	}
	e.zeroOnError("FinishAt", task)
	return err
}

func (e *env) wake(session string, r work.WakeRequest, now time.Time) work.Wake {
	e.t.Helper()
	w, err := e.q.Session(session).WakeAt(e.ctx, r, now)
	e.ok("WakeAt", err)
	if !strings.HasPrefix(w.ID, "wake_") {
		e.t.Errorf("wake id %q lacks the wake_ prefix", w.ID)
	}
	if w.SessionID != session || w.Reason.Kind != work.WakeRequested {
		e.t.Errorf("WakeAt returned %+v for session %s", w, session)
	}
	return w
}

func (e *env) wakeErr(session string, r work.WakeRequest, now time.Time) error {
	e.t.Helper()
	w, err := e.q.Session(session).WakeAt(e.ctx, r, now)
	if err == nil {
		e.t.Fatalf("WakeAt succeeded with wake %s, want an error", w.ID)
	}
	e.zeroOnError("WakeAt", w)
	return err
}

func (e *env) claimWakes(now time.Time, leaseFor time.Duration, limit int) []work.WakeDelivery {
	e.t.Helper()
	ds, err := e.q.ClaimWakesAt(e.ctx, now, leaseFor, limit)
	e.ok("ClaimWakesAt", err)
	if len(ds) > limit {
		e.t.Fatalf("ClaimWakesAt(limit %d) returned %d deliveries", limit, len(ds))
	}
	for _, d := range ds {
		e.noteToken(d.LeaseToken())
		e.noLeak(d, d.LeaseToken())
		if d.Attempt == 0 {
			e.t.Errorf("wake delivery of %s: attempt 0", d.Wake.ID)
		}
		if !d.LeaseExpiresAt.Equal(now.Add(leaseFor)) {
			e.t.Errorf("wake delivery of %s: lease expires %v, want %v", d.Wake.ID, d.LeaseExpiresAt, now.Add(leaseFor))
		}
		if !strings.HasPrefix(d.Wake.ID, "wake_") {
			e.t.Errorf("wake id %q lacks the wake_ prefix", d.Wake.ID)
		}
	}
	return ds
}

func (e *env) claimWakeOne(now time.Time) work.WakeDelivery {
	e.t.Helper()
	ds := e.claimWakes(now, lease, 1)
	if len(ds) != 1 {
		e.t.Fatalf("ClaimWakesAt(%v) claimed %d wakes, want 1", now, len(ds))
	}
	return ds[0]
}

func (e *env) claimWakeNone(now time.Time) {
	e.t.Helper()
	if ds := e.claimWakes(now, lease, 100); len(ds) != 0 {
		e.t.Fatalf("ClaimWakesAt(%v) claimed %d wakes (first %s attempt %d), want none",
			now, len(ds), ds[0].Wake.ID, ds[0].Attempt)
	}
}

func (e *env) ack(d work.WakeDelivery, now time.Time) error {
	e.t.Helper()
	err := e.q.AckWakeAt(e.ctx, d, now)
	if err != nil {
		e.check(err)
	}
	return err
}

// --- checks ---

// noteToken records a fresh lease token; tokens are non-empty and unique per attempt.
func (e *env) noteToken(tok string) {
	e.t.Helper()
	if tok == "" {
		e.t.Error("delivery with an empty lease token")
		return
	}
	if e.tokens[tok] {
		e.t.Error("a lease token was handed out twice")
	}
	e.tokens[tok] = true
}

// leakVerbs are the fmt verbs a delivery is printed with; none may show its token.
var leakVerbs = []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"}

// noLeak checks that fmt never prints tok for v, its pointer, or a slice holding it.
func (e *env) noLeak(v any, tok string) {
	e.t.Helper()
	if tok == "" {
		return
	}
	hexTok := hex.EncodeToString([]byte(tok))
	for _, form := range []any{v, []any{v}} {
		for _, verb := range leakVerbs {
			out := fmt.Sprintf(verb, form)
			if strings.Contains(out, tok) || strings.Contains(strings.ToLower(out), hexTok) {
				e.t.Errorf("fmt %s of %T prints its lease token", verb, v)
			}
		}
	}
	switch d := v.(type) {
	case work.TaskDelivery:
		for _, verb := range leakVerbs {
			if out := fmt.Sprintf(verb, &d); strings.Contains(out, tok) {
				e.t.Errorf("fmt %s of *TaskDelivery prints its lease token", verb)
			}
		}
		if out := fmt.Sprint([]work.TaskDelivery{d}); strings.Contains(out, tok) {
			e.t.Error("fmt of []TaskDelivery prints a lease token")
		}
	case work.WakeDelivery:
		for _, verb := range leakVerbs {
			if out := fmt.Sprintf(verb, &d); strings.Contains(out, tok) {
				e.t.Errorf("fmt %s of *WakeDelivery prints its lease token", verb)
			}
		}
		if out := fmt.Sprint([]work.WakeDelivery{d}); strings.Contains(out, tok) {
			e.t.Error("fmt of []WakeDelivery prints a lease token")
		}
	}
}

// zeroOnError checks that a failed call returned the zero value beside its error.
func (e *env) zeroOnError(what string, v any) {
	e.t.Helper()
	if !isZero(v) {
		e.t.Errorf("%s failed but returned %+v, want the zero value", what, v)
	}
}

func isZero(v any) bool {
	switch v := v.(type) {
	case work.Task:
		return v.ID == "" && v.SessionID == "" && v.Kind == "" && v.Input == nil && v.State == 0 &&
			v.CancelRequestedAt.IsZero() && v.IdempotencyKey == "" && v.ScheduledAt.IsZero() &&
			v.CreatedAt.IsZero() && v.Attempts == 0 && v.FinishedAt.IsZero() && v.Outcome == nil
	case work.Wake:
		return v.ID == "" && v.SessionID == "" && v.Reason.Kind == 0 && v.Reason.Payload == nil &&
			v.Reason.TaskID == "" && v.Reason.State == 0 && v.Reason.Outcome == nil &&
			v.CreatedAt.IsZero() && v.IdempotencyKey == ""
	}
	panic(fmt.Sprintf("isZero: %T", v))
}

func (e *env) eqTime(what string, got, want time.Time) {
	e.t.Helper()
	if !got.Equal(want) {
		e.t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// eqJSON compares stored JSON byte for byte: values are stored as given.
func (e *env) eqJSON(what string, got json.RawMessage, want string) {
	e.t.Helper()
	if string(got) != want {
		e.t.Errorf("%s = %s, want %s (stored as given)", what, got, want)
	}
}

func (e *env) eqState(what string, got, want work.TaskState) {
	e.t.Helper()
	if got != want {
		e.t.Errorf("%s state = %s, want %s", what, got, want)
	}
}

// eqOutcome compares outcomes field by field; JSON output byte for byte.
func (e *env) eqOutcome(what string, got *work.Outcome, want work.Outcome) {
	e.t.Helper()
	if got == nil {
		e.t.Errorf("%s outcome = nil, want %+v", what, want)
		return
	}
	wantOut := string(want.Output)
	if want.State == work.TaskSucceeded && want.Output == nil {
		wantOut = "null"
	}
	if got.State != want.State || got.Summary != want.Summary || got.Error != want.Error || string(got.Output) != wantOut {
		e.t.Errorf("%s outcome = {%s %q %s %q}, want {%s %q %s %q}", what,
			got.State, got.Summary, got.Output, got.Error, want.State, want.Summary, wantOut, want.Error)
	}
}

// sameTask compares two snapshots of a task field by field, times as instants.
func (e *env) sameTask(what string, got, want work.Task) {
	e.t.Helper()
	if got.ID != want.ID || got.SessionID != want.SessionID || got.Kind != want.Kind ||
		string(got.Input) != string(want.Input) || got.State != want.State ||
		!got.CancelRequestedAt.Equal(want.CancelRequestedAt) || got.IdempotencyKey != want.IdempotencyKey ||
		!got.ScheduledAt.Equal(want.ScheduledAt) || !got.CreatedAt.Equal(want.CreatedAt) ||
		got.Attempts != want.Attempts || !got.FinishedAt.Equal(want.FinishedAt) ||
		(got.Outcome == nil) != (want.Outcome == nil) {
		e.t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
		return
	}
	if want.Outcome != nil {
		e.eqOutcome(what, got.Outcome, *want.Outcome)
	}
}

// --- the event log ---

// logLen is the number of events in the live queue's log.
func (e *env) logLen() int {
	e.t.Helper()
	return len(e.since(0))
}

// since returns the events after the first n.
func (e *env) since(n int) []events.Event {
	e.t.Helper()
	var out []events.Event
	err := e.q.ReadLog(e.ctx, uint64(n)+1, func(ev events.Event) error {
		out = append(out, ev)
		return nil
	})
	e.ok("ReadLog", err)
	for i, ev := range out {
		if want := uint64(n + 1 + i); ev.Head().Seq != want {
			e.t.Fatalf("ReadLog: event %d has seq %d, want %d", i, ev.Head().Seq, want)
		}
	}
	return out
}

func typesOf(evs []events.Event) []events.Type {
	out := make([]events.Type, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type()
	}
	return out
}

// appended requires that the events after the first n have exactly the given types.
func (e *env) appended(what string, n int, want ...events.Type) []events.Event {
	e.t.Helper()
	evs := e.since(n)
	got := typesOf(evs)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		e.t.Fatalf("%s appended %v, want %v", what, got, want)
	}
	return evs
}

// nothingAppended requires that the log still has n events.
func (e *env) nothingAppended(what string, n int) {
	e.t.Helper()
	e.appended(what, n)
}
