package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Format 2 writes records without the values their creating event holds: submit, claim and
// settle a task with a wake on completion and look at the stored bytes.
func TestFormat2RecordsOmitValues(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	input := []byte(`{"big":"` + strings.Repeat("x", 10000) + `"}`)
	sub := submitted("s1", "t1", sec(1), true)
	sub.Input = input
	appendEvents(t, s, sub)
	appendEvents(t, s, claimed("s1", "t1", sec(2), 1, "tok"))
	settle := settled("s1", "t1", sec(3), 1, "tok")
	output := []byte(`"` + strings.Repeat("y", 10000) + `"`)
	settle.Outcome.Output = output
	appendEvents(t, s, settle, &events.WakeRecorded{
		Header: events.Header{SessionID: "s1", At: sec(3)},
		WakeID: "w1", Reason: events.WakeTaskFinished, TaskID: "t1", Outcome: settle.Outcome,
	})
	appendEvents(t, s, requestedWake("s1", "w2", sec(4)))

	rawTask := func(id string) []byte {
		v, _, err := reader{s.db, s.blobs}.get(idKey(prefixTask, id))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	rawWake := func(id string) []byte {
		v, _, err := reader{s.db, s.blobs}.get(idKey(prefixWake, id))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := rawTask("t1"); strings.Contains(string(v), "xxxx") || len(v) > 10000+500 {
		t.Errorf("task record is %d bytes and carries its input", len(v))
	}
	if v := rawWake("w1"); strings.Contains(string(v), "yyyy") {
		t.Errorf("completion wake record is %d bytes and carries the output", len(v))
	}
	if v := rawWake("w2"); strings.Contains(string(v), "hello") {
		t.Errorf("requested wake record carries its payload: %q", v)
	}
	err := s.View(context.Background(), func(r projection.Reader) error {
		x, err := r.Task("t1")
		if err != nil {
			return err
		}
		if string(x.Input) != string(input) || string(x.Outcome.Output) != string(output) {
			t.Errorf("task reads input %.20q..., output %.20q...", x.Input, x.Outcome.Output)
		}
		w1, err := r.Wake("w1")
		if err != nil {
			return err
		}
		if string(w1.Outcome.Output) != string(output) {
			t.Errorf("completion wake reads output %.20q...", w1.Outcome.Output)
		}
		w2, err := r.Wake("w2")
		if err != nil {
			return err
		}
		if string(w2.Payload) != `{"hello":true}` {
			t.Errorf("requested wake reads payload %q", w2.Payload)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The decide code's reads, inside a command, get the values too.
	err = s.Update(context.Background(), func(tx *Txn) error {
		x, err := tx.Reader().Task("t1")
		if err == nil && string(x.Input) != string(input) {
			t.Errorf("Txn reader: task input %.20q...", x.Input)
		}
		w, err2 := tx.Reader().Wake("w1")
		if err2 == nil && string(w.Outcome.Output) != string(output) {
			t.Errorf("Txn reader: wake output %.20q...", w.Outcome.Output)
		}
		return errors.Join(err, err2)
	})
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, s)
}

// A record whose creating event is not the one it names is reported, not read as null.
func TestFormat2MissingEventIsCorrupt(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	appendEvents(t, s, submitted("s1", "t1", sec(1), false))
	appendEvents(t, s, submitted("s1", "t2", sec(2), false))
	// Point t2's record at t1's event.
	v, _, err := reader{s.db, s.blobs}.get(idKey(prefixTask, "t2"))
	if err != nil {
		t.Fatal(err)
	}
	x, err := decodeTask(idKey(prefixTask, "t2"), v)
	if err != nil {
		t.Fatal(err)
	}
	x.SubmitSeq = 1
	if err := s.db.Set(idKey(prefixTask, "t2"), appendTask(nil, x), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	err = s.View(context.Background(), func(r projection.Reader) error {
		_, err := r.Task("t2")
		return err
	})
	if !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), "t2") {
		t.Fatalf("reading a task whose submit event is another task's: %v, want ErrCorruptRecord naming t2", err)
	}
}

// A record put several times in one batch is written to it once, in its last version: a
// settlement with a completion wake puts its task twice (settled, then CompletionWakeID).
func TestRecordWrittenOncePerBatch(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	appendEvents(t, s, submitted("s1", "t1", sec(1), true))
	b := s.db.NewIndexedBatch()
	defer b.Close()
	w := &writer{reader: reader{b, s.blobs}, committed: reader{s.db, s.blobs}, b: b, lastSeq: 1}
	settle := settled("s1", "t1", sec(3), 1, "tok")
	settle.Seq = 0
	for _, ev := range []events.Event{
		claimed("s1", "t1", sec(2), 1, "tok"),
		settle,
		&events.WakeRecorded{
			Header: events.Header{SessionID: "s1", At: sec(3)},
			WakeID: "w1", Reason: events.WakeTaskFinished, TaskID: "t1", Outcome: settle.Outcome,
		},
	} {
		ev.Head().Seq = w.lastSeq + 1
		if err := projection.Apply(w, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.finish(1); err != nil {
		t.Fatal(err)
	}
	puts := map[string]int{}
	var last []byte
	r := b.Reader()
	for {
		_, k, v, ok, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if len(k) > 0 && (k[0] == prefixTask || k[0] == prefixWake) {
			puts[string(k)]++
			if string(k) == "tt1" {
				last = v
			}
		}
	}
	if puts["tt1"] != 1 || puts["ww1"] != 1 {
		t.Fatalf("record writes in one batch: %v, want one each", puts)
	}
	x, err := decodeTask([]byte("tt1"), last)
	if err != nil {
		t.Fatal(err)
	}
	if x.State != events.StateSucceeded || x.CompletionWakeID != "w1" {
		t.Errorf("the batch's task record is %s with completion wake %q, not the last version", x.State, x.CompletionWakeID)
	}
}

// priority first, and a priority whose entries are all in the future costs one entry read,
// not a walk of its entries.
func TestScanDuePriorities(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	ctx := t.Context()
	put := func(tx *Txn, id string, pri, at int64, seq uint64) error {
		e := projection.IndexEntry{Pri: pri, At: at, Seq: seq, ID: id}
		if err := tx.w.PutIndex(projection.IndexDue, "", e); err != nil {
			return err
		}
		return tx.w.PutIndex(projection.IndexKindDue, "k", e)
	}
	if err := s.Update(ctx, func(tx *Txn) error {
		for i := range 100 { // priority 9: all in the future
			if err := put(tx, fmt.Sprintf("f%03d", i), 9, 1000+int64(i), uint64(100+i)); err != nil {
				return err
			}
		}
		for _, e := range []struct {
			id      string
			pri, at int64
			seq     uint64
		}{{"lo", -1000, 5, 1}, {"z2", 0, 20, 2}, {"z1", 0, 10, 3}, {"hi", 1000, 30, 4}, {"m", 3, 50, 5}} {
			if err := put(tx, e.id, e.pri, e.at, e.seq); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{"hi", "z1", "z2", "lo"}
	for _, scan := range []func(projection.Reader, func(projection.IndexEntry) bool) error{
		func(r projection.Reader, fn func(projection.IndexEntry) bool) error {
			return r.ScanIndex(projection.IndexDue, "", math.MinInt64, 40, fn)
		},
		func(r projection.Reader, fn func(projection.IndexEntry) bool) error {
			return r.ScanIndex(projection.IndexKindDue, "k", math.MinInt64, 40, fn)
		},
	} {
		for _, through := range []string{"view", "writer"} {
			var got []string
			read := func(r projection.Reader) error {
				return scan(r, func(e projection.IndexEntry) bool { got = append(got, e.ID); return true })
			}
			var err error
			if through == "view" {
				err = s.View(ctx, read)
			} else {
				err = s.Update(ctx, func(tx *Txn) error { return read(tx.Reader()) })
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: %v, want %v", through, got, want)
			}
		}
	}
}
