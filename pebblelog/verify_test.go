package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// seeded returns an open store holding seedStore's six events.
func seeded(t *testing.T) *Store {
	t.Helper()
	s := openT(t, t.TempDir(), &Options{})
	seedStore(t, s)
	mustVerify(t, s)
	return s
}

func rawGet(t *testing.T, s *Store, key []byte) []byte {
	t.Helper()
	v, ok, err := reader{s.db, s.blobs}.get(key)
	if err != nil || !ok {
		t.Fatalf("reading key %q: found %v, %v", key, ok, err)
	}
	return v
}

func rawSet(t *testing.T, s *Store, key, value []byte) {
	t.Helper()
	if err := s.db.Set(key, value, pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

func rawDelete(t *testing.T, s *Store, key []byte) {
	t.Helper()
	if _, ok, _ := (reader{s.db, s.blobs}).get(key); !ok {
		t.Fatalf("key %q to delete is not in the store", key)
	}
	if err := s.db.Delete(key, pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

func mustHaveProblem(t *testing.T, problems []string, parts ...string) {
	t.Helper()
	if !hasProblem(problems, parts...) {
		t.Errorf("Verify did not report a problem with %q; it reported:\n%s", parts, strings.Join(problems, "\n"))
	}
}

func TestCorruptEvent(t *testing.T) {
	good := func(t *testing.T, s *Store) []byte { return rawGet(t, s, eventKey(3)) }
	cases := []struct {
		name    string
		bad     func(good []byte) []byte
		corrupt bool // errors.Is(err, events.ErrCorrupt); otherwise another decode error
	}{
		{"bit flip", func(g []byte) []byte { g[len(g)/2] ^= 0x20; return g }, true},
		{"truncated", func(g []byte) []byte { return g[:len(g)-5] }, true},
		{"short garbage", func([]byte) []byte { return []byte{1, 3} }, true},
		{"empty", func([]byte) []byte { return nil }, true},
		{"bad checksum", func(g []byte) []byte { g[len(g)-1] ^= 0xff; return g }, true},
		{"text", func([]byte) []byte { return []byte("this is not an event, not at all") }, false},
		{"other event's bytes", nil, true}, // a valid event stored under the wrong sequence
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := seeded(t)
			var v []byte
			if c.bad != nil {
				v = c.bad(good(t, s))
			} else {
				v = rawGet(t, s, eventKey(5))
			}
			rawSet(t, s, eventKey(3), v)

			var seen []uint64
			err := s.ReadLog(context.Background(), 0, func(ev events.Event) error {
				seen = append(seen, ev.Head().Seq)
				return nil
			})
			if err == nil {
				t.Fatal("ReadLog over a corrupt event succeeded")
			}
			var de *events.DecodeError
			if !errors.As(err, &de) || de.Seq != 3 {
				t.Errorf("ReadLog error %v is not a *events.DecodeError at seq 3", err)
			}
			if !strings.Contains(err.Error(), "seq 3") {
				t.Errorf("ReadLog error %q does not name seq 3", err)
			}
			if c.corrupt && !errors.Is(err, events.ErrCorrupt) {
				t.Errorf("ReadLog error %v does not match events.ErrCorrupt", err)
			}
			if fmt.Sprint(seen) != "[1 2]" {
				t.Errorf("ReadLog delivered %v before the corrupt event, want [1 2]", seen)
			}
			ferr := s.FoldRange(context.Background(), 0, 0, func(events.Event) error { return nil })
			if ferr == nil || ferr.Error() != err.Error() {
				t.Errorf("FoldRange error %v, want ReadLog's %v", ferr, err)
			}
			if _, err := s.Event(context.Background(), 3); err == nil || !strings.Contains(err.Error(), "seq 3") {
				t.Errorf("Event(3) = %v, want an error naming seq 3", err)
			}
			// The events after it still read.
			var after []uint64
			if err := s.ReadLog(context.Background(), 4, func(ev events.Event) error {
				after = append(after, ev.Head().Seq)
				return nil
			}); err != nil || fmt.Sprint(after) != "[4 5 6]" {
				t.Errorf("ReadLog from 4 = %v, %v; want [4 5 6]", after, err)
			}

			p := verifyProblems(t, s)
			mustHaveProblem(t, p, "log:", "seq 3")
			mustHaveProblem(t, p, "rebuild stopped at the first bad event")
		})
	}
}

func TestVerifyDamagedTaskRecord(t *testing.T) {
	s := seeded(t)
	key := idKey(prefixTask, "t3")
	rec, err := decodeTask(key, rawGet(t, s, key))
	if err != nil {
		t.Fatal(err)
	}
	rec.State = events.StateRunning
	rec.Attempts = 7
	rawSet(t, s, key, appendTask(nil, rec))

	p := verifyProblems(t, s)
	mustHaveProblem(t, p, "task t3: field State: ", "(stored vs rebuilt)")
	mustHaveProblem(t, p, "task t3: field Attempts: ", "7", "(stored vs rebuilt)")
	if len(p) != 2 {
		t.Errorf("Verify reported %d problems, want exactly the 2 changed fields:\n%s", len(p), strings.Join(p, "\n"))
	}
}

func TestVerifyDamagedWakeRecord(t *testing.T) {
	s := seeded(t)
	key := idKey(prefixWake, "w1")
	rec, err := decodeWake(key, rawGet(t, s, key))
	if err != nil {
		t.Fatal(err)
	}
	rec.Acked = true
	rawSet(t, s, key, appendWake(nil, rec))
	mustHaveProblem(t, verifyProblems(t, s), "wake w1: field Acked: ", "(stored vs rebuilt)")
}

func TestVerifyUndecodableRecord(t *testing.T) {
	s := seeded(t)
	key := idKey(prefixTask, "t3")
	rawSet(t, s, key, []byte{0xc1, 0xff, 0x00})
	mustHaveProblem(t, verifyProblems(t, s), "task t3: stored record does not decode")
	err := s.View(context.Background(), func(r projection.Reader) error {
		_, err := r.Task("t3")
		return err
	})
	if !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("reading the damaged record = %v, want ErrCorruptRecord", err)
	}
}

func TestVerifyIndexDamage(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, s *Store)
		want   []string
	}{
		{"due entry deleted", func(t *testing.T, s *Store) {
			rawDelete(t, s, dueKey(0, sec(6), 6)) // t3, pending since its submission
		}, []string{fmt.Sprintf("due index entry (priority 0, at %d, seq 6): missing from the store", sec(6)), `"t3"`}},
		{"due entry added", func(t *testing.T, s *Store) {
			rawSet(t, s, dueKey(0, sec(1), 1), []byte("t1")) // t1 is settled
		}, []string{fmt.Sprintf("due index entry (priority 0, at %d, seq 1): stored, but not in the rebuild", sec(1))}},
		{"wake entry deleted", func(t *testing.T, s *Store) {
			rawDelete(t, s, indexKey(prefixAvailable, sec(5), 5))
		}, []string{"wake index entry", "missing from the store", `"w1"`}},
		{"task key deleted", func(t *testing.T, s *Store) {
			rawDelete(t, s, scopedKey(prefixTaskKey, "s2", "k2"))
		}, []string{`task key (session "s2", key "k2"): missing from the store`}},
		{"task key pointing elsewhere", func(t *testing.T, s *Store) {
			rawSet(t, s, scopedKey(prefixTaskKey, "s2", "k2"), []byte("t1"))
		}, []string{`task key (session "s2", key "k2"): stored "t1", rebuilt "t2"`}},
		{"session index entry deleted", func(t *testing.T, s *Store) {
			rawDelete(t, s, sessionEventKey("s1", 2))
		}, []string{`session index (session "s1", seq 2): missing from the store`}},
		{"task record deleted", func(t *testing.T, s *Store) {
			rawDelete(t, s, idKey(prefixTask, "t1"))
		}, []string{"task t1: missing from the store"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := seeded(t)
			c.damage(t, s)
			p := verifyProblems(t, s)
			mustHaveProblem(t, p, c.want...)
		})
	}
}

func TestVerifyLogDamage(t *testing.T) {
	t.Run("event deleted in the middle", func(t *testing.T) {
		s := seeded(t)
		rawDelete(t, s, eventKey(3))
		p := verifyProblems(t, s)
		mustHaveProblem(t, p, "log: gap: seq 4 follows 2")
		mustHaveProblem(t, p, "rebuild stopped at the first bad event")
	})
	t.Run("first event deleted", func(t *testing.T) {
		s := seeded(t)
		rawDelete(t, s, eventKey(1))
		mustHaveProblem(t, verifyProblems(t, s), "log: gap: seq 2 follows 0")
	})
	t.Run("last event deleted", func(t *testing.T) {
		s := seeded(t)
		rawDelete(t, s, eventKey(6))
		p := verifyProblems(t, s)
		mustHaveProblem(t, p, "log: ends at seq 5 but the stored last sequence is 6")
		mustHaveProblem(t, p, "task t3: stored, but not in the rebuild")
	})
	t.Run("stored last sequence ahead", func(t *testing.T) {
		s := seeded(t)
		rawSet(t, s, keyLastSeq, eventKey(9)[1:])
		mustHaveProblem(t, verifyProblems(t, s), "log: ends at seq 6 but the stored last sequence is 9")
	})
	t.Run("event that does not follow from the state", func(t *testing.T) {
		s := seeded(t)
		// A second settlement of t1, written behind the fold's back at seq 7.
		ev := settled("s1", "t1", sec(8), 1, "tok-1")
		ev.Seq = 7
		b, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		rawSet(t, s, eventKey(7), b)
		rawSet(t, s, keyLastSeq, eventKey(7)[1:])
		p := verifyProblems(t, s)
		mustHaveProblem(t, p, "log:", "seq 7", "does not own the claim")
	})
}

// Verify reads a snapshot: writers going on meanwhile neither disturb it nor are disturbed.
func TestVerifyWhileWriting(t *testing.T) {
	s := seeded(t)
	ctx := context.Background()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			err := s.Update(ctx, func(tx *Txn) error {
				return tx.Append(submitted("s3", fmt.Sprintf("v%d", i), sec(10+i), i%2 == 0))
			})
			if err != nil {
				done <- err
				return
			}
		}
	}()
	for range 3 {
		mustVerify(t, s)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mustVerify(t, s)
}

// TestFoldRangeMatchesReadRange: FoldRange hands out the same events as ReadRange, over the
// same bounds, although it reuses their structs; a fold through it gives the same state.
func TestFoldRangeMatchesReadRange(t *testing.T) {
	s := seeded(t)
	appendEvents(t, s, submitted("s2", "t7", sec(9), true), submitted("s2", "t8", sec(9), false),
		claimed("s2", "t7", sec(10), 1, "tok7"), claimed("s2", "t8", sec(10), 1, "tok8"),
		settled("s2", "t8", sec(11), 1, "tok8"))
	ctx := context.Background()
	for _, r := range [][2]uint64{{0, 0}, {1, 0}, {3, 7}, {5, 5}, {9, 0}, {12, 0}} {
		var want []events.Event
		if err := s.ReadRange(ctx, r[0], r[1], func(ev events.Event) error {
			want = append(want, ev)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		i := 0
		err := s.FoldRange(ctx, r[0], r[1], func(ev events.Event) error {
			if i >= len(want) || !reflect.DeepEqual(ev, want[i]) {
				return fmt.Errorf("event %d: %#v", i, ev)
			}
			i++
			return nil
		})
		if err != nil || i != len(want) {
			t.Fatalf("FoldRange(%d, %d): %v after %d of %d events", r[0], r[1], err, i, len(want))
		}
	}
	viaRead, viaFold := projection.NewMem(), projection.NewMem()
	if err := s.ReadRange(ctx, 0, 0, func(ev events.Event) error { return projection.Apply(viaRead, ev) }); err != nil {
		t.Fatal(err)
	}
	if err := s.FoldRange(ctx, 0, 0, func(ev events.Event) error { return projection.Apply(viaFold, ev) }); err != nil {
		t.Fatal(err)
	}
	if d := viaRead.Diff(viaFold); len(d) > 0 {
		t.Fatalf("folds differ:\n%q", d)
	}
	if n, _ := viaFold.Len(); n < 4 {
		t.Fatalf("the fold holds %d tasks", n)
	}
}
