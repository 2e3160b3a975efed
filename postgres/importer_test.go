package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// TestImporterAppendsGivenEvents: Importer.Append takes events that already have their
// sequence numbers, only as the log's next ones (ErrNotNext otherwise, appending nothing), and
// folds them: the copy verifies clean and reads the same tasks as the source.
func TestImporterAppendsGivenEvents(t *testing.T) {
	ctx := context.Background()
	src := pgtest.Schema(t)
	q, err := postgres.Open(ctx, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	var ids []string
	for i, s := range []string{"a", "b", "a"} {
		task, err := q.Session(s).SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"n":1}`)}, t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	ds, err := q.ClaimDueAt(ctx, t0.Add(time.Minute), time.Minute, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claim: %v, %v", ds, err)
	}
	if _, err := q.FinishAt(ctx, ds[0], work.Success(json.RawMessage(`"done"`)), t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	var evs []events.Event
	if err := q.ReadLog(ctx, 0, func(ev events.Event) error { evs = append(evs, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if len(evs) != 6 {
		t.Fatalf("%d events in the source", len(evs))
	}

	dst := pgtest.Schema(t)
	im, err := postgres.OpenImporter(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Append(ctx, evs[1:3]); !errors.Is(err, postgres.ErrNotNext) {
		t.Errorf("appending seq 2..3 to an empty log: %v, want ErrNotNext", err)
	}
	if last, err := im.LastSeq(ctx); err != nil || last != 0 {
		t.Errorf("after the refused append the log ends at %d (%v), want 0", last, err)
	}
	if err := im.Append(ctx, evs[:4]); err != nil {
		t.Fatal(err)
	}
	if err := im.Append(ctx, evs[3:]); !errors.Is(err, postgres.ErrNotNext) {
		t.Errorf("appending seq 4 again: %v, want ErrNotNext", err)
	}
	if err := im.Append(ctx, evs[4:]); err != nil {
		t.Fatal(err)
	}
	if p, err := im.Verify(ctx); err != nil || len(p) != 0 {
		t.Errorf("verify of the copy: %v, %v", p, err)
	}
	im.Close()

	a, err := postgres.Open(ctx, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := postgres.Open(ctx, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i, id := range ids {
		s := []string{"a", "b", "a"}[i]
		x, okx, errx := a.Session(s).Task(ctx, id)
		y, oky, erry := b.Session(s).Task(ctx, id)
		if errx != nil || erry != nil || !okx || !oky || !reflect.DeepEqual(x, y) {
			t.Errorf("task %s: source %+v (%v), copy %+v (%v)", id, x, errx, y, erry)
		}
	}
}
