package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestCatchUpKnowsEveryEventType: every event type has a rule for the writer's cache
// (catchup.go). A type added without one makes every other writer drop its whole cache
// whenever the type is appended: correct, but this test asks for the rule to be written.
func TestCatchUpKnowsEveryEventType(t *testing.T) {
	for _, typ := range events.AllTypes() {
		if _, _, _, known := catchUpRule(typ); !known {
			t.Errorf("event type %s has no rule in catchUpRule", typ)
		}
	}
	if _, _, _, known := catchUpRule(0); known {
		t.Error("type 0 has a rule")
	}
}

// twoWriters opens two engines on one schema: two processes' writers.
func twoWriters(t *testing.T) (a *engine, qa *work.Queue, b *engine, qb *work.Queue) {
	dsn := pgtest.Schema(t)
	a, qa = openEngine(t, dsn, nil)
	b, qb = openEngine(t, dsn, nil)
	return a, qa, b, qb
}

// countReads counts the records e's groups read from the server, until the test ends.
func countReads(t *testing.T, e *engine) *atomic.Int64 {
	var n atomic.Int64
	tracing(e).recordRead = func() { n.Add(1) }
	t.Cleanup(func() { tracing(e).recordRead = nil })
	return &n
}

// TestCacheKeptAcrossOtherWriters: writer B's cache outlives another writer's commit. A
// submits a task B never touched: B's next group settles its own claimed task without
// reading its record again (before the catch-up, B's cache started over at every head
// another writer moved, and the settle read the record under the head lock).
func TestCacheKeptAcrossOtherWriters(t *testing.T) {
	_, qa, b, qb := twoWriters(t)
	ctx := context.Background()
	if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	ds, err := qb.ClaimDue(ctx, time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	if _, err := qa.Session("s").Submit(ctx, work.TaskRequest{Kind: "other", IdempotencyKey: "K"}); err != nil {
		t.Fatal(err)
	}
	reads := countReads(t, b)
	kept := b.head.kept.Load()
	if _, err := qb.Finish(ctx, ds[0], work.Success(nil)); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("B's settle read %d records after A's unrelated submit, want 0 (its cache caught up)", n)
	}
	if got := b.head.kept.Load() - kept; got != 1 {
		t.Errorf("B kept its cache across %d of A's groups, want 1", got)
	}
	// A's key is in B's cache now, folded from A's event: no read either.
	var id string
	if err := b.Update(ctx, func(tx engineapi.Txn) error {
		var err error
		id, err = tx.TaskKey("s", "K")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if id == "" {
		t.Error("B's writer reads A's key K as absent")
	}
	mustVerify(t, qb)
}

// TestCacheSeesOtherWritersSettle: A settles a task whose running record B's cache holds.
// B's settle with the same delivery must see A's: refused as stale, and the log holds one
// settlement. Skipping the catch-up's invalidation, B settles the task a second time.
func TestCacheSeesOtherWritersSettle(t *testing.T) {
	_, qa, b, qb := twoWriters(t)
	ctx := context.Background()
	task, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := qb.ClaimDue(ctx, time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	if _, err := qa.Finish(ctx, ds[0], work.Success(nil)); err != nil {
		t.Fatal(err)
	}
	kept := b.head.kept.Load()
	_, err = qb.Finish(ctx, ds[0], work.Failure("late"))
	if !errors.Is(err, work.ErrStaleDelivery) && !errors.Is(err, work.ErrInvalidTransition) {
		t.Errorf("B's settle of a task A settled: %v, want it refused", err)
	}
	if b.head.kept.Load() == kept {
		t.Error("B's cache was not kept across A's settle: the test proves nothing")
	}
	got, _, err := qb.Session("s").Task(ctx, task.ID)
	if err != nil || got.State != work.TaskSucceeded {
		t.Errorf("task after both settles: %+v, %v; want A's success", got, err)
	}
	// A claim by B must not find it either.
	if ds, err := qb.ClaimDue(ctx, time.Minute, 1); err != nil || len(ds) != 0 {
		t.Errorf("B claims %v, %v after A settled the only task", ds, err)
	}
	mustVerify(t, qb)
}

// TestCacheSeesOtherWritersKeys: B's writer read keys K (task) and W (wake) as absent; A
// submits K and requests W. B's writer must read both as A's (not its cached absence), and
// B's submit of K with another intent is a conflict naming A's task.
func TestCacheSeesOtherWritersKeys(t *testing.T) {
	_, qa, b, qb := twoWriters(t)
	ctx := context.Background()
	keys := func() (task, wake string) {
		t.Helper()
		if err := b.Update(ctx, func(tx engineapi.Txn) error {
			var err error
			if task, err = tx.TaskKey("s", "K"); err != nil {
				return err
			}
			wake, err = tx.WakeKey("s", "W")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return task, wake
	}
	if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "warm-up"}); err != nil {
		t.Fatal(err)
	}
	if tk, wk := keys(); tk != "" || wk != "" {
		t.Fatalf("keys before any submit: %q, %q", tk, wk)
	}
	ta, err := qa.Session("s").Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "K"})
	if err != nil {
		t.Fatal(err)
	}
	wa, err := qa.Session("s").Wake(ctx, work.WakeRequest{Payload: []byte(`1`), IdempotencyKey: "W"})
	if err != nil {
		t.Fatal(err)
	}
	kept := b.head.kept.Load()
	if tk, wk := keys(); tk != ta.ID || wk != wa.ID {
		t.Errorf("B's writer reads K as %q and W as %q after A wrote them as %s and %s", tk, wk, ta.ID, wa.ID)
	}
	if b.head.kept.Load() == kept {
		t.Error("B's cache was not kept across A's groups: the test proves nothing")
	}
	// Through the writer (a key hint from before A's submit would skip the read-first path).
	if err := b.Update(ctx, func(tx engineapi.Txn) error {
		id, err := tx.TaskKey("s", "K")
		if err == nil && id != ta.ID {
			err = errors.New("key K lost")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, err = qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "other", IdempotencyKey: "K"})
	var we *work.Error
	if !errors.As(err, &we) || we.Kind != work.ErrIdempotencyConflict || we.ID != ta.ID {
		t.Errorf("B's submit of K with another intent: %v, want a conflict naming %s", err, ta.ID)
	}
	mustVerify(t, qb)
}

// TestCacheSeesOtherWritersCompletionWake: a completion wake changes its task's record
// (CompletionWakeID) in an event whose subject is the wake. Another writer (an Importer on
// the schema, which appends given events, so that the settle and the wake are two groups)
// settles B's claimed task, B reads it (its cache now holds the terminal task without a
// wake), then records the completion wake: B's writer must see the task's wake. Without the
// rule for a completion wake's task, it reads its cached record without one.
func TestCacheSeesOtherWritersCompletionWake(t *testing.T) {
	dsn := pgtest.Schema(t)
	b, qb := openEngine(t, dsn, nil)
	ctx := context.Background()
	im, err := OpenImporter(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	task, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := qb.ClaimDue(ctx, time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	appendOne := func(ev events.Event) {
		t.Helper()
		seq, err := im.LastSeq(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := ev.Head()
		h.Seq, h.SessionID, h.At = seq+1, "s", time.Now().UnixNano()
		if err := im.Append(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	readTask := func() (state events.TaskState, wake string) {
		t.Helper()
		if err := b.Update(ctx, func(tx engineapi.Txn) error {
			r, err := tx.Task(task.ID)
			if err == nil {
				state, wake = r.State, r.CompletionWakeID
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return state, wake
	}
	out := events.Outcome{State: events.StateFailed, Error: "boom"}
	appendOne(&events.TaskSettled{TaskID: task.ID, Attempt: ds[0].Attempt, LeaseToken: ds[0].LeaseToken(), Outcome: out})
	kept := b.head.kept.Load()
	if state, wake := readTask(); state != events.StateFailed || wake != "" {
		t.Fatalf("B reads the settled task as %s with wake %q", state, wake)
	}
	const wakeID = "01900000-0000-7000-8000-00000000c0de"
	appendOne(&events.WakeRecorded{WakeID: wakeID, Reason: events.WakeTaskFinished, TaskID: task.ID, Outcome: out})
	if _, wake := readTask(); wake != wakeID {
		t.Errorf("B's writer reads the task's completion wake as %q after it was recorded as %s", wake, wakeID)
	}
	if b.head.kept.Load()-kept != 2 {
		t.Errorf("B kept its cache across %d of the importer's groups, want 2: the test proves nothing", b.head.kept.Load()-kept)
	}
	mustVerify(t, qb)
}

// TestCacheSeesOtherWritersPrune: A prunes a finished task B's cache holds (record and key).
// A prune deletes rows without an event naming them: B's cache must start over.
func TestCacheSeesOtherWritersPrune(t *testing.T) {
	_, qa, b, qb := twoWriters(t)
	ctx := context.Background()
	base := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	task, err := qb.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "old", IdempotencyKey: "P"}, base)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := qb.ClaimKindsAt(ctx, []string{"old"}, base.Add(time.Second), time.Hour, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	if _, err := qb.FinishAt(ctx, ds[0], work.Success(nil), base.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	res, err := qa.Prune(ctx, base.Add(time.Hour))
	if err != nil || res.Tasks != 1 {
		t.Fatalf("prune: %+v, %v; want the old task pruned", res, err)
	}
	var rec bool
	var key string
	if err := b.Update(ctx, func(tx engineapi.Txn) error {
		r, err := tx.Task(task.ID)
		if err != nil {
			return err
		}
		rec = r != nil
		key, err = tx.TaskKey("s", "P")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if rec || key != "" {
		t.Errorf("B's writer reads the pruned task (record %v, key %q)", rec, key)
	}
	mustVerify(t, qb)
}

// TestCacheSeesOtherWritersPolicy: A pauses a kind; B's claim must not take its tasks (the
// kind policies are read by every group, never kept from one to the next).
func TestCacheSeesOtherWritersPolicy(t *testing.T) {
	_, qa, _, qb := twoWriters(t)
	ctx := context.Background()
	if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "p"}); err != nil {
		t.Fatal(err)
	}
	if ds, err := qb.ClaimKinds(ctx, []string{"none"}, time.Minute, 1); err != nil || len(ds) != 0 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	if err := qa.SetKindPolicy(ctx, "p", work.KindPolicy{Paused: true}); err != nil {
		t.Fatal(err)
	}
	if ds, err := qb.ClaimDue(ctx, time.Minute, 1); err != nil || len(ds) != 0 {
		t.Errorf("B claims %v, %v of a kind A paused", ds, err)
	}
	mustVerify(t, qb)
}

// TestCacheSeesAnotherHistory: a failover to a standby that had not received writer B's last
// commit leaves a log without it, and another writer then appends a different event at the
// same sequence number: the head's seq and prunes are what B's cache was at. B must not take
// its cache (which holds the lost task) for the log's state: the event at the head is not
// the one B's cache is of. (The loss is made by hand here: B's commit is deleted row by row,
// as the standby never had it.) The other writer appends one event (B's head seq again: B
// checks the event at it) or two (B's head is behind: its catch-up checks the event at its
// old head first).
func TestCacheSeesAnotherHistory(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d events", n), func(t *testing.T) { anotherHistory(t, n) })
	}
}

func anotherHistory(t *testing.T, others int) {
	dsn := pgtest.Schema(t)
	b, qb := openEngine(t, dsn, nil)
	_, qa := openEngine(t, dsn, nil)
	ctx := context.Background()
	if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "kept"}); err != nil {
		t.Fatal(err)
	}
	lost, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "lost"})
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, dsn)
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`SELECT seq FROM log_head WHERE id = 1 FOR UPDATE`,
		`DELETE FROM events WHERE seq = 2`,
		`DELETE FROM tasks WHERE id = $1`,
		`DELETE FROM due WHERE task_id = $1`,
		`DELETE FROM kind_due WHERE task_id = $1`,
		`DELETE FROM session_tasks WHERE task_id = $1`,
		`UPDATE counts SET n = n - 1 WHERE kind = 'lost'::bytea`,
		`UPDATE log_head SET seq = 1 WHERE id = 1`,
	} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = append(args, []byte(lost.ID))
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range others {
		if _, err := qa.Session("s").Submit(ctx, work.TaskRequest{Kind: "other"}); err != nil {
			t.Fatal(err)
		}
	}
	var found bool
	if err := b.Update(ctx, func(tx engineapi.Txn) error {
		r, err := tx.Task(lost.ID)
		found = r != nil
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if found {
		t.Error("B's writer reads the task lost with its commit")
	}
	if _, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "after"}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, qb)
}

// TestCacheSeesOtherWritersDetachedWakeAck: B retries a task whose completion wake is not
// acknowledged (the task counts it, UnackedEarlierWakes) and keeps the task in its cache; A
// acknowledges that wake, which counts it off the task without an event on the task. B's
// writer must read the count as 0 after catching up: a stale 1 would keep the task from
// retention, and B's next write of the task would store it again.
func TestCacheSeesOtherWritersDetachedWakeAck(t *testing.T) {
	_, qa, b, qb := twoWriters(t)
	ctx := context.Background()
	task, err := qb.Session("s").Submit(ctx, work.TaskRequest{Kind: "k", Wake: work.WakeOnCompletion})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := qb.ClaimDue(ctx, time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	if _, err := qb.Finish(ctx, ds[0], work.Failure("boom")); err != nil {
		t.Fatal(err)
	}
	if _, err := qb.Session("s").Retry(ctx, task.ID, time.Time{}); err != nil {
		t.Fatal(err)
	}
	count := func() uint32 {
		t.Helper()
		var n uint32
		if err := b.Update(ctx, func(tx engineapi.Txn) error {
			r, err := tx.Task(task.ID)
			if err == nil && r != nil {
				n = r.UnackedEarlierWakes
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("B reads %d unacknowledged earlier wakes after the retry, want 1", n)
	}
	ws, err := qa.ClaimWakes(ctx, time.Minute, 10)
	if err != nil || len(ws) != 1 || ws[0].Wake.Reason.TaskID != task.ID {
		t.Fatalf("A claims %v, %v; want the retried task's wake", ws, err)
	}
	kept := b.head.kept.Load()
	if err := qa.AckWake(ctx, ws[0]); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("B reads %d unacknowledged earlier wakes after A acknowledged the wake, want 0", n)
	}
	if b.head.kept.Load() == kept {
		t.Errorf("B did not keep its cache across A's acknowledgment: the test proves nothing")
	}
	mustVerify(t, qb)
}
