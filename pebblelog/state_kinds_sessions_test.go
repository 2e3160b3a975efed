package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// These tests drive format 3's State methods directly through the writer (a Txn's), as the
// fold does, so they do not depend on which rule calls which method.

// inOneBatch runs fns as separate commands of one batch: a first command holds the writer
// until the others are queued behind it. It returns each command's error.
func inOneBatch(t *testing.T, s *Store, fns ...func(*Txn) error) []error {
	t.Helper()
	ctx := context.Background()
	release, entered := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		holder <- s.Update(ctx, func(*Txn) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	results := make([]chan error, len(fns))
	for i, fn := range fns {
		results[i] = make(chan error, 1)
		go func() { results[i] <- s.Update(ctx, fn) }()
		waitQueued(t, s, i+1)
	}
	close(release)
	if err := <-holder; err != nil {
		t.Fatalf("holder: %v", err)
	}
	errs := make([]error, len(fns))
	for i := range fns {
		errs[i] = <-results[i]
	}
	return errs
}

func scanKind(t *testing.T, r projection.Reader, kind string, maxAt int64) []string {
	t.Helper()
	var got []string
	if err := r.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, maxAt, func(e projection.IndexEntry) bool {
		got = append(got, fmt.Sprintf("%s@%d/%d", e.ID, e.At, e.Seq))
		return true
	}); err != nil {
		t.Fatalf("scan of the due index of kind %q: %v", kind, err)
	}
	return got
}

func viewKind(t *testing.T, s *Store, kind string, maxAt int64) (got []string) {
	t.Helper()
	if err := s.View(context.Background(), func(r projection.Reader) error {
		got = scanKind(t, r, kind, maxAt)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

func countsOf(t *testing.T, r projection.Reader) string {
	t.Helper()
	var parts []string
	if err := r.Counts(func(kind string, state events.TaskState, n int64) bool {
		parts = append(parts, fmt.Sprintf("%s/%s=%d", kind, state, n))
		return true
	}); err != nil {
		t.Fatalf("Counts: %v", err)
	}
	return strings.Join(parts, " ")
}

func viewCounts(t *testing.T, s *Store) (got string) {
	t.Helper()
	if err := s.View(context.Background(), func(r projection.Reader) error {
		got = countsOf(t, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

func entry(id string, at int64, seq uint64) projection.IndexEntry {
	return projection.IndexEntry{At: at, Seq: seq, ID: id}
}

// The per-kind index holds each kind apart (a kind that is a prefix of another included),
// ordered by (At, Seq), bounded by maxAt; the writer's scans see what earlier commands of
// the batch put and deleted, and so does the same command.
func TestKindIndexScans(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	put := func(tx *Txn, kind string, e projection.IndexEntry) error {
		return tx.w.PutIndex(projection.IndexKindDue, kind, e)
	}
	if err := s.Update(context.Background(), func(tx *Txn) error {
		return errors.Join(
			put(tx, "a", entry("a2", 20, 2)),
			put(tx, "a", entry("a1", 10, 1)),
			put(tx, "a", entry("a3", 20, 3)),
			put(tx, "ab", entry("ab1", 5, 4)),
			put(tx, "b", entry("b1", 1, 5)),
			put(tx, "a", entry("neg", -7, 6)),
		)
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := viewKind(t, s, "a", 20), []string{"neg@-7/6", "a1@10/1", "a2@20/2", "a3@20/3"}; !slices.Equal(got, want) {
		t.Errorf(`kind "a" due at 20: %v, want %v`, got, want)
	}
	if got, want := viewKind(t, s, "a", 19), []string{"neg@-7/6", "a1@10/1"}; !slices.Equal(got, want) {
		t.Errorf(`kind "a" due at 19: %v, want %v`, got, want)
	}
	if got, want := viewKind(t, s, "ab", 100), []string{"ab1@5/4"}; !slices.Equal(got, want) {
		t.Errorf(`kind "ab": %v, want %v`, got, want)
	}
	if got := viewKind(t, s, "c", 100); len(got) != 0 {
		t.Errorf(`kind "c": %v, want nothing`, got)
	}

	var inCmd, nextCmd []string
	errs := inOneBatch(t, s,
		func(tx *Txn) error {
			err := errors.Join(tx.w.DeleteIndex(projection.IndexKindDue, "a", entry("a1", 10, 1)), put(tx, "a", entry("a0", 0, 7)))
			inCmd = scanKind(t, tx.Reader(), "a", 20)
			return err
		},
		func(tx *Txn) error {
			nextCmd = scanKind(t, tx.Reader(), "a", 20)
			return nil
		})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want := []string{"neg@-7/6", "a0@0/7", "a2@20/2", "a3@20/3"}
	if !slices.Equal(inCmd, want) || !slices.Equal(nextCmd, want) {
		t.Errorf("scans in the batch: same command %v, next command %v; want %v", inCmd, nextCmd, want)
	}
	if got := viewKind(t, s, "a", 20); !slices.Equal(got, want) {
		t.Errorf("after the commit: %v, want %v", got, want)
	}
}

// The writer's per-kind low-water marks: a scan that consumed a kind's head starts the next
// scan past it, a put below the mark is still found, and a discarded batch's marks are
// dropped: the command run again alone, and every later batch, sees the committed index.
func TestKindIndexLowWaterMarks(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	ctx := context.Background()
	if err := s.Update(ctx, func(tx *Txn) error {
		return errors.Join(tx.w.PutIndex(projection.IndexKindDue, "k", entry("x", 10, 1)), tx.w.PutIndex(projection.IndexKindDue, "k", entry("y", 30, 2)))
	}); err != nil {
		t.Fatal(err)
	}
	// A batch that deletes x, scans (raising k's mark past x), then fails after writing: the
	// batch is discarded and the first command runs again alone, this time without deleting.
	runs := 0
	var rerun []string
	errBoom := errors.New("boom")
	errs := inOneBatch(t, s,
		func(tx *Txn) error {
			runs++
			if runs == 1 {
				if err := tx.w.DeleteIndex(projection.IndexKindDue, "k", entry("x", 10, 1)); err != nil {
					return err
				}
			}
			rerun = scanKind(t, tx.Reader(), "k", 20)
			return nil
		},
		func(tx *Txn) error {
			if err := tx.w.PutIndex(projection.IndexKindDue, "other", entry("z", 1, 3)); err != nil {
				return err
			}
			return errBoom
		})
	if errs[0] != nil || !errors.Is(errs[1], errBoom) || runs != 2 {
		t.Fatalf("results %v after %d runs; want nil, boom after 2", errs, runs)
	}
	if want := []string{"x@10/1"}; !slices.Equal(rerun, want) {
		t.Errorf("the command run again alone scans %v, want %v", rerun, want)
	}
	var later []string
	if err := s.Update(ctx, func(tx *Txn) error {
		later = scanKind(t, tx.Reader(), "k", 20)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"x@10/1"}; !slices.Equal(later, want) {
		t.Errorf("a later batch scans %v, want %v: a discarded batch's mark survived", later, want)
	}

	// A committed scan that found nothing due moves the mark to the first live key it met
	// (y, due later: format 6's walk reads it to know its run is not due); a later put below
	// that mark is still found.
	if err := s.Update(ctx, func(tx *Txn) error {
		if err := tx.w.DeleteIndex(projection.IndexKindDue, "k", entry("x", 10, 1)); err != nil {
			return err
		}
		if got := scanKind(t, tx.Reader(), "k", 25); len(got) != 0 {
			t.Errorf("after deleting x: %v", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if low := string(s.kindLowForTest(t, "k")); low != string(kindIndexKey("k", 0, 30, 2)) {
		t.Errorf("k's committed mark is %q, want y's key", low)
	}
	var found []string
	if err := s.Update(ctx, func(tx *Txn) error {
		if err := tx.w.PutIndex(projection.IndexKindDue, "k", entry("w", 5, 4)); err != nil {
			return err
		}
		found = scanKind(t, tx.Reader(), "k", 40)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"w@5/4", "y@30/2"}; !slices.Equal(found, want) {
		t.Errorf("after a put below the mark: %v, want %v", found, want)
	}
}

// kindLowForTest reads kind's committed mark of the partition's first key through a command
// (the writer owns it).
func (s *Store) kindLowForTest(t *testing.T, kind string) (low []byte) {
	t.Helper()
	if err := s.Update(context.Background(), func(tx *Txn) error {
		m := tx.w.partLows[partLow{projection.IndexKindDue, kind}]
		if i := m.find(math.MaxInt64); i >= 0 {
			low = m[i].low
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return low
}

// A session's task list is that session's alone (a session that is a prefix of another
// included), in submission order, from after a sequence; the writer sees its batch's puts.
func TestSessionTaskLists(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	ctx := context.Background()
	if err := s.Update(ctx, func(tx *Txn) error {
		return errors.Join(
			tx.w.PutSessionTask("s", 3, "t3"),
			tx.w.PutSessionTask("s", 1, "t1"),
			tx.w.PutSessionTask("s1", 2, "u2"),
			tx.w.PutSessionTask("", 4, "e4"),
		)
	}); err != nil {
		t.Fatal(err)
	}
	list := func(r projection.Reader, session string, after uint64) []string {
		var got []string
		if err := r.ScanSessionTasks(session, after, func(seq uint64, id string) bool {
			got = append(got, fmt.Sprintf("%d:%s", seq, id))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	view := func(session string, after uint64) (got []string) {
		s.View(context.Background(), func(r projection.Reader) error { got = list(r, session, after); return nil })
		return got
	}
	for _, c := range []struct {
		session string
		after   uint64
		want    []string
	}{
		{"s", 0, []string{"1:t1", "3:t3"}},
		{"s", 1, []string{"3:t3"}},
		{"s", 2, []string{"3:t3"}},
		{"s", 3, nil},
		{"s", 1<<64 - 1, nil},
		{"s1", 0, []string{"2:u2"}},
		{"", 0, []string{"4:e4"}},
		{"none", 0, nil},
	} {
		if got := view(c.session, c.after); !slices.Equal(got, c.want) {
			t.Errorf("session %q after %d: %v, want %v", c.session, c.after, got, c.want)
		}
	}
	// Stopping early stops.
	n := 0
	s.View(context.Background(), func(r projection.Reader) error {
		return r.ScanSessionTasks("s", 0, func(uint64, string) bool { n++; return false })
	})
	if n != 1 {
		t.Errorf("fn returned false but was called %d times", n)
	}
	var inBatch []string
	errs := inOneBatch(t, s,
		func(tx *Txn) error { return tx.w.PutSessionTask("s", 5, "t5") },
		func(tx *Txn) error { inBatch = list(tx.Reader(), "s", 1); return nil })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if want := []string{"3:t3", "5:t5"}; !slices.Equal(inBatch, want) {
		t.Errorf("the next command of the batch lists %v, want %v", inBatch, want)
	}
}

// Counts: the writer's reads see the batch's changes; the stored counters are written once
// per batch at their final value, a counter at zero is deleted, a count never goes below
// zero, a discarded batch's changes are dropped, and a reopened store reads them back.
func TestCounts(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	add := func(tx *Txn, kind string, state events.TaskState, d int64) error {
		return tx.w.AddCount(kind, state, d)
	}
	var inCmd, nextCmd string
	errs := inOneBatch(t, s,
		func(tx *Txn) error {
			err := errors.Join(
				add(tx, "mail", events.StatePending, 1),
				add(tx, "mail", events.StatePending, 1),
				add(tx, "ab", events.StatePending, 1),
				add(tx, "b", events.StateRunning, 1),
			)
			inCmd = countsOf(t, tx.Reader())
			return err
		},
		func(tx *Txn) error {
			err := errors.Join(add(tx, "mail", events.StatePending, -1), add(tx, "mail", events.StateRunning, 1))
			nextCmd = countsOf(t, tx.Reader())
			return err
		})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Key order: kinds by length, then bytes.
	if want := "b/running=1 ab/pending=1 mail/pending=2"; inCmd != want {
		t.Errorf("counts in the command: %q, want %q", inCmd, want)
	}
	want := "b/running=1 ab/pending=1 mail/pending=1 mail/running=1"
	if nextCmd != want {
		t.Errorf("counts in the next command: %q, want %q", nextCmd, want)
	}
	if got := viewCounts(t, s); got != want {
		t.Errorf("stored counts %q, want %q", got, want)
	}
	if v := rawGet(t, s, countKey("mail", events.StatePending)); string(v) != string(encodeCount(1)) {
		t.Errorf("mail/pending stored as %x", v)
	}

	// Down to zero: the counter is deleted.
	if err := s.Update(ctx, func(tx *Txn) error { return add(tx, "b", events.StateRunning, -1) }); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := (reader{s.db, s.blobs}).get(countKey("b", events.StateRunning)); ok {
		t.Error("a counter at zero is still stored")
	}
	// Below zero: refused, nothing changes.
	err = s.Update(ctx, func(tx *Txn) error { return add(tx, "ab", events.StatePending, -2) })
	if !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), `"ab"`) {
		t.Errorf("a count below zero: %v, want ErrCorruptRecord naming the kind", err)
	}
	want = "ab/pending=1 mail/pending=1 mail/running=1"
	if got := viewCounts(t, s); got != want {
		t.Errorf("stored counts %q, want %q", got, want)
	}

	// A discarded batch: its first command's change is made on its first run only.
	runs := 0
	errBoom := errors.New("boom")
	errs = inOneBatch(t, s,
		func(tx *Txn) error {
			runs++
			if runs == 1 {
				return add(tx, "mail", events.StateSucceeded, 5)
			}
			return nil
		},
		func(tx *Txn) error {
			if err := tx.w.PutSessionTask("x", 1, "x"); err != nil {
				return err
			}
			return errBoom
		})
	if errs[0] != nil || !errors.Is(errs[1], errBoom) || runs != 2 {
		t.Fatalf("results %v after %d runs", errs, runs)
	}
	var writerCounts string
	if err := s.Update(ctx, func(tx *Txn) error { writerCounts = countsOf(t, tx.Reader()); return nil }); err != nil {
		t.Fatal(err)
	}
	if writerCounts != want {
		t.Errorf("the writer's counts after a discarded batch: %q, want %q", writerCounts, want)
	}
	if got := viewCounts(t, s); got != want {
		t.Errorf("stored counts after a discarded batch: %q, want %q", got, want)
	}

	// Reopened: the writer's counts are loaded from the store.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, &Options{})
	if err := s.Update(ctx, func(tx *Txn) error {
		writerCounts = countsOf(t, tx.Reader())
		return add(tx, "mail", events.StatePending, 1)
	}); err != nil {
		t.Fatal(err)
	}
	if writerCounts != want {
		t.Errorf("the writer's counts after reopening: %q, want %q", writerCounts, want)
	}
	if got, want := viewCounts(t, s), "ab/pending=1 mail/pending=2 mail/running=1"; got != want {
		t.Errorf("stored counts %q, want %q", got, want)
	}
}

// A count the writer changes is written once per batch, however many commands change it.
func TestCountWrittenOncePerBatch(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	b := s.db.NewIndexedBatch()
	defer b.Close()
	w := &writer{reader: reader{b, s.blobs}, committed: reader{s.db, s.blobs}, b: b, counts: map[countID]int64{}}
	for range 10 {
		if err := w.AddCount("k", events.StatePending, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.finish(0); err != nil {
		t.Fatal(err)
	}
	if b.Count() != 1 {
		t.Errorf("the batch holds %d writes, want 1", b.Count())
	}
}

// The writer lists counts in the order the reader does (the keys' order), long kinds too.
func TestCountsOrderMatchesReader(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	// Two-byte length prefixes: 255 is ff 01, 256 is 80 02, so the longer kind sorts first.
	long := strings.Repeat("k", 255)
	var inWriter string
	if err := s.Update(context.Background(), func(tx *Txn) error {
		for _, kind := range []string{"b", long, "ab", "a", long + "x"} {
			for _, st := range []events.TaskState{events.StateFailed, events.StatePending} {
				if err := tx.w.AddCount(kind, st, 1); err != nil {
					return err
				}
			}
		}
		inWriter = countsOf(t, tx.Reader())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if stored := viewCounts(t, s); stored != inWriter {
		t.Errorf("the writer lists\n%s\nthe reader\n%s", inWriter, stored)
	}
}
