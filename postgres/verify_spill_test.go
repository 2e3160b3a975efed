package postgres

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// TestVerifySpillSaysWhatMemSays: Verify's findings, with both states in its scratch Pebble
// store (verify_spill.go), are those of the comparison it replaced — the fold held in a
// projection.Mem, the stored tables loaded into another and Mem.DiffStored — on a queue
// holding every kind of entry (keyed and keyless tasks of two kinds in every state, requested
// and completion wakes, claimed and acknowledged, a kind policy with leases, a schedule, the
// retention index), clean and then damaged table by table, each damage kept for the next
// (a row deleted: "missing"; a row moved: "missing" on both sides; a count or record changed).
func TestVerifySpillSaysWhatMemSays(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	e, q := openEngine(t, dsn, nil)
	now := time.Unix(10_000, 0)
	s := q.Session("s")
	if err := q.SetKindPolicyAt(ctx, "b", work.KindPolicy{MaxRunning: 50}, now); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		r := work.TaskRequest{Kind: []string{"a", "b"}[i%2], Priority: i % 3}
		if i%3 == 0 {
			r.Wake = work.WakeOnCompletion
		}
		if i%4 == 0 {
			r.IdempotencyKey = fmt.Sprintf("key%d", i)
		}
		if _, err := s.SubmitAt(ctx, r, now); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		if _, err := q.Session(fmt.Sprintf("w%d", i%2)).WakeAt(ctx, work.WakeRequest{IdempotencyKey: fmt.Sprintf("wk%d", i)}, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetScheduleAt(ctx, work.Schedule{Name: "tick", Cron: "@every 1h", Task: work.TaskRequest{Kind: "a"}}, now); err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, now.Add(time.Second), time.Minute, 24)
	if err != nil || len(ds) != 24 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	for _, d := range ds[:12] {
		if _, err := q.FinishAt(ctx, d, work.Success([]byte(`1`)), now.Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	wds, err := q.ClaimWakesAt(ctx, now.Add(3*time.Second), time.Minute, 5)
	if err != nil || len(wds) == 0 {
		t.Fatalf("claim wakes: %d, %v", len(wds), err)
	}
	for _, d := range wds[:3] {
		if err := q.AckWakeAt(ctx, d, now.Add(4*time.Second)); err != nil {
			t.Fatal(err)
		}
	}

	compare := func(step string, wantProblems bool) {
		t.Helper()
		tx, conn, err := e.beginRead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		defer tx.Rollback(ctx)
		got, err := verify(ctx, tx, e.st, nil)
		if err != nil {
			t.Fatalf("%s: verify: %v", step, err)
		}
		want := memVerify(t, ctx, e, tx)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: the scratch store's findings differ from Mem's\n got  %q\n want %q", step, got, want)
		}
		if wantProblems != (len(got) > 0) {
			t.Fatalf("%s: findings %q", step, got)
		}
	}
	compare("clean", false)
	one := func(table string) string { return "(SELECT ctid FROM " + table + " ORDER BY ctid LIMIT 1)" }
	for _, c := range []struct{ name, sql string }{
		{"task key", "DELETE FROM task_keys WHERE ctid = " + one("task_keys")},
		{"wake key", "UPDATE wake_keys SET wake_id = 'x' WHERE ctid = " + one("wake_keys")},
		{"due index", "UPDATE due SET seq = seq + 1000 WHERE ctid = " + one("due")},
		{"per-kind due index", "DELETE FROM kind_due WHERE ctid = " + one("kind_due")},
		{"wake index", "UPDATE wake_index SET at = at + 1 WHERE ctid = " + one("wake_index")},
		{"per-session wake index", "DELETE FROM session_wakes WHERE ctid = " + one("session_wakes")},
		{"session list", "UPDATE session_tasks SET task_id = 'y' WHERE ctid = " + one("session_tasks")},
		{"count", "UPDATE counts SET n = n + 1 WHERE ctid = " + one("counts")},
		{"retention index", "UPDATE prunable SET seq = seq + 1000 WHERE ctid = " + one("prunable")},
		{"kind lease", "DELETE FROM kind_leases WHERE ctid = " + one("kind_leases")},
		{"kind policy", "UPDATE kind_policies SET max_running = 7"},
		{"schedule", "UPDATE schedules SET next = next + 1"},
		{"task record", "DELETE FROM tasks WHERE ctid = " + one("tasks")},
		{"wake record", "DELETE FROM wakes WHERE ctid = " + one("wakes")},
		{"log head", "UPDATE log_head SET seq = seq + 1"},
	} {
		execSQL(t, "SET search_path = "+schemaName(dsn)+"; "+c.sql+"; RESET search_path")
		compare(c.name, true)
	}
}

// memVerify is Verify's comparison as it was before the scratch store, for a log with no gap
// and no event that does not decode: the fold in a Mem, the stored state in another.
func memVerify(t *testing.T, ctx context.Context, e *engine, tx pgx.Tx) []string {
	t.Helper()
	fold := projection.NewMem()
	fold.DeferIndexes()
	var d events.Decoder
	err := readLog(ctx, onTx{tx}, e.st, 1, 0, func(seq uint64, body []byte) error {
		ev, err := d.Decode(body, seq)
		if err != nil {
			return err
		}
		return projection.Apply(fold, ev)
	})
	if err != nil {
		t.Fatal(err)
	}
	var head int64
	if err := tx.QueryRow(ctx, e.st.lastSeq).Scan(&head); err != nil {
		t.Fatal(err)
	}
	stored := projection.NewMem()
	stored.SetLastSeq(uint64(head))
	tasks := func(fn func(*projection.Task) error) error {
		for _, x := range fold.Tasks() {
			if err := fn(&x); err != nil {
				return err
			}
		}
		return nil
	}
	if err := loadIndexes(ctx, tx, e.st, stored, memFold{fold, tasks}); err != nil {
		t.Fatal(err)
	}
	if err := loadSchedules(ctx, tx, e.st, stored); err != nil {
		t.Fatal(err)
	}
	if err := loadKindPolicies(ctx, tx, e.st, stored); err != nil {
		t.Fatal(err)
	}
	var undecoded []string
	diff, err := fold.DiffStored(stored, func(fn func(*projection.Task) error) error {
		return taskTable.scanAll(ctx, onTx{tx}, e.st.scanTasks, storedRecord(fn, &undecoded))
	}, func(fn func(*projection.Wake) error) error {
		return wakeTable.scanAll(ctx, onTx{tx}, e.st.scanWakeRecs, storedRecord(fn, &undecoded))
	})
	if err != nil {
		t.Fatal(err)
	}
	return append(undecoded, diff...)
}

// memFold is the in-memory fold as Verify's verifyFold (the comparison this test checks the
// scratch store against).
type memFold struct {
	*projection.Mem
	tasks func(fn func(*projection.Task) error) error
}

func (f memFold) eachTask(fn func(*projection.Task) error) error { return f.tasks(fn) }
