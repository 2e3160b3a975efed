package worktest

import (
	"context"
	"errors"
	"time"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/work"
)

// pruneScenarios cover retention (shared/spec/work-api-2.md, "Retention"): every rule of
// what Prune removes, what it leaves exactly as it was, and how a pruned subject reads.
func pruneScenarios() []scenario {
	all := []scenario{
		{"prune/terminal_tasks_finished_before_the_horizon", pruneTerminalTasks},
		{"prune/a_completion_wake_waits_for_its_acknowledgment", pruneCompletionWake},
		{"prune/requested_wakes_once_acknowledged", pruneRequestedWakes},
		{"prune/idempotency_keys_are_free_again", pruneFreesKeys},
		{"prune/the_log_loses_exactly_the_pruned_events", pruneLog},
		{"prune/reopen_keeps_the_pruned_state", pruneReopen},
		{"prune/validation", pruneValidation},
	}
	// A backend whose engine cannot prune yet (no engine.Pruner) skips them, saying so.
	for i, sc := range all {
		run := sc.run
		all[i].run = func(e *env) {
			if _, err := e.q.Prune(e.ctx, epoch.Add(-time.Hour)); errors.Is(err, engineapi.ErrPruneNotSupported) {
				e.t.Skipf("the backend does not prune: %v", err)
			}
			run(e)
		}
	}
	return all
}

// prune calls Prune, which must succeed, and checks its counts.
func (e *env) prune(before time.Time, tasks, wakes int) work.PruneResult {
	e.t.Helper()
	res, err := e.q.Prune(e.ctx, before)
	e.ok("Prune", err)
	if res.Tasks != tasks || res.Wakes != wakes {
		e.t.Fatalf("Prune(%v) removed %d tasks and %d wakes, want %d and %d", before, res.Tasks, res.Wakes, tasks, wakes)
	}
	return res
}

// done submits a task and settles it at finish; submitted and claimed a second before.
func (e *env) done(session string, r work.TaskRequest, finish time.Time) (work.Task, work.TaskDelivery) {
	e.t.Helper()
	task := e.submit(session, r, finish.Add(-2*time.Second))
	ds := e.claim(finish.Add(-time.Second), lease, 100)
	for _, d := range ds {
		if d.Task.ID == task.ID {
			return e.finish(d, work.Success(js(`{"ok":true}`)), finish), d
		}
	}
	e.t.Fatalf("task %s was not claimed", task.ID)
	return work.Task{}, work.TaskDelivery{}
}

// absent requires that the task reads as not found.
func (e *env) absent(session, id string) {
	e.t.Helper()
	if _, found := e.task(session, id); found {
		e.t.Fatalf("task %s still found after it was pruned", id)
	}
}

func pruneTerminalTasks(e *env) {
	old, oldD := e.done("s1", work.TaskRequest{Kind: "k"}, at(10))
	edge, _ := e.done("s1", work.TaskRequest{Kind: "k"}, at(20)) // finished at the horizon: kept
	canceled := e.submit("s1", work.TaskRequest{Kind: "k", RunAt: at(1000)}, at(11))
	e.cancel("s1", canceled.ID, at(12)) // canceled while pending: terminal at 12
	pending := e.submit("s1", work.TaskRequest{Kind: "k", RunAt: at(500)}, at(1))
	running := e.submit("s2", work.TaskRequest{Kind: "k"}, at(1))
	rd := e.claim(at(2), time.Hour, 100)
	if len(rd) != 1 || rd[0].Task.ID != running.ID {
		e.t.Fatalf("claimed %d tasks, want only %s", len(rd), running.ID)
	}
	cancelRunning := e.submit("s2", work.TaskRequest{Kind: "k"}, at(3))
	crds := e.claim(at(4), time.Hour, 1)
	if len(crds) != 1 {
		e.t.Fatalf("claimed %d tasks, want 1", len(crds))
	}
	crd := crds[0]
	e.cancel("s2", cancelRunning.ID, at(5)) // running with a cancel request: not terminal
	before := map[string]work.Task{}
	for _, id := range []string{edge.ID, pending.ID} {
		before[id] = e.mustTask("s1", id)
	}
	for _, id := range []string{running.ID, cancelRunning.ID} {
		before[id] = e.mustTask("s2", id)
	}

	e.prune(at(20), 2, 0)
	e.absent("s1", old.ID)
	e.absent("s1", canceled.ID)
	for id, want := range before {
		session := "s1"
		if id == running.ID || id == cancelRunning.ID {
			session = "s2"
		}
		e.sameTask("after Prune: "+id, e.mustTask(session, id), want)
	}
	// A late Finish of a pruned task: not found.
	err := e.finishErr(oldD, work.Success(nil), at(30))
	e.wantErr("FinishAt of a pruned task", err, work.ErrTaskNotFound)
	// Claims see the same work: the pending task at its time, the running ones when their
	// leases expire; the owners still settle theirs.
	e.claimNone(at(400))
	if d := e.claimOne(at(500)); d.Task.ID != pending.ID {
		e.t.Errorf("claimed %s, want the pending task %s", d.Task.ID, pending.ID)
	}
	e.finish(crd, work.Failure("gave up"), at(40))
	e.finish(rd[0], work.Success(nil), at(41))
	// Nothing more before the same horizon; later, what finished since.
	e.prune(at(20), 0, 0)
	e.prune(at(42), 3, 0)
	// The session lists follow: only the claimed pending task is left.
	if l := e.list("s1", work.TaskFilter{Limit: 100}); len(l) != 1 || l[0].ID != pending.ID {
		e.t.Errorf("session s1 lists %d tasks, want only %s", len(l), pending.ID)
	}
	if l := e.list("s2", work.TaskFilter{Limit: 100}); len(l) != 0 {
		e.t.Errorf("session s2 lists %d tasks, want none", len(l))
	}
}

func pruneCompletionWake(e *env) {
	task, _ := e.done("s1", work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(10))
	// Finished long ago, but its completion wake is not acknowledged: nothing goes.
	e.prune(at(1000), 0, 0)
	e.mustTask("s1", task.ID)
	wd := e.claimWakeOne(at(20))
	if wd.Wake.Reason.TaskID != task.ID {
		e.t.Fatalf("claimed wake for task %q, want %s", wd.Wake.Reason.TaskID, task.ID)
	}
	e.prune(at(1000), 0, 0) // claimed, not acknowledged
	e.ok("AckWakeAt", e.ack(wd, at(50)))
	e.prune(at(50), 0, 0) // acknowledged at the horizon, not before it
	e.mustTask("s1", task.ID)
	e.prune(at(51), 1, 1) // the task and its wake together
	e.absent("s1", task.ID)
	err := e.ack(wd, at(60))
	e.wantErr("AckWakeAt of a pruned wake", err, work.ErrStaleDelivery)
	e.claimWakeNone(at(10000))
}

func pruneRequestedWakes(e *env) {
	acked := e.wake("s1", work.WakeRequest{Payload: js(`1`)}, at(1))
	held := e.wake("s1", work.WakeRequest{Payload: js(`2`)}, at(2))
	free := e.wake("s1", work.WakeRequest{Payload: js(`3`)}, at(3))
	d1 := e.claimWakeOne(at(4))
	d2 := e.claimWakeOne(at(5))
	if d1.Wake.ID != acked.ID || d2.Wake.ID != held.ID {
		e.t.Fatalf("claimed %s, %s; want %s, %s", d1.Wake.ID, d2.Wake.ID, acked.ID, held.ID)
	}
	e.ok("AckWakeAt", e.ack(d1, at(6)))
	e.prune(at(1000), 0, 1)
	e.wantErr("AckWakeAt of a pruned wake", e.ack(d1, at(7)), work.ErrStaleDelivery)
	// The held wake is still held by its delivery; the free one is still claimable.
	e.ok("AckWakeAt of the held wake", e.ack(d2, at(8)))
	d3 := e.claimWakeOne(at(9))
	if d3.Wake.ID != free.ID {
		e.t.Errorf("claimed %s, want %s", d3.Wake.ID, free.ID)
	}
	e.prune(at(8), 0, 0)
	e.prune(at(9), 0, 1)
}

func pruneFreesKeys(e *env) {
	first, _ := e.done("s1", work.TaskRequest{Kind: "k", Input: js(`{"v":1}`), IdempotencyKey: "K"}, at(10))
	w := e.wake("s1", work.WakeRequest{Payload: js(`1`), IdempotencyKey: "W"}, at(1))
	e.ok("AckWakeAt", e.ack(e.claimWakeOne(at(2)), at(3)))
	// Before the prune the keys hold: a changed request conflicts.
	e.wantErr("SubmitAt with a used key", e.submitErr("s1", work.TaskRequest{Kind: "k", Input: js(`{"v":2}`), IdempotencyKey: "K"}, at(11)), work.ErrIdempotencyConflict)
	e.prune(at(100), 1, 1)
	second := e.submit("s1", work.TaskRequest{Kind: "k", Input: js(`{"v":2}`), IdempotencyKey: "K"}, at(101))
	if second.ID == first.ID {
		e.t.Fatalf("the freed key named the pruned task %s again", first.ID)
	}
	e.eqJSON("the new task's input", second.Input, `{"v":2}`)
	again := e.submit("s1", work.TaskRequest{Kind: "k", Input: js(`{"v":2}`), IdempotencyKey: "K"}, at(102))
	if again.ID != second.ID {
		e.t.Errorf("a repeat of the new submit made %s, want %s", again.ID, second.ID)
	}
	w2 := e.wake("s1", work.WakeRequest{Payload: js(`2`), IdempotencyKey: "W"}, at(103))
	if w2.ID == w.ID {
		e.t.Fatalf("the freed wake key named the pruned wake %s again", w.ID)
	}
}

func pruneLog(e *env) {
	keep := e.submit("s1", work.TaskRequest{Kind: "k", RunAt: at(900)}, at(1))
	gone, _ := e.done("s1", work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion}, at(10))
	e.ok("AckWakeAt", e.ack(e.claimWakeOne(at(11)), at(12)))
	var before []events.Event
	e.ok("ReadLog", e.q.ReadLog(e.ctx, 0, func(ev events.Event) error { before = append(before, ev); return nil }))
	res := e.prune(at(100), 1, 1)
	var after []events.Event
	e.ok("ReadLog", e.q.ReadLog(e.ctx, 0, func(ev events.Event) error { after = append(after, ev); return nil }))
	// Exactly the task's and its wake's events went; the rest read as before.
	var want []uint64
	for _, ev := range before {
		taskID, wakeID := ev.Subject()
		wk, isWake := ev.(*events.WakeRecorded)
		if taskID == gone.ID || (isWake && wk.TaskID == gone.ID) {
			continue
		}
		if wakeID != "" && !isWake && taskID == "" {
			// A completion wake's claim and ack name only the wake: it is gone's if the
			// recorded wake was.
			if pruned := wakeOf(before, wakeID); pruned == gone.ID {
				continue
			}
		}
		want = append(want, ev.Head().Seq)
	}
	var got []uint64
	for _, ev := range after {
		got = append(got, ev.Head().Seq)
	}
	if len(got) != len(want) || uint64(len(before)-len(after)) != res.Events {
		e.t.Fatalf("after Prune the log holds seqs %v, want %v; Prune reported %d events removed, the log lost %d",
			got, want, res.Events, len(before)-len(after))
	}
	for i := range got {
		if got[i] != want[i] {
			e.t.Fatalf("after Prune the log holds seqs %v, want %v", got, want)
		}
	}
	// ReadLog from inside the pruned range starts at the next retained event.
	var firstSeq uint64
	e.ok("ReadLog", e.q.ReadLog(e.ctx, 2, func(ev events.Event) error { firstSeq = ev.Head().Seq; return errStop }))
	if len(want) > 1 && firstSeq != want[1] && want[0] < 2 {
		e.t.Errorf("ReadLog(from 2) starts at %d, want %d", firstSeq, want[1])
	}
	// New events follow the last sequence ever assigned, never a pruned one.
	next := e.submit("s1", work.TaskRequest{Kind: "k"}, at(200))
	var last uint64
	e.ok("ReadLog", e.q.ReadLog(e.ctx, 0, func(ev events.Event) error { last = ev.Head().Seq; return nil }))
	if last != before[len(before)-1].Head().Seq+1 {
		e.t.Errorf("the submit after Prune got seq %d, want %d", last, before[len(before)-1].Head().Seq+1)
	}
	e.mustTask("s1", keep.ID)
	e.mustTask("s1", next.ID)
}

var errStop = errors.New("stop")

// wakeOf returns the task of the completion wake id recorded in evs, or "".
func wakeOf(evs []events.Event, id string) string {
	for _, ev := range evs {
		if w, ok := ev.(*events.WakeRecorded); ok && w.WakeID == id {
			return w.TaskID
		}
	}
	return ""
}

func pruneReopen(e *env) {
	gone, goneD := e.done("s1", work.TaskRequest{Kind: "k", IdempotencyKey: "K"}, at(10))
	kept, _ := e.done("s1", work.TaskRequest{Kind: "k"}, at(50))
	pending := e.submit("s1", work.TaskRequest{Kind: "k", RunAt: at(900)}, at(60))
	e.prune(at(20), 1, 0)
	e.reopen()
	e.absent("s1", gone.ID)
	e.mustTask("s1", kept.ID)
	e.wantErr("FinishAt of a pruned task after reopen", e.finishErr(goneD, work.Success(nil), at(61)), work.ErrTaskNotFound)
	again := e.submit("s1", work.TaskRequest{Kind: "k", IdempotencyKey: "K"}, at(62))
	if again.ID == gone.ID {
		e.t.Fatalf("the freed key named the pruned task again after reopen")
	}
	e.ok("Verify after reopen", e.q.Verify(e.ctx))
	e.prune(at(51), 1, 0)
	e.reopen()
	e.mustTask("s1", pending.ID)
	e.absent("s1", kept.ID)
	if d := e.claimOne(at(70)); d.Task.ID != again.ID {
		e.t.Errorf("claimed %s, want %s", d.Task.ID, again.ID)
	}
}

func pruneValidation(e *env) {
	_, err := e.q.Prune(e.ctx, time.Date(1500, 1, 1, 0, 0, 0, 0, time.UTC))
	e.wantInvalid("Prune before 1678", err, "before")
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, err := e.q.Prune(ctx, at(1)); !errors.Is(err, context.Canceled) {
		e.t.Errorf("Prune with a canceled context: %v, want context.Canceled", err)
	}
}
