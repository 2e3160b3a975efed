package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/projection"
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

// AppendLog imports a pruned log: a gap between events is accepted only when a declared
// range fills it (ErrNotNext naming the missing sequence otherwise, appending nothing); the
// ranges are recorded in the pruned table, coalesced across calls, the head moves past a
// range that ends the log, ReadLog and Verify explain the gaps, and the queue goes on after.
func TestImporterAppendLogPruned(t *testing.T) {
	ctx := context.Background()
	sub := func(seq uint64, session, id string) events.Event {
		return &events.TaskSubmitted{Header: events.Header{Seq: seq, SessionID: session, At: 1_767_225_600_000_000_000 + int64(seq)*1e9},
			TaskID: id, Kind: "k", Input: []byte(`{"n":1}`)}
	}
	x, y := sub(1, "s1", "task_x"), sub(5, "s2", "task_y")
	dsn := pgtest.Schema(t)
	im, err := postgres.OpenImporter(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	err = im.AppendLog(ctx, []events.Event{x, y}, []projection.SeqRange{{From: 2, To: 3}})
	if !errors.Is(err, postgres.ErrNotNext) || !strings.Contains(err.Error(), "seq 4 is missing") {
		t.Errorf("a gap at seq 4 that no range declares: %v, want ErrNotNext naming seq 4", err)
	}
	if last, err := im.LastSeq(ctx); err != nil || last != 0 {
		t.Errorf("after the refused import the log ends at %d (%v), want 0", last, err)
	}
	if err := im.AppendLog(ctx, []events.Event{x}, []projection.SeqRange{{From: 2, To: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := im.AppendLog(ctx, []events.Event{y}, []projection.SeqRange{{From: 4, To: 4}, {From: 6, To: 7}}); err != nil {
		t.Fatal(err)
	}
	if p, err := im.Verify(ctx); err != nil || len(p) != 0 {
		t.Errorf("verify of the import: %v, %v", p, err)
	}
	// A group of ranges alone, the first touching the stored tail.
	if err := im.AppendLog(ctx, nil, []projection.SeqRange{{From: 8, To: 8}, {From: 9, To: 10}}); err != nil {
		t.Fatal(err)
	}
	im.Close()

	r, err := postgres.OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	want := projection.SeqRanges{{From: 2, To: 4}, {From: 6, To: 10}}
	if got, err := r.PrunedRanges(ctx); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("pruned ranges %v (%v), want %v", got, err, want)
	}
	if last, err := r.LastSeq(ctx); err != nil || last != 10 {
		t.Errorf("the head is %d (%v), want 10: a pruned range ends the log", last, err)
	}
	var seqs []uint64
	if err := r.ReadLog(ctx, 0, func(ev events.Event) error { seqs = append(seqs, ev.Head().Seq); return nil }); err != nil || !reflect.DeepEqual(seqs, []uint64{1, 5}) {
		t.Errorf("ReadLog: %v (%v), want [1 5]", seqs, err)
	}
	r.Close()

	q := openQueue(t, dsn)
	if _, err := q.Session("s3").Submit(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	var after []uint64
	if err := q.ReadLog(ctx, 6, func(ev events.Event) error { after = append(after, ev.Head().Seq); return nil }); err != nil || !reflect.DeepEqual(after, []uint64{11}) {
		t.Errorf("a submit after the import is at %v (%v), want [11]", after, err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Error(err)
	}
}
