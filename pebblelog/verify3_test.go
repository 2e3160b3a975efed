package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Verify compares format 3's keyspaces with the fold of the log: each kind of damage to the
// kind index, the session task lists or the counts is reported, naming the key. The seeded
// store (seedStore) holds, of kind "test.kind": t1 succeeded (s1, seq 1), t2 pending at 4
// (s2, seq 4) and t3 pending at 6 (s1, seq 6).
func TestVerifyFormat3Damage(t *testing.T) {
	const kind = "test.kind"
	pending := countKey(kind, events.StatePending)
	cases := []struct {
		name   string
		damage func(t *testing.T, s *Store)
		want   []string
	}{
		{"wrong count", func(t *testing.T, s *Store) { rawSet(t, s, pending, encodeCount(5)) },
			[]string{`count (kind "test.kind", state pending): stored 5, rebuilt 2`}},
		{"count missing", func(t *testing.T, s *Store) { rawDelete(t, s, countKey(kind, events.StateSucceeded)) },
			[]string{`count (kind "test.kind", state succeeded): missing from the store`}},
		{"extra count", func(t *testing.T, s *Store) { rawSet(t, s, countKey("ghost", events.StateRunning), encodeCount(1)) },
			[]string{`count (kind "ghost", state running): stored, but not in the rebuild`}},
		{"count of the wrong size", func(t *testing.T, s *Store) { rawSet(t, s, pending, []byte{2}) },
			[]string{`count (kind "test.kind", state pending): stored`, "rebuilt"}},
		{"kind index entry missing", func(t *testing.T, s *Store) { rawDelete(t, s, kindIndexKey(kind, 0, sec(4), 4)) },
			[]string{fmt.Sprintf(`kind index entry (kind "test.kind", priority 0, at %d, seq 4): missing from the store`, sec(4))}},
		{"extra kind index entry", func(t *testing.T, s *Store) { rawSet(t, s, kindIndexKey(kind, 0, sec(9), 9), []byte("t9")) },
			[]string{fmt.Sprintf(`kind index entry (kind "test.kind", priority 0, at %d, seq 9): stored, but not in the rebuild`, sec(9))}},
		{"kind index entry under another kind", func(t *testing.T, s *Store) {
			rawDelete(t, s, kindIndexKey(kind, 0, sec(6), 6))
			rawSet(t, s, kindIndexKey("other", 0, sec(6), 6), []byte("t3"))
		}, []string{`kind index entry (kind "test.kind", priority 0, at`, `seq 6): missing from the store`}},
		{"kind index entry naming another task", func(t *testing.T, s *Store) { rawSet(t, s, kindIndexKey(kind, 0, sec(4), 4), []byte("t3")) },
			[]string{fmt.Sprintf(`kind index entry (kind "test.kind", priority 0, at %d, seq 4): stored "t3", rebuilt "t2"`, sec(4))}},
		{"session task missing", func(t *testing.T, s *Store) { rawDelete(t, s, sessionTaskKey("s1", 6)) },
			[]string{`session task list (session "s1", submit seq 6): missing from the store`}},
		{"extra session task", func(t *testing.T, s *Store) { rawSet(t, s, sessionTaskKey("s2", 9), []byte("t9")) },
			[]string{`session task list (session "s2", submit seq 9): stored, but not in the rebuild`}},
		// Format 5: the per-session wake index (w1 of s1, available at 5, record seq 5).
		{"session wake entry missing", func(t *testing.T, s *Store) { rawDelete(t, s, sessionWakeKey("s1", sec(5), 5)) },
			[]string{fmt.Sprintf(`session wake index entry (session "s1", at %d, seq 5): missing from the store`, sec(5))}},
		{"session wake entry under another session", func(t *testing.T, s *Store) {
			rawDelete(t, s, sessionWakeKey("s1", sec(5), 5))
			rawSet(t, s, sessionWakeKey("s2", sec(5), 5), []byte("w1"))
		}, []string{`session wake index entry (session "s2", at`, `seq 5): stored, but not in the rebuild`}},
		{"session wake entry naming another wake", func(t *testing.T, s *Store) { rawSet(t, s, sessionWakeKey("s1", sec(5), 5), []byte("w9")) },
			[]string{fmt.Sprintf(`session wake index entry (session "s1", at %d, seq 5): stored "w9", rebuilt "w1"`, sec(5))}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := seeded(t)
			c.damage(t, s)
			mustHaveProblem(t, verifyProblems(t, s), c.want...)
		})
	}
}

// A damaged counter is refused where it is read: by Open (the writer loads the counts) and by
// Counts, naming the key.
func TestDamagedCountRefused(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	seedStore(t, s)
	rawSet(t, s, countKey("test.kind", events.StatePending), []byte{1, 2, 3})
	err := s.View(context.Background(), func(r projection.Reader) error {
		return r.Counts(func(string, events.TaskState, int64) bool { return true })
	})
	if !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), `"test.kind"`) {
		t.Errorf("Counts over a damaged counter: %v, want ErrCorruptRecord naming its kind", err)
	}
	rawSet(t, s, countKey("test.kind", events.StatePending), encodeCount(2))
	rawSet(t, s, []byte{prefixCount, 3, 'a', 'b', 'c', 99}, encodeCount(1)) // no such state
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, &Options{})
	if !errors.Is(err, ErrCorruptStore) || !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), "counts") {
		t.Errorf("Open with a damaged counter: %v, want ErrCorruptStore reading the counts", err)
	}
}
