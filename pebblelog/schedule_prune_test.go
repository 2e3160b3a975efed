package pebblelog_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// TestPrunedTicksReopenAndImport: ticks of a CatchupAll schedule, settled and pruned; the
// latest tick's task stays (docs/design.md §4.6). The schedule record the live fold wrote,
// the one a reopened store reads, Verify's rebuild from the retained log and a fresh store
// that imports the retained log (AppendLog, as replay import does) all agree (the prune
// archives, so the archive's plan holds the latest tick too): same cursor,
// next tick and tick count, the latest tick's key taken; the reopened store submits no
// tick again at the same now, and the next one once.
func TestPrunedTicksReopenAndImport(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// With an archive: its plan reads the retention index through a reader of its own.
	q, err := work.Open(filepath.Join(dir, "store"), &work.Options{ArchiveDir: filepath.Join(dir, "archive")})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	s := q.Session("s")
	sc := work.Schedule{Name: "p", Cron: "@every 60s", Task: work.TaskRequest{Kind: "k"}, Catchup: work.CatchupAll}
	if err := s.SetScheduleAt(ctx, sc, t0); err != nil {
		t.Fatal(err)
	}
	ds, err := q.ClaimDueAt(ctx, t0.Add(245*time.Second), time.Hour, 10) // ticks 60, 120, 180, 240
	if err != nil || len(ds) != 4 {
		t.Fatalf("claim: %d deliveries, %v", len(ds), err)
	}
	for _, d := range ds {
		if _, err := q.FinishAt(ctx, d, work.Success(nil), t0.Add(246*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := q.Prune(ctx, t0.Add(time.Hour))
	if err != nil || res.Tasks != 3 {
		t.Fatalf("Prune removed %d tasks (%v), want 3: the latest tick's is held", res.Tasks, err)
	}
	live, err := s.Schedules(ctx)
	if err != nil || len(live) != 1 || !live[0].LastTick.Equal(t0.Add(240*time.Second)) || !live[0].Next.Equal(t0.Add(300*time.Second)) {
		t.Fatalf("live schedules %+v, %v", live, err)
	}
	want := cursorOf{SetSeq: 1, Cursor: t0.Add(240 * time.Second).UnixNano(), Next: t0.Add(300 * time.Second).UnixNano(), Ticks: 1}
	var evs []events.Event
	if err := q.ReadLog(ctx, 0, func(ev events.Event) error { evs = append(evs, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopened: the stored record, Verify (the rebuild from the retained log), no tick again.
	st, err := pebblelog.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := st.Verify(ctx, pebblelog.VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("Verify after the prune: %v %v", p, err)
	}
	pruned, err := st.PrunedRanges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reopened := readSchedule(t, st, "reopened")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if reopened != want {
		t.Errorf("reopened schedule %+v, want %+v", reopened, want)
	}

	// Imported: a fresh store folds the retained log across its pruned ranges.
	imp, err := pebblelog.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Close()
	if err := imp.AppendLog(ctx, evs, pruned); err != nil {
		t.Fatalf("import of the pruned log: %v", err)
	}
	if p, err := imp.Verify(ctx, pebblelog.VerifyOptions{}); err != nil || len(p) > 0 {
		t.Fatalf("Verify of the imported store: %v %v", p, err)
	}
	if imported := readSchedule(t, imp, "imported"); imported != want {
		t.Errorf("imported schedule %+v, want %+v", imported, want)
	}
	_ = imp.View(ctx, func(r projection.Reader) error {
		if id, _ := r.TaskKey("s", work.TickKey("p", t0.Add(240*time.Second))); id == "" {
			t.Error("the imported store has the latest tick's key free")
		}
		return nil
	})

	q, err = work.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if ds, err := q.ClaimDueAt(ctx, t0.Add(246*time.Second), time.Hour, 10); err != nil || len(ds) != 0 {
		t.Fatalf("a claim at the same now after the reopen: %d deliveries, %v; want none", len(ds), err)
	}
	ds, err = q.ClaimDueAt(ctx, t0.Add(300*time.Second), time.Hour, 10)
	if err != nil || len(ds) != 1 || ds[0].Task.IdempotencyKey != work.TickKey("p", t0.Add(300*time.Second)) {
		t.Fatalf("the next tick after the reopen: %v, %v", ds, err)
	}
}

// cursorOf is what the fold decides ticks from.
type cursorOf struct {
	SetSeq       uint64
	Cursor, Next int64
	Ticks        uint64
	Removed      bool
}

func readSchedule(t *testing.T, st *pebblelog.Store, what string) cursorOf {
	t.Helper()
	var out *projection.Schedule
	err := st.View(context.Background(), func(r projection.Reader) error {
		var err error
		out, err = r.Schedule("s", "p")
		return err
	})
	if err != nil || out == nil {
		t.Fatalf("%s: schedule record %v, %v", what, out, err)
	}
	return cursorOf{out.SetSeq, out.Cursor, out.Next, out.Ticks, out.Removed}
}
