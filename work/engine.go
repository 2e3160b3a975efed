package work

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"math"
	"time"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
)

// engine is the storage seam under the event-sourced backend (internal/engine has its
// contract). The in-memory engine and the Pebble engine implement it, and so does the
// PostgreSQL backend; the decide code below is the same for all, so they behave alike by
// construction.
type engine = engineapi.Engine

// txn is the write side of one command.
type txn = engineapi.Txn

// logBackend is worklog's event-sourced Backend: each command validates (in Queue), decides
// the events it causes from the current projection, appends them and applies them.
type logBackend struct {
	// eng is the engine. Commands commit through update (wait.go), never eng.Update
	// directly, so that their events signal the waiters (hub).
	eng      engine
	caps     engineCaps // eng's optional interfaces, resolved once (newEngineQueue)
	hub      *waitHub   // the waiters of this backend (wait.go)
	ids      *idSource
	maxValue int
	clock    func() time.Time // the queue's clock (Queue.now): the seed's clock-less AckWake, a waiter's timer; never decide
	// ownedValueMin: the engine's reads hand out values longer than this that nothing else
	// references (pebblelog.OwnedValueMin), so snapshots take them without a copy; 0: every
	// value is copied (the in-memory engine's values live in its state).
	ownedValueMin int
	// ownedOutputMin: likewise for a task's output read by the decide code, from this length
	// (pebblelog.OwnedOutputMin: such an output is in no record and no cache); 0: copied.
	ownedOutputMin int
	// borrowedInputMin: a task input longer than this goes to the command as the caller's
	// own bytes, not a copy (engineapi.Config.BorrowedInputMin); 0: always copied.
	borrowedInputMin int
}

// ownInput is ownValue for a task input of a batch (SubmitMany): the caller's own bytes
// when the engine copies an input of this length and keeps no reference to it once the
// command has returned (borrowedInputMin), where a copy would cost the batch's bytes once
// more. The results may then share them, as a staged value's snapshot does.
func (b *logBackend) ownInput(v []byte, staged bool) []byte {
	if b.borrowedInputMin > 0 && len(v) > b.borrowedInputMin {
		return v
	}
	return ownValue(v, staged)
}

// valueStager is an engine that stores a command's large values before the command is queued
// (the Pebble engine: pebblelog.Store.StageValues writes each to a blob file of its own), so
// that their write and fsync are not paid inside the single writer.
type valueStager interface {
	StageValues(values ...[]byte) (release func(), err error)
}

// stageMin is the smallest value worth staging (pebblelog.BlobMin): smaller ones go into the
// command's batch, and a command with none of this size costs no call.
const stageMin = pebblelog.BlobMin

// stage stages the command's large values where the engine can; release is called once the
// command's Update has returned. staged says they were: each value of stageMin bytes or more
// is then in a blob file already, and the store keeps nothing of it in memory once the
// command is done.
func (b *logBackend) stage(values ...[]byte) (release func(), staged bool, err error) {
	big := false
	for _, v := range values {
		big = big || len(v) >= stageMin
	}
	if !big {
		return noRelease, false, nil
	}
	if b.caps.stager == nil {
		return noRelease, false, nil
	}
	release, err = b.caps.stager.StageValues(values...)
	return release, err == nil, backendErr(err)
}

// ownValue is the request's value v as its command appends it: v itself when it was staged
// (stage), else a copy the caller cannot change (ownJSON). A staged value is in its blob
// file, durable before the command is queued, and nothing of the store refers to v once the
// command is done, except the snapshot the call returns: so that snapshot shares the caller's
// own bytes instead of a copy of up to 64 MiB (TestLargeValueMemory).
func ownValue(v []byte, staged bool) []byte {
	if staged && len(v) >= stageMin {
		return v
	}
	return ownJSON(v)
}

func noRelease() {}

// worklog's backend implements every optional interface of Backend, so New over it is a full
// queue (TestNewGetsEveryCapabilityOfItsBackend).
var (
	_ Backend        = (*logBackend)(nil)
	_ RunningBackend = (*logBackend)(nil)
	_ WakeAckerAt    = (*logBackend)(nil)
	_ LogReader      = (*logBackend)(nil)
	_ Verifier       = (*logBackend)(nil)
	_ Pruner         = (*logBackend)(nil)
	_ Waiter         = (*logBackend)(nil)
	_ Checkpointer   = (*logBackend)(nil)
	_ Clock          = (*logBackend)(nil)
)

// --- snapshots ---

func (b *logBackend) taskSnapshot(t *projection.Task) Task { return b.taskSnapshotOf(t, false) }

// taskSnapshotOf is t as a snapshot. viewed says t came from the engine's view: a durable
// engine's view decodes each record afresh from the disk, so its output is the reader's own
// too (pebblelog.OwnedValueMin); in the decide code's reads a task's output may be in
// pebblelog's record cache, and is copied.
func (b *logBackend) taskSnapshotOf(t *projection.Task, viewed bool) Task {
	out := Task{
		ID: t.ID, SessionID: t.SessionID, Kind: t.Kind,
		Input:           b.value(t.Input),
		State:           TaskState(t.State),
		IdempotencyKey:  t.IdempotencyKey,
		ScheduledAt:     fromNanos(t.ScheduledAt),
		CreatedAt:       fromNanos(t.CreatedAt),
		Attempts:        t.Attempts,
		AttemptsAtRetry: t.AttemptsAtRetry,
		Priority:        int(t.Priority),
		Headers:         cloneHeaders(t.Headers),
	}
	if t.CancelRequested {
		out.CancelRequestedAt = fromNanos(t.CancelRequestedAt)
	}
	if t.State.Terminal() {
		out.FinishedAt = fromNanos(t.FinishedAt)
		owned := b.ownedOutputMin > 0 && len(t.Outcome.Output) >= b.ownedOutputMin
		if !viewed && !owned {
			out.Outcome = new(outcomeFrom(t.Outcome))
			return out
		}
		to := t.Outcome
		to.Output = nil // not copied here: b.value decides
		o := outcomeFrom(to)
		if o.State == TaskSucceeded {
			o.Output = b.value(t.Outcome.Output)
		}
		out.Outcome = &o
	}
	return out
}

// jsonValue is a stored JSON value as a copy for a snapshot; an empty one reads as null.
func jsonValue(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return bytes.Clone(b)
}

// value is a stored input, payload or completion output as a snapshot's field: the bytes the
// engine read, when they are the reader's own, else a copy (jsonValue). A durable engine's
// reads decode a large value afresh from its event for each command (pebblelog.OwnedValueMin)
// and keep nothing of it, so copying it again only added one more copy of a value of up to
// 64 MiB to every claim, finish and read (TestLargeValueMemory). The in-memory engine's
// values are its state, and a small durable one may be in pebblelog's record cache: those
// are copied, so that a caller changing its snapshot changes nothing else.
func (b *logBackend) value(v []byte) []byte {
	if b.ownedValueMin > 0 && len(v) > b.ownedValueMin {
		return v
	}
	return jsonValue(v)
}

func outcomeFrom(o events.Outcome) Outcome {
	out := Outcome{State: TaskState(o.State), Summary: o.Summary, Error: o.Error}
	if o.State == events.StateSucceeded {
		out.Output = jsonValue(o.Output)
	}
	return out
}

// outcomeToOwned is o as an event's outcome, its output taken as ownValue takes it.
func outcomeToOwned(o Outcome, staged bool) events.Outcome {
	out := events.Outcome{State: events.TaskState(o.State), Summary: o.Summary, Error: o.Error}
	if o.State == TaskSucceeded {
		out.Output = ownValue(o.Output, staged)
	}
	return out
}

func sameOutcome(a events.Outcome, b events.Outcome) bool {
	return a.State == b.State && a.Summary == b.Summary && a.Error == b.Error &&
		(a.State != events.StateSucceeded || sameJSON(a.Output, b.Output))
}

func (b *logBackend) wakeSnapshot(w *projection.Wake) Wake {
	out := Wake{ID: w.ID, SessionID: w.SessionID, CreatedAt: fromNanos(w.CreatedAt), IdempotencyKey: w.IdempotencyKey}
	switch w.Reason {
	case events.WakeRequested:
		out.Reason = WakeReason{Kind: WakeRequested, Payload: b.value(w.Payload)}
	case events.WakeTaskFinished:
		wo := w.Outcome
		wo.Output = nil // not copied here: b.value decides
		o := outcomeFrom(wo)
		if o.State == TaskSucceeded {
			o.Output = b.value(w.Outcome.Output)
		}
		out.Reason = WakeReason{Kind: WakeTaskFinished, TaskID: w.TaskID, State: o.State, Outcome: &o}
	}
	return out
}

// taskRequestDiffers is the seed's request equality (kind, input as a JSON value, schedule,
// key and wake policy) and the priority; never the headers, answered with the first field of the intent in which r differs from
// the task the key names, by its request field name; "" when r is the same request. The
// idempotency conflict names that field, so a caller sees what changed (a recomputed RunAt
// is the usual trap).
func taskRequestDiffers(t *projection.Task, r *TaskRequest, runAt int64) string {
	switch {
	case t.Kind != r.Kind:
		return "kind"
	case t.HasRunAt != !r.RunAt.IsZero() || (t.HasRunAt && t.RunAt != runAt):
		return "run_at"
	case t.WakeOnCompletion != (r.Wake == WakeOnCompletion):
		return "wake"
	case t.Priority != int64(r.Priority):
		return "priority"
	case !sameJSON(t.Input, jsonOrNull(r.Input)):
		return "input"
	}
	return "" // the key is the same: it is how the task was found
}

// --- commands ---

func (b *logBackend) Submit(ctx context.Context, sessionID string, r TaskRequest, now time.Time) (Task, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	// The new task's id is drawn first, whether a repeat uses it or not: the ids a seeded
	// source gives are then the same on every backend for the same calls (replay's
	// cross-backend tests compare them), whichever way a repeat is answered.
	newID, idErr := b.ids.id("task", at)
	if idErr != nil {
		return Task{}, backendErr(idErr)
	}
	if r.IdempotencyKey != "" && b.caps.viewer != nil && b.caps.viewer.ReadFirst(false) {
		// A repeat is answered by a read before anything else is prepared: no headers
		// copied, no command queued.
		rr := &taskRepeat{b: b, sessionID: sessionID, r: &r}
		if rr.runAt, verr = runAtNanos(&r); verr != nil {
			return Task{}, verr
		}
		if rr.readDurable(ctx) {
			return rr.out, rr.derr
		}
	}
	p, perr := prepareRequest(&r)
	if perr != nil {
		return Task{}, perr
	}
	p.newID = newID
	// The input is copied (and a large one staged) once, before the command is queued: the
	// command appends this very slice however often it runs.
	release, staged, serr := b.stage(r.Input)
	if serr != nil {
		return Task{}, serr
	}
	defer release()
	p.input = ownValue(r.Input, staged)
	var out Task
	var derr error
	err := b.update(ctx, func(tx txn) error {
		var err error
		out, derr, err = b.submitIn(tx, sessionID, &p, at) // fn may run twice: all three set afresh
		return err
	})
	return result(out, derr, err)
}

// taskRepeat is a keyed Submit read first from durable state (readRepeat's work for a task,
// in one allocation): the answer when the key names a task, equal request or not.
type taskRepeat struct {
	b         *logBackend
	sessionID string
	r         *TaskRequest
	runAt     int64
	out       Task
	derr      error
	found     bool
}

// readDurable reports whether the key's task answered the submit (out, derr set): false for
// a new key, a failed read or one that saw state not yet durable; the command decides then.
func (rr *taskRepeat) readDurable(ctx context.Context) bool {
	durable, err := rr.b.caps.viewer.ViewDurable(ctx, rr.read)
	if err != nil || !rr.found || !durable {
		rr.out, rr.derr = Task{}, nil
		return false
	}
	return true
}

func (rr *taskRepeat) read(r projection.Reader) error {
	rr.out, rr.derr, rr.found = Task{}, nil, false
	id, err := r.TaskKey(rr.sessionID, rr.r.IdempotencyKey)
	if err != nil || id == "" {
		return err
	}
	t, err := mustTask(r, id)
	if err != nil {
		return err
	}
	rr.found = true
	if field := taskRequestDiffers(t, rr.r, rr.runAt); field != "" {
		rr.derr = conflict(rr.r.IdempotencyKey, field, t.ID)
		return nil
	}
	rr.out = rr.b.taskSnapshotOf(t, true)
	return nil
}

// runAtNanos is r's RunAt in nanoseconds; 0 when it has none.
func runAtNanos(r *TaskRequest) (int64, *Error) {
	if r.RunAt.IsZero() {
		return 0, nil
	}
	return nanos("run_at", r.RunAt)
}

// preparedSubmit is one submit request made ready off the writer's path: its run-at in
// nanoseconds, the id a new task gets, and its input as the command appends it.
type preparedSubmit struct {
	r       *TaskRequest
	runAt   int64
	newID   string
	input   []byte
	headers map[string]string // a copy: the caller may change its map afterwards
	// borrowed: input is the caller's own bytes (ownInput), which the new task's snapshot
	// takes as they are.
	borrowed bool
}

// prepareSubmit converts r's times and draws the id its task gets if the submit makes one
// (before the command is queued: randomness stays off the single writer's path; an
// idempotent repeat simply does not use it). The caller sets input.
func (b *logBackend) prepareSubmit(r *TaskRequest, at int64) (preparedSubmit, error) {
	p, verr := prepareRequest(r)
	if verr != nil {
		return p, verr
	}
	id, err := b.ids.id("task", at)
	if err != nil {
		return p, backendErr(err)
	}
	p.newID = id
	return p, nil
}

// prepareRequest is prepareSubmit without the new id (SubmitMany draws them all at once).
func prepareRequest(r *TaskRequest) (preparedSubmit, error) {
	p := preparedSubmit{r: r, headers: cloneHeaders(r.Headers)}
	var verr *Error
	if p.runAt, verr = runAtNanos(r); verr != nil {
		return p, verr
	}
	return p, nil
}

// submitIn decides one submit inside a command (Submit, SubmitMany): the task it makes or
// the one its key names, or the domain error (a conflict); the last error is the engine's,
// which fails the command.
func (b *logBackend) submitIn(tx txn, sessionID string, p *preparedSubmit, at int64) (Task, error, error) {
	var out Task
	var derr error
	r := p.r
	differs := func(t *projection.Task) (string, string) { return taskRequestDiffers(t, r, p.runAt), t.ID }
	if found, err := repeat(tx, sessionID, r.IdempotencyKey, projection.Reader.TaskKey, mustTask, differs, b.taskSnapshot, &out, &derr); found || err != nil {
		return out, derr, err
	}
	ev := &events.TaskSubmitted{
		Header: events.Header{SessionID: sessionID, At: at},
		TaskID: p.newID, Kind: r.Kind, Input: p.input,
		HasRunAt: !r.RunAt.IsZero(), RunAt: p.runAt,
		IdempotencyKey: r.IdempotencyKey, WakeOnCompletion: r.Wake == WakeOnCompletion,
		Priority: int64(r.Priority), Headers: p.headers,
	}
	if err := tx.Append(ev); err != nil {
		return Task{}, nil, err
	}
	t, err := mustTask(tx, p.newID)
	if err != nil {
		return Task{}, nil, err
	}
	if p.borrowed { // the caller's own bytes: the snapshot shares them rather than copy them
		c := *t
		c.Input = nil
		out = b.taskSnapshot(&c)
		out.Input = p.input
		return out, nil, nil
	}
	return b.taskSnapshot(t), nil, nil
}

func (b *logBackend) Task(ctx context.Context, sessionID, taskID string) (Task, bool, error) {
	var out Task
	var found bool
	err := b.eng.View(ctx, func(r projection.Reader) error {
		t, err := r.Task(taskID)
		if err != nil || t == nil || t.SessionID != sessionID {
			return err
		}
		out, found = b.taskSnapshotOf(t, true), true
		return nil
	})
	if err != nil {
		return Task{}, false, backendErr(err)
	}
	return out, found, nil
}

func (b *logBackend) Cancel(ctx context.Context, sessionID, taskID string, now time.Time) (Task, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	var out Task
	var derr error
	// A completion wake may be recorded: its id is drawn before the command is queued.
	wakeID, idErr := b.ids.id("wake", at)
	if idErr != nil {
		return Task{}, backendErr(idErr)
	}
	err := b.update(ctx, func(tx txn) error {
		out, derr = Task{}, nil // fn may run twice (engine.update)
		t, err := tx.Task(taskID)
		if err != nil {
			return err
		}
		if t == nil || t.SessionID != sessionID {
			derr = notFound(taskID)
			return nil
		}
		// A terminal task, or a running one whose cancel is already recorded, is unchanged:
		// the first request's time is kept and nothing is appended.
		if t.State.Terminal() || t.CancelRequested && t.State == events.StateRunning {
			out = b.taskSnapshot(t)
			return nil
		}
		h := events.Header{SessionID: sessionID, At: at}
		if err := tx.Append(&events.TaskCancelRequested{Header: h, TaskID: taskID}); err != nil {
			return err
		}
		// A pending task is canceled at once, and then its policy may ask for a wake; a
		// running one only records the request.
		out, _, err = b.settled(tx, taskID, wakeID, at)
		return err
	})
	return result(out, derr, err)
}

func completionWake(tx txn, id string, t *projection.Task, at int64) error {
	return tx.Append(&events.WakeRecorded{
		Header: events.Header{SessionID: t.SessionID, At: at},
		WakeID: id, Reason: events.WakeTaskFinished, TaskID: t.ID, Outcome: t.Outcome,
	})
}

func (b *logBackend) ClaimDue(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	if claimed, err, ok := b.forwardClaim(ctx, nil, now, leaseFor, limit); ok {
		return claimed, err
	}
	return claim(ctx, b, now, leaseFor, limit, dueScan, "lease", b.claimTask)
}

// claimTask claims the task id, which a scan found eligible at at, as ClaimDue,
// ClaimKinds and SettleAndClaim do: the next attempt, with token until expires.
func (b *logBackend) claimTask(tx txn, id string, at, expires int64, token, worker string) (TaskDelivery, error) {
	t, err := mustTask(tx, id)
	if err != nil {
		return TaskDelivery{}, err
	}
	ev := &events.TaskClaimed{
		Header: events.Header{SessionID: t.SessionID, At: at},
		TaskID: id, Attempt: t.Attempts + 1, LeaseToken: token, LeaseExpiresAt: expires, Worker: worker,
	}
	if err := tx.Append(ev); err != nil {
		return TaskDelivery{}, err
	}
	if t, err = mustTask(tx, id); err != nil {
		return TaskDelivery{}, err
	}
	d := NewTaskDelivery(b.taskSnapshot(t), ev.Attempt, fromNanos(expires), token)
	d.Worker = worker
	return d, nil
}

// scanFunc is a scan of an eligibility index for a claim: the due index's or the wake
// index's (indexScan), or ClaimKinds' merge of the kinds' due indexes.
type scanFunc = func(tx txn, maxAt int64, fn func(projection.IndexEntry) bool) error

// indexScan is the scan of index ix, of one partition.
func indexScan(ix projection.Index) scanFunc {
	return func(tx txn, maxAt int64, fn func(projection.IndexEntry) bool) error {
		return tx.ScanIndex(ix, "", math.MinInt64, maxAt, fn)
	}
}

// claimFunc claims one id that a scan found (claimTask, or the wake's in ClaimWakes).
type claimFunc[D any] = func(tx txn, id string, at, expires int64, token, worker string) (D, error)

// claim is ClaimDue, ClaimWakes and ClaimKinds: in one command it claims up to limit ids
// that scan finds eligible at now (claimIn), with a lease until now+leaseFor.
func claim[D any](ctx context.Context, b *logBackend, now time.Time, leaseFor time.Duration, limit int,
	scan scanFunc, purpose string, claimOne claimFunc[D],
) ([]D, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return nil, verr
	}
	expires, verr := leaseExpiry(at, leaseFor)
	if verr != nil {
		return nil, verr
	}
	worker := workerOf(ctx)
	var out []D
	err := b.update(ctx, func(tx txn) error {
		var err error
		out, err = claimIn(tx, b, at, expires, worker, limit, scan, purpose, claimOne, out[:0]) // fn may run twice (engine.update)
		return err
	})
	if err != nil {
		return nil, backendErr(err)
	}
	return out, nil
}

// claimIn is the claim loop inside a command: it collects up to limit ids that scan finds
// eligible at at, then claims each for worker (claimOne appends the claim event and returns
// the delivery) with a fresh token drawn for purpose, appending the deliveries to out.
func claimIn[D any](tx txn, b *logBackend, at, expires int64, worker string, limit int, scan scanFunc, purpose string,
	claimOne claimFunc[D], out []D,
) ([]D, error) {
	// A task claim first submits the schedules' due ticks (schedules.go), so it can take them.
	if purpose == "lease" {
		if err := b.submitTicks(tx, at); err != nil {
			return out, err
		}
	}
	// Collect first: each claim moves its entry, which would disturb the scan.
	var ids []string
	err := scan(tx, at, func(e projection.IndexEntry) bool {
		ids = append(ids, e.ID)
		return len(ids) < limit
	})
	if err != nil {
		return out, err
	}
	for _, id := range ids {
		token, err := b.ids.token(purpose)
		if err != nil {
			return out, err
		}
		d, err := claimOne(tx, id, at, expires, token, worker)
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

// rejectReason classifies a stale settlement or acknowledgment for the audit record: claimed
// says whether a claim holds the subject now, attempts how many were handed out. Whether one
// may be recorded at all is the record's RejectionRecordable.
func rejectReason(claimed bool, attempts, presented uint32) events.RejectReason {
	switch {
	case !claimed:
		return events.RejectNotClaimed
	case presented < attempts:
		return events.RejectSuperseded
	default:
		return events.RejectTokenMismatch
	}
}

func (b *logBackend) Finish(ctx context.Context, d TaskDelivery, o Outcome, now time.Time) (Task, error) {
	if t, err, ok := b.forwardFinish(ctx, d, o, now); ok {
		return t, err
	}
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	// A completion wake may be recorded: its id is drawn before the command is queued.
	wakeID, idErr := b.ids.id("wake", at)
	if idErr != nil {
		return Task{}, backendErr(idErr)
	}
	var release func()
	var staged bool
	if o.State == TaskSucceeded {
		var serr error
		release, staged, serr = b.stage(o.Output) // the settle event and the completion wake share it
		if serr != nil {
			return Task{}, serr
		}
		defer release()
	}
	eo := outcomeToOwned(o, staged)
	var r SettleResult
	err := b.update(ctx, func(tx txn) error {
		var err error
		r, err = b.finishIn(tx, d, eo, wakeID, at) // fn may run twice: both set afresh
		return err
	})
	return result(r.Task, r.Err, err)
}

// finishIn decides a Finish inside a command (Finish, SettleAndClaim): the task afterwards
// and the seq of the task_settled event it appended (0 for a repeat, which appends none), or
// the domain error (with Seq 0, even when a task_settle_rejected event was recorded); the
// error returned is the engine's, which fails the command.
func (b *logBackend) finishIn(tx txn, d TaskDelivery, eo events.Outcome, wakeID string, at int64) (SettleResult, error) {
	token := d.LeaseToken()
	t, err := tx.Task(d.Task.ID)
	if err != nil {
		return SettleResult{}, err
	}
	if t == nil {
		return SettleResult{Err: notFound(d.Task.ID)}, nil
	}
	if t.SettledToken != "" && t.SettledToken == token {
		if !sameOutcome(t.Outcome, eo) {
			return SettleResult{Err: badTransition("the delivery was already settled with a different outcome")}, nil
		}
		return SettleResult{Task: b.taskSnapshot(t)}, nil
	}
	if !t.OwnedBy(d.Attempt, token) {
		if !t.RejectionRecordable(d.Attempt) {
			return SettleResult{Err: stale(t.ID)}, nil
		}
		return SettleResult{Err: stale(t.ID)}, tx.Append(&events.TaskSettleRejected{
			Header: events.Header{SessionID: t.SessionID, At: at},
			TaskID: t.ID, Attempt: d.Attempt, Reason: rejectReason(t.Claimed(), t.Attempts, d.Attempt),
		})
	}
	ev := &events.TaskSettled{
		Header: events.Header{SessionID: t.SessionID, At: at},
		TaskID: t.ID, Attempt: d.Attempt, LeaseToken: token, Outcome: eo,
	}
	if err := tx.Append(ev); err != nil { // Append sets ev.Seq
		return SettleResult{}, err
	}
	return b.settledBy(tx, t.ID, ev.Seq, wakeID, at)
}

// settledBy is settled's answer as a SettleResult: the task afterwards and seq, that of the
// event that recorded the settle.
func (b *logBackend) settledBy(tx txn, id string, seq uint64, wakeID string, at int64) (SettleResult, error) {
	t, derr, err := b.settled(tx, id, wakeID, at)
	if err != nil || derr != nil {
		return SettleResult{Err: derr}, err
	}
	return SettleResult{Task: t, Seq: seq}, nil
}

// settled finishes a command that ended task id (a settlement, a cancel of pending work, the
// release of work whose cancel was requested): it records the task's completion wake when
// its policy asks for one (Task.CompletionWakeDue), and returns the task's snapshot. A task
// that did not end (a cancel request on running work, a release) records nothing.
func (b *logBackend) settled(tx txn, id, wakeID string, at int64) (Task, error, error) {
	t, err := mustTask(tx, id)
	if err != nil {
		return Task{}, nil, err
	}
	if t.CompletionWakeDue() {
		if err := completionWake(tx, wakeID, t, at); err != nil {
			return Task{}, nil, err
		}
	}
	return b.taskSnapshot(t), nil, nil
}

func (b *logBackend) RequestWake(ctx context.Context, sessionID string, r WakeRequest, now time.Time) (Wake, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Wake{}, verr
	}
	var out Wake
	var derr error
	differs := func(w *projection.Wake) (string, string) {
		if sameJSON(w.Payload, r.Payload) {
			return "", w.ID
		}
		return "payload", w.ID
	}
	if readRepeat(ctx, b.caps.viewer, true, sessionID, r.IdempotencyKey, projection.Reader.WakeKey, mustWake, differs, b.wakeSnapshot, &out, &derr) {
		return out, derr
	}
	newID, idErr := b.ids.id("wake", at) // drawn off the writer; unused by a repeat
	if idErr != nil {
		return Wake{}, backendErr(idErr)
	}
	release, staged, serr := b.stage(r.Payload)
	if serr != nil {
		return Wake{}, serr
	}
	defer release()
	payload := ownValue(r.Payload, staged)
	err := b.update(ctx, func(tx txn) error {
		out, derr = Wake{}, nil // fn may run twice (engine.update)
		if found, err := repeat(tx, sessionID, r.IdempotencyKey, projection.Reader.WakeKey, mustWake, differs, b.wakeSnapshot, &out, &derr); found || err != nil {
			return err
		}
		id := newID
		ev := &events.WakeRecorded{
			Header: events.Header{SessionID: sessionID, At: at},
			WakeID: id, Reason: events.WakeRequested, Payload: payload, IdempotencyKey: r.IdempotencyKey,
		}
		if err := tx.Append(ev); err != nil {
			return err
		}
		w, err := mustWake(tx, id)
		if err != nil {
			return err
		}
		out = b.wakeSnapshot(w)
		return nil
	})
	return result(out, derr, err)
}

func (b *logBackend) ClaimWakes(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]WakeDelivery, error) {
	return claim(ctx, b, now, leaseFor, limit, indexScan(projection.IndexWakes), "wakelease", b.claimWake)
}

// claimWake claims one available wake (ClaimWakes, ClaimSessionWakes).
func (b *logBackend) claimWake(tx txn, id string, at, expires int64, token, worker string) (WakeDelivery, error) {
	w, err := mustWake(tx, id)
	if err != nil {
		return WakeDelivery{}, err
	}
	ev := &events.WakeClaimed{
		Header: events.Header{SessionID: w.SessionID, At: at},
		WakeID: id, Attempt: w.Attempts + 1, LeaseToken: token, LeaseExpiresAt: expires, Worker: worker,
	}
	if err := tx.Append(ev); err != nil {
		return WakeDelivery{}, err
	}
	d := NewWakeDelivery(b.wakeSnapshot(w), ev.Attempt, fromNanos(expires), token)
	d.Worker = worker
	return d, nil
}

// AckWake acknowledges at the queue's clock's time: the Backend interface, like the seed, passes
// no time. Queue.AckWakeAt passes the caller's time to AckWakeAt instead.
func (b *logBackend) AckWake(ctx context.Context, d WakeDelivery) error {
	return b.AckWakeAt(ctx, d, b.clock())
}

func (b *logBackend) AckWakeAt(ctx context.Context, d WakeDelivery, now time.Time) error {
	at, verr := nanos("now", now)
	if verr != nil {
		return verr
	}
	token := d.LeaseToken()
	var derr error
	err := b.update(ctx, func(tx txn) error {
		derr = nil // fn may run twice (engine.update)
		w, err := tx.Wake(d.Wake.ID)
		if err != nil {
			return err
		}
		if w == nil {
			derr = stale(d.Wake.ID)
			return nil
		}
		if w.Acked && w.AckedToken == token {
			return nil
		}
		if !w.OwnedBy(d.Attempt, token) {
			derr = stale(w.ID)
			if !w.RejectionRecordable(d.Attempt) {
				return nil
			}
			return tx.Append(&events.WakeAckRejected{
				Header: events.Header{SessionID: w.SessionID, At: at},
				WakeID: w.ID, Attempt: d.Attempt, Reason: rejectReason(w.Held(), w.Attempts, d.Attempt),
			})
		}
		return tx.Append(&events.WakeAcked{
			Header: events.Header{SessionID: w.SessionID, At: at},
			WakeID: w.ID, Attempt: d.Attempt, LeaseToken: token,
		})
	})
	if err != nil {
		return backendErr(err)
	}
	return derr
}

func (b *logBackend) Close() error {
	b.hub.close()
	return backendErr(b.eng.Close())
}

// --- helpers ---

// errMissing reports a projection that lost a record it points to: an internal inconsistency.
var errMissing = errors.New("projection names a record that does not exist")

func mustTask(r projection.Reader, id string) (*projection.Task, error) {
	t, err := r.Task(id)
	if err == nil && t == nil {
		err = errors.Join(errMissing, errors.New("task "+id))
	}
	return t, err
}

func mustWake(r projection.Reader, id string) (*projection.Wake, error) {
	w, err := r.Wake(id)
	if err == nil && w == nil {
		err = errors.Join(errMissing, errors.New("wake "+id))
	}
	return w, err
}

// repeat answers a request whose idempotency key the session has used before: with the
// snapshot of the record the key names (read by read) when differs finds no differing field,
// and otherwise with a conflict naming that field and the record's id, storing nothing
// either way. It reports whether the key
// named a record; an empty key names none. lookup is the key index (Reader.TaskKey,
// Reader.WakeKey; a transaction or a durable read). Submit and RequestWake share it.
func repeat[R, S any](tx projection.Reader, sessionID, key string,
	lookup func(projection.Reader, string, string) (string, error), read func(projection.Reader, string) (*R, error),
	differs func(*R) (field, id string), snapshot func(*R) S, out *S, derr *error,
) (bool, error) {
	if key == "" {
		return false, nil
	}
	id, err := lookup(tx, sessionID, key)
	if err != nil || id == "" {
		return false, err
	}
	rec, err := read(tx, id)
	if err != nil {
		return false, err
	}
	if field, id := differs(rec); field == "" {
		*out = snapshot(rec)
	} else {
		*derr = conflict(key, field, id)
	}
	return true, nil
}

// readRepeat answers an idempotent repeat (the key names a record: an equal request or a
// conflict) from a read of durable committed state, without a write or a trip through the
// engine's single writer (issue 24, W3: a duplicate is a read). It reports whether it
// answered (out and derr set). Anything else goes through the command, which decides again
// under the writer: a new key, an engine without a durable viewer (v nil), a read that
// failed or saw state not known to be durable, and a key the engine would rather take in
// unread (ReadFirst false: a repeat is unlikely, and its writer proves a new key new in the
// commit). wake: a RequestWake's key.
func readRepeat[R, S any](ctx context.Context, v engineapi.DurableViewer, wake bool, sessionID, key string,
	lookup func(projection.Reader, string, string) (string, error), read func(projection.Reader, string) (*R, error),
	differs func(*R) (field, id string), snapshot func(*R) S, out *S, derr *error,
) bool {
	if key == "" || v == nil || !v.ReadFirst(wake) {
		return false
	}
	var found bool
	durable, err := v.ViewDurable(ctx, func(r projection.Reader) error {
		var zero S
		*out, *derr = zero, nil
		var err error
		found, err = repeat(r, sessionID, key, lookup, read, differs, snapshot, out, derr)
		return err
	})
	if err != nil || !found || !durable {
		var zero S
		*out, *derr = zero, nil
		return false
	}
	return true
}

func result[T any](out T, derr, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, backendErr(err)
	}
	if derr != nil {
		return zero, derr
	}
	return out, nil
}

// cloneHeaders copies a task's headers, so that neither the caller's map nor a snapshot
// shares memory with a stored record (the in-memory engine keeps the event's map); nil when
// there are none.
func cloneHeaders(h map[string]string) map[string]string {
	if len(h) == 0 {
		return nil
	}
	return maps.Clone(h)
}
