package worktest

import (
	"context"
	"errors"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// lifecycleScenarios: fresh queues, reopening, done contexts and Close.
func lifecycleScenarios() []scenario {
	return []scenario{
		{"lifecycle/a_fresh_queue_has_no_state", lifeFresh},
		{"lifecycle/reopen_keeps_every_record_key_and_lease", lifeReopen},
		{"lifecycle/reopen_keeps_claim_order", lifeReopenOrder},
		{"lifecycle/a_done_context_fails_every_call", lifeContext},
		{"lifecycle/close_fails_every_later_call", lifeClose},
	}
}

func lifeFresh(e *env) {
	if n := e.logLen(); n != 0 {
		e.t.Errorf("a fresh queue's log has %d events", n)
	}
	if _, found := e.task("session_fresh", "task_anything"); found {
		e.t.Error("a fresh queue has a task")
	}
	e.claimNone(at(1 << 20))
	e.claimWakeNone(at(1 << 20))
	_, err := e.session("session_fresh").CancelAt(e.ctx, "task_anything", at(100))
	e.wantErr("cancel on a fresh queue", err, work.ErrTaskNotFound)
	e.wantErr("finish on a fresh queue",
		e.finishErr(work.NewTaskDelivery(work.Task{ID: "task_anything"}, 1, at(130), "forged-token"), work.Success(nil), at(100)),
		work.ErrTaskNotFound)
	e.wantErr("ack on a fresh queue",
		e.ack(work.NewWakeDelivery(work.Wake{ID: "wake_anything"}, 1, at(130), "forged-token"), at(100)),
		work.ErrStaleDelivery)
	if n := e.logLen(); n != 0 {
		e.t.Errorf("failed calls appended %d events", n)
	}

	// Two fresh queues share nothing.
	t := e.submit("session_fresh", work.TaskRequest{Kind: "k", IdempotencyKey: "k"}, at(100))
	other := e.fresh()
	_, found, err := other.Session("session_fresh").Task(e.ctx, t.ID)
	e.ok("Task on another fresh queue", err)
	if found {
		e.t.Error("a second fresh queue sees the first one's task")
	}
	ot, err := other.Session("session_fresh").SubmitAt(e.ctx, work.TaskRequest{Kind: "other", IdempotencyKey: "k"}, at(100))
	e.ok("SubmitAt on another fresh queue", err)
	if ot.ID == t.ID {
		e.t.Error("a second fresh queue reused a task id")
	}
	e.ok("Verify of the second queue", other.Verify(e.ctx))
}

func lifeReopen(e *env) {
	const s = "session_reopen"
	// B, D, E are claimed; D settles with a completion wake; E has a cancel request;
	// A is pending with a key; C is scheduled later; W is a keyed direct wake.
	b := e.submit(s, work.TaskRequest{Kind: "b", Input: js(`{ "b": 1 }`), Wake: work.WakeOnCompletion}, at(101))
	c := e.submit(s, work.TaskRequest{Kind: "c", RunAt: at(500)}, at(102))
	d := e.submit(s, work.TaskRequest{Kind: "d", Wake: work.WakeOnCompletion}, at(103))
	ex := e.submit(s, work.TaskRequest{Kind: "e"}, at(104))
	ds := e.claim(at(105), lease, 10)
	if len(ds) != 3 || ds[0].Task.ID != b.ID || ds[1].Task.ID != d.ID || ds[2].Task.ID != ex.ID {
		e.t.Fatalf("claimed %d tasks, want b, d, e", len(ds))
	}
	db, dd, de := ds[0], ds[1], ds[2]
	aReq := work.TaskRequest{Kind: "a", Input: js(`{"x":1}`), IdempotencyKey: "key-a"}
	a := e.submit(s, aReq, at(106))
	dOutcome := work.SuccessWithSummary("d done", js(`{"d":1}`))
	e.finish(dd, dOutcome, at(107))
	e.cancel(s, ex.ID, at(108))
	wReq := work.WakeRequest{Payload: js(`{"w":1}`), IdempotencyKey: "w-key"}
	w := e.wake(s, wReq, at(109))
	wds := e.claimWakes(at(109), lease, 10)
	if len(wds) != 2 || wds[1].Wake.ID != w.ID {
		e.t.Fatalf("claimed %d wakes, want d's completion wake then w", len(wds))
	}
	wdD, wdW := wds[0], wds[1]

	before := map[string]work.Task{}
	for _, id := range []string{a.ID, b.ID, c.ID, d.ID, ex.ID} {
		before[id] = e.mustTask(s, id)
	}
	logBefore := e.since(0)

	e.reopen()

	for id, want := range before {
		e.sameTask("task "+want.Kind+" after reopen", e.mustTask(s, id), want)
	}
	logAfter := e.since(0)
	if len(logAfter) != len(logBefore) {
		e.t.Fatalf("the log had %d events, has %d after reopen", len(logBefore), len(logAfter))
	}
	for i := range logAfter {
		if logAfter[i].Type() != logBefore[i].Type() || logAfter[i].Head().At != logBefore[i].Head().At {
			e.t.Errorf("event %d changed across reopen: %s -> %s", i+1, logBefore[i].Type(), logAfter[i].Type())
		}
	}

	// Keys survive.
	n := e.logLen()
	if got := e.submit(s, aReq, at(200)); got.ID != a.ID {
		e.t.Error("a task key was lost across reopen")
	}
	e.wantErr("changed intent after reopen", e.submitErr(s, work.TaskRequest{Kind: "a", Input: js(`{"x":2}`), IdempotencyKey: "key-a"}, at(200)),
		work.ErrIdempotencyConflict)
	if got := e.wake(s, wReq, at(200)); got.ID != w.ID {
		e.t.Error("a wake key was lost across reopen")
	}
	e.nothingAppended("idempotent calls after reopen", n)

	// Deliveries from before the reopen still own their claims, settled tokens still
	// make a repeat idempotent.
	n = e.logLen()
	e.finish(db, work.Success(js(`"b"`)), at(110))
	e.appended("a settle after reopen", n, events.TypeTaskSettled, events.TypeWakeRecorded)
	n = e.logLen()
	e.sameTask("repeat of a settle from before reopen", e.finish(dd, dOutcome, at(110)), before[d.ID])
	e.wantErr("another outcome after reopen", e.finishErr(dd, work.Failure("x"), at(110)), work.ErrInvalidTransition)
	e.ok("ack of a wake claimed before reopen", e.ack(wdW, at(110)))
	e.appended("calls after reopen", n, events.TypeWakeAcked)

	// Eligibility survives: A is due, E's lease ends at 135 and it carries the request,
	// C waits for 500, D's wake for its lease, b's new wake is claimable at once.
	da := e.claimOne(at(110))
	if da.Task.ID != a.ID || da.Attempt != 1 {
		e.t.Errorf("claimed %s attempt %d, want a attempt 1", da.Task.ID, da.Attempt)
	}
	e.finish(da, work.Success(nil), at(111))
	e.claimNone(at(134))
	de2 := e.claimOne(at(135))
	if de2.Task.ID != ex.ID || de2.Attempt != 2 {
		e.t.Errorf("claimed %s attempt %d, want e attempt 2", de2.Task.ID, de2.Attempt)
	}
	e.eqTime("E's CancelRequestedAt", de2.Task.CancelRequestedAt, at(108))
	e.wantErr("E's first delivery", e.finishErr(de, work.Cancellation(), at(136)), work.ErrStaleDelivery)
	e.finish(de2, work.Cancellation(), at(136))
	e.claimNone(at(499))
	if dc := e.claimOne(at(500)); dc.Task.ID != c.ID {
		e.t.Errorf("claimed %s, want c", dc.Task.ID)
	}
	bw := e.claimWakes(at(138), lease, 10)
	if len(bw) != 1 || bw[0].Wake.Reason.TaskID != b.ID {
		e.t.Fatalf("claimed %d wakes at 138, want only b's completion wake", len(bw))
	}
	wd2 := e.claimWakeOne(at(139))
	if wd2.Wake.ID != wdD.Wake.ID || wd2.Attempt != 2 {
		e.t.Errorf("claimed %s attempt %d, want d's wake attempt 2", wd2.Wake.ID, wd2.Attempt)
	}
	e.wantErr("d's wake, first delivery", e.ack(wdD, at(140)), work.ErrStaleDelivery)

	// New ids do not collide with old ones, and a second reopen sees everything.
	f := e.submit(s, work.TaskRequest{Kind: "f"}, at(106))
	if _, old := before[f.ID]; old {
		e.t.Error("a task id was reused after reopen")
	}
	snapshot := map[string]work.Task{}
	for _, id := range []string{a.ID, b.ID, c.ID, d.ID, ex.ID, f.ID} {
		snapshot[id] = e.mustTask(s, id)
	}
	e.reopen()
	for id, want := range snapshot {
		e.sameTask("task "+want.Kind+" after a second reopen", e.mustTask(s, id), want)
	}
	e.ok("ack after a second reopen", e.ack(wd2, at(141)))
	e.ok("ack of b's wake after a second reopen", e.ack(bw[0], at(141)))
	if df := e.claimOne(at(600)); df.Task.ID != f.ID {
		e.t.Errorf("claimed %s, want f", df.Task.ID)
	}
	e.claimWakeNone(at(600))
}

func lifeReopenOrder(e *env) {
	const s = "session_reopen_order"
	for i, runAt := range []int{300, 100, 200, 100} {
		e.submit(s, work.TaskRequest{Kind: "k", RunAt: at(runAt)}, at(50+i))
	}
	e.reopen()
	var got []time.Time
	for _, d := range e.claim(at(300), lease, 10) {
		got = append(got, d.Task.CreatedAt)
	}
	// By schedule (100, 100, 200, 300), ties by submission: created at 51, 53, 52, 50.
	if len(got) != 4 || !got[0].Equal(at(51)) || !got[1].Equal(at(53)) || !got[2].Equal(at(52)) || !got[3].Equal(at(50)) {
		e.t.Errorf("claim order after reopen (by creation time) %v, want 51s 53s 52s 50s after the epoch", got)
	}
	for i := 0; i < 3; i++ {
		e.wake(s, work.WakeRequest{Payload: js(`1`)}, at(300-i*100))
	}
	e.reopen()
	got = nil
	for _, d := range e.claimWakes(at(400), lease, 10) {
		got = append(got, d.Wake.CreatedAt)
	}
	if len(got) != 3 || !got[0].Equal(at(100)) || !got[1].Equal(at(200)) || !got[2].Equal(at(300)) {
		e.t.Errorf("wake claim order after reopen %v, want by creation time", got)
	}
}

// call is one public method, called with ctx, for the done-context and Close scenarios.
type call struct {
	name string
	do   func(ctx context.Context) error
}

// everyCall lists one call of each public method, with valid arguments.
func (e *env) everyCall(t work.Task, d work.TaskDelivery, wd work.WakeDelivery) []call {
	q, sess := e.q, e.session(t.SessionID)
	return []call{
		{"SubmitAt", func(ctx context.Context) error {
			_, err := sess.SubmitAt(ctx, work.TaskRequest{Kind: "k"}, at(100))
			return err
		}},
		{"Submit", func(ctx context.Context) error { _, err := sess.Submit(ctx, work.TaskRequest{Kind: "k"}); return err }},
		{"Task", func(ctx context.Context) error { _, _, err := sess.Task(ctx, t.ID); return err }},
		{"CancelAt", func(ctx context.Context) error { _, err := sess.CancelAt(ctx, t.ID, at(100)); return err }},
		{"Cancel", func(ctx context.Context) error { _, err := sess.Cancel(ctx, t.ID); return err }},
		{"WakeAt", func(ctx context.Context) error { _, err := sess.WakeAt(ctx, work.WakeRequest{}, at(100)); return err }},
		{"Wake", func(ctx context.Context) error { _, err := sess.Wake(ctx, work.WakeRequest{}); return err }},
		{"ClaimDueAt", func(ctx context.Context) error { _, err := q.ClaimDueAt(ctx, at(1000), lease, 10); return err }},
		{"ClaimDue", func(ctx context.Context) error { _, err := q.ClaimDue(ctx, lease, 10); return err }},
		{"FinishAt", func(ctx context.Context) error { _, err := q.FinishAt(ctx, d, work.Success(nil), at(100)); return err }},
		{"Finish", func(ctx context.Context) error { _, err := q.Finish(ctx, d, work.Success(nil)); return err }},
		{"ClaimWakesAt", func(ctx context.Context) error { _, err := q.ClaimWakesAt(ctx, at(1000), lease, 10); return err }},
		{"ClaimWakes", func(ctx context.Context) error { _, err := q.ClaimWakes(ctx, lease, 10); return err }},
		{"AckWakeAt", func(ctx context.Context) error { return q.AckWakeAt(ctx, wd, at(100)) }},
		{"AckWake", func(ctx context.Context) error { return q.AckWake(ctx, wd) }},
		{"ReadLog", func(ctx context.Context) error {
			return q.ReadLog(ctx, 0, func(events.Event) error { return nil })
		}},
		{"Verify", func(ctx context.Context) error { return q.Verify(ctx) }},
	}
}

// setupForCalls makes a task with a live delivery and a wake with a live delivery.
func (e *env) setupForCalls() (work.Task, work.TaskDelivery, work.WakeDelivery) {
	t := e.submit("session_calls", work.TaskRequest{Kind: "k"}, at(100))
	d := e.claimOne(at(100))
	e.wake("session_calls", work.WakeRequest{}, at(100))
	wd := e.claimWakeOne(at(100))
	return t, d, wd
}

func lifeContext(e *env) {
	t, d, wd := e.setupForCalls()
	n := e.logLen()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel2()
	for _, c := range e.everyCall(t, d, wd) {
		for _, cc := range []struct {
			ctx   context.Context
			cause error
		}{{canceled, context.Canceled}, {expired, context.DeadlineExceeded}} {
			err := c.do(cc.ctx)
			e.wantErr(c.name+" with a done context", err, work.ErrBackend)
			if !errors.Is(err, cc.cause) {
				e.t.Errorf("%s with a done context: %v does not wrap %v", c.name, err, cc.cause)
			}
		}
	}
	e.nothingAppended("calls with a done context", n)
	// The queue is unharmed.
	e.finish(d, work.Success(nil), at(101))
	e.ok("ack", e.ack(wd, at(101)))
}

func lifeClose(e *env) {
	t, d, wd := e.setupForCalls()
	e.ok("Verify before Close", e.q.Verify(e.ctx))
	calls := e.everyCall(t, d, wd)
	e.ok("Close", e.q.Close())
	e.closed = true
	e.ok("second Close", e.q.Close())
	for _, c := range calls {
		err := c.do(e.ctx)
		e.wantErr(c.name+" after Close", err, work.ErrBackend)
		if !errors.Is(err, work.ErrClosed) {
			e.t.Errorf("%s after Close: %v does not wrap ErrClosed", c.name, err)
		}
	}
	e.ok("third Close", e.q.Close())
}
