package worktest

import (
	"context"
	"errors"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// logScenarios check the shape of the event log where it matters.
func logScenarios() []scenario {
	return []scenario{
		{"log/each_command_appends_its_events", logCommandShapes},
		{"log/settle_with_wake_appends_settled_then_wake", logSettleThenWake},
		{"log/stale_finish_appends_at_most_one_rejection_per_attempt", logStaleFinish},
		{"log/stale_ack_appends_at_most_one_rejection_per_attempt", logStaleAck},
		{"log/read_log_bounds_and_stop", logReadLog},
		{"log/read_log_callback_may_write", logReadLogWrites},
	}
}

func logCommandShapes(e *env) {
	const s = "session_log"
	n := e.logLen()
	t1 := e.submit(s, work.TaskRequest{Kind: "k", IdempotencyKey: "k1"}, at(100))
	t2 := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion, RunAt: at(200)}, at(100))
	e.appended("two submissions", n, events.TypeTaskSubmitted, events.TypeTaskSubmitted)

	n = e.logLen()
	e.submit(s, work.TaskRequest{Kind: "k", IdempotencyKey: "k1"}, at(101))
	e.task(s, t1.ID)
	e.task(s, "task_missing")
	e.claim(at(50), lease, 10)
	e.claimWakes(at(50), lease, 10)
	e.nothingAppended("reads, a duplicate submission and empty claims", n)

	n = e.logLen()
	d := e.claimOne(at(100))
	e.appended("a claim", n, events.TypeTaskClaimed)

	n = e.logLen()
	e.cancel(s, t2.ID, at(101))
	evs := e.appended("a cancel of pending work with a wake", n, events.TypeTaskCancelRequested, events.TypeWakeRecorded)
	if wr := evs[1].(*events.WakeRecorded); wr.Reason != events.WakeTaskFinished || wr.TaskID != t2.ID || wr.SessionID != s {
		e.t.Errorf("completion wake event %+v", wr)
	}

	n = e.logLen()
	e.finish(d, work.Success(nil), at(102))
	e.appended("a settle without a wake", n, events.TypeTaskSettled)

	n = e.logLen()
	e.wake(s, work.WakeRequest{IdempotencyKey: "w"}, at(103))
	e.appended("a direct wake", n, events.TypeWakeRecorded)

	n = e.logLen()
	wds := e.claimWakes(at(103), lease, 10)
	e.appended("a wake claim", n, events.TypeWakeClaimed, events.TypeWakeClaimed)

	n = e.logLen()
	e.ok("ack", e.ack(wds[0], at(104)))
	e.appended("an ack", n, events.TypeWakeAcked)

	// Every event names its session and the caller's time.
	for _, ev := range e.since(0) {
		if ev.Head().SessionID != s {
			e.t.Errorf("%s names session %q", ev.Type(), ev.Head().SessionID)
		}
		if ev.Head().At < at(100).UnixNano() || ev.Head().At > at(104).UnixNano() {
			e.t.Errorf("%s at %d, outside the caller's times", ev.Type(), ev.Head().At)
		}
	}
}

func logSettleThenWake(e *env) {
	const s = "session_log_wake"
	for _, o := range []work.Outcome{work.Success(js(`{"r":1}`)), work.Failure("f"), work.Cancellation()} {
		t := e.submit(s, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(100))
		d := e.claimOne(at(100))
		n := e.logLen()
		e.finish(d, o, at(101))
		evs := e.appended("a settle with WakeOnCompletion", n, events.TypeTaskSettled, events.TypeWakeRecorded)
		settled, wr := evs[0].(*events.TaskSettled), evs[1].(*events.WakeRecorded)
		if settled.TaskID != t.ID || settled.Attempt != 1 || settled.Outcome.State != events.TaskState(o.State) {
			e.t.Errorf("settled event %+v", settled)
		}
		if wr.Reason != events.WakeTaskFinished || wr.TaskID != t.ID || wr.Outcome.State != events.TaskState(o.State) ||
			wr.Head().At != settled.Head().At {
			e.t.Errorf("wake event %+v after %+v", wr, settled)
		}
	}
}

// rejectionsSince counts rejection events per attempt after the first n events, and fails
// the test on any event but a rejection or one of the allowed types.
func (e *env) rejectionsSince(n int, allowed ...events.Type) map[uint32]int {
	e.t.Helper()
	out := map[uint32]int{}
next:
	for _, ev := range e.since(n) {
		switch r := ev.(type) {
		case *events.TaskSettleRejected:
			out[r.Attempt]++
			continue
		case *events.WakeAckRejected:
			out[r.Attempt]++
			continue
		}
		for _, a := range allowed {
			if ev.Type() == a {
				continue next
			}
		}
		e.t.Errorf("a refused call appended %s", ev.Type())
	}
	return out
}

// atMostOnePerAttempt checks rejection counts: at most one per attempt, and only for
// attempts that were claimed (1..claimed).
func (e *env) atMostOnePerAttempt(counts map[uint32]int, claimed uint32) {
	e.t.Helper()
	for attempt, count := range counts {
		if count > 1 {
			e.t.Errorf("%d rejections of attempt %d, want at most one", count, attempt)
		}
		if attempt == 0 || attempt > claimed {
			e.t.Errorf("a rejection of attempt %d, which was never claimed", attempt)
		}
	}
}

func logStaleFinish(e *env) {
	const s = "session_log_stale"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	d1 := e.claimOne(at(100))
	n := e.logLen()
	forged1 := work.NewTaskDelivery(d1.Task, 1, d1.LeaseExpiresAt, "forged-token")
	for i := 0; i < 3; i++ {
		e.wantErr("a forged token", e.finishErr(forged1, work.Success(nil), at(101)), work.ErrStaleDelivery)
	}
	if c := e.rejectionsSince(n); c[1] > 1 {
		e.t.Errorf("three stale finishes of attempt 1 appended %d rejections", c[1])
	}
	d2 := e.claimOne(at(130))
	for i := 0; i < 3; i++ {
		for _, d := range []work.TaskDelivery{
			d1, forged1,
			work.NewTaskDelivery(d2.Task, 2, d2.LeaseExpiresAt, "forged-token"),
			work.NewTaskDelivery(d2.Task, 3, d2.LeaseExpiresAt, "forged-token"),
			work.NewTaskDelivery(d2.Task, 0, d2.LeaseExpiresAt, "forged-token"),
		} {
			e.wantErr("a stale finish", e.finishErr(d, work.Success(nil), at(131)), work.ErrStaleDelivery)
		}
	}
	e.finish(d2, work.Success(nil), at(132))
	for i := 0; i < 3; i++ {
		e.wantErr("a stale finish after the settle", e.finishErr(d1, work.Failure("x"), at(133)), work.ErrStaleDelivery)
		e.wantErr("a forged finish after the settle",
			e.finishErr(work.NewTaskDelivery(d2.Task, 2, d2.LeaseExpiresAt, "forged-token"), work.Success(nil), at(133)),
			work.ErrStaleDelivery)
	}
	e.atMostOnePerAttempt(e.rejectionsSince(n, events.TypeTaskClaimed, events.TypeTaskSettled), 2)
}

func logStaleAck(e *env) {
	const s = "session_log_stale_ack"
	e.wake(s, work.WakeRequest{}, at(100))
	d1 := e.claimWakeOne(at(100))
	n := e.logLen()
	forged1 := work.NewWakeDelivery(d1.Wake, 1, d1.LeaseExpiresAt, "forged-token")
	for i := 0; i < 3; i++ {
		e.wantErr("a forged token", e.ack(forged1, at(101)), work.ErrStaleDelivery)
	}
	if c := e.rejectionsSince(n); c[1] > 1 {
		e.t.Errorf("three stale acks of attempt 1 appended %d rejections", c[1])
	}
	d2 := e.claimWakeOne(at(130))
	for i := 0; i < 3; i++ {
		for _, d := range []work.WakeDelivery{
			d1, forged1,
			work.NewWakeDelivery(d2.Wake, 2, d2.LeaseExpiresAt, "forged-token"),
			work.NewWakeDelivery(d2.Wake, 3, d2.LeaseExpiresAt, "forged-token"),
			work.NewWakeDelivery(d2.Wake, 0, d2.LeaseExpiresAt, "forged-token"),
		} {
			e.wantErr("a stale ack", e.ack(d, at(131)), work.ErrStaleDelivery)
		}
	}
	e.ok("ack", e.ack(d2, at(132)))
	for i := 0; i < 3; i++ {
		e.wantErr("a stale ack after the ack", e.ack(d1, at(133)), work.ErrStaleDelivery)
		e.wantErr("a forged ack after the ack",
			e.ack(work.NewWakeDelivery(d2.Wake, 2, d2.LeaseExpiresAt, "forged-token"), at(133)), work.ErrStaleDelivery)
	}
	e.atMostOnePerAttempt(e.rejectionsSince(n, events.TypeWakeClaimed, events.TypeWakeAcked), 2)
}

func logReadLog(e *env) {
	const s = "session_readlog"
	for i := 0; i < 5; i++ {
		e.submit(s, work.TaskRequest{Kind: "k"}, at(100+i))
	}
	all := e.since(0)
	if len(all) != 5 {
		e.t.Fatalf("%d events, want 5", len(all))
	}
	var from1 []events.Event
	e.ok("ReadLog from 1", e.q.ReadLog(e.ctx, 1, func(ev events.Event) error {
		from1 = append(from1, ev)
		return nil
	}))
	if len(from1) != 5 || from1[0].Head().Seq != 1 {
		e.t.Errorf("ReadLog from 1 read %d events", len(from1))
	}
	if tail := e.since(3); len(tail) != 2 || tail[0].Head().Seq != 4 {
		e.t.Errorf("ReadLog from 4 read %d events", len(tail))
	}
	if past := e.since(5); len(past) != 0 {
		e.t.Errorf("ReadLog past the end read %d events", len(past))
	}
	var far int
	e.ok("ReadLog far past the end", e.q.ReadLog(e.ctx, 1<<40, func(events.Event) error { far++; return nil }))
	if far != 0 {
		e.t.Errorf("ReadLog far past the end read %d events", far)
	}

	// fn's error stops the read and comes back as it is.
	stop := errors.New("stop here")
	var seen int
	err := e.q.ReadLog(e.ctx, 0, func(events.Event) error {
		seen++
		if seen == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || seen != 2 {
		e.t.Errorf("ReadLog returned %v after %d events, want the callback's error after 2", err, seen)
	}

	// A context canceled during the read fails it.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	err = e.q.ReadLog(ctx, 0, func(events.Event) error { cancel(); return nil })
	if err == nil {
		e.t.Error("ReadLog went on after its context was canceled")
	} else {
		e.wantErr("ReadLog with a canceled context", err, work.ErrBackend)
		if !errors.Is(err, context.Canceled) {
			e.t.Errorf("ReadLog: %v does not wrap context.Canceled", err)
		}
	}
}

// hangTimeout is how long a call that should return at once may take before the suite calls
// it a deadlock: generous for a loaded machine and a synced disk.
const hangTimeout = 20 * time.Second

// abandon gives up the live queue after a call on it hung: it is neither verified nor
// closed at the end of the test, since closing it may hang too.
func (e *env) abandon() {
	for i, q := range e.opened {
		if q == e.q {
			e.opened = append(e.opened[:i], e.opened[i+1:]...)
			break
		}
	}
	e.closed = true
}

// logReadLogWrites: a ReadLog callback may call the queue, writes included, on every
// backend, and the queue closes afterwards. (The in-memory queue held its lock through the
// whole walk: a write in the callback deadlocked, and then Close hung.) Whether the walk
// also sees events appended during it is not specified; those after the first n are left
// alone here, so the walk ends either way.
func logReadLogWrites(e *env) {
	const s = "session_readlog_write"
	e.submit(s, work.TaskRequest{Kind: "k"}, at(100))
	e.wake(s, work.WakeRequest{}, at(100))
	n := e.logLen()
	type result struct {
		ids  []string
		seen int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = e.q.ReadLog(e.ctx, 0, func(ev events.Event) error {
			r.seen++
			if ev.Head().Seq > uint64(n) {
				return nil
			}
			// Not e.submit: this is not the test's goroutine.
			t, err := e.q.Session(s).SubmitAt(e.ctx, work.TaskRequest{Kind: "inside"}, at(101))
			if err != nil {
				return err
			}
			r.ids = append(r.ids, t.ID)
			if _, err := e.q.ClaimWakesAt(e.ctx, at(101), lease, 1); err != nil {
				return err
			}
			return nil
		})
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(hangTimeout):
		e.abandon()
		e.t.Fatalf("ReadLog whose callback writes did not return in %v: deadlock", hangTimeout)
	}
	e.ok("ReadLog whose callback writes", r.err)
	if r.seen < n || len(r.ids) != n {
		e.t.Fatalf("the walk saw %d events and submitted %d tasks, want at least %d and %d", r.seen, len(r.ids), n, n)
	}
	for _, id := range r.ids {
		e.mustTask(s, id)
	}
	// n submissions and one wake claim.
	if got := e.logLen(); got != 2*n+1 {
		e.t.Errorf("log has %d events after the walk, want %d", got, 2*n+1)
	}

	e.ok("Verify after the walk", e.q.Verify(e.ctx))

	// A reader holds nothing once it returned: Close does not wait.
	closed := make(chan error, 1)
	go func() { closed <- e.q.Close() }()
	select {
	case err := <-closed:
		e.ok("Close after the walk", err)
		e.closed = true
	case <-time.After(hangTimeout):
		e.abandon()
		e.t.Fatalf("Close after a ReadLog whose callback wrote did not return in %v", hangTimeout)
	}
}
