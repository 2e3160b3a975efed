package pebblelog

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
)

// richStore returns a store whose projection has a key in every keyspace Verify compares:
// seedStore's history, a task with large values (blob index), a kind policy, a task under a
// lease (lease index), a keyed wake, and a schedule with its index entry.
func richStore(t *testing.T) *Store {
	t.Helper()
	s := openT(t, t.TempDir(), &Options{})
	seedStore(t, s)
	bigLife(t, s, "t8", "w8", bigValue(1, BlobMin), bigValue(2, BlobMin+100))
	appendEvents(t, s, &events.KindPolicySet{Header: events.Header{At: sec(7)}, Kind: "test.kind", MaxRunning: 5})
	appendEvents(t, s, submitted("s2", "t9", sec(8), false))
	appendEvents(t, s, claimed("s2", "t9", sec(9), 1, "tok-9"))
	wk := requestedWake("s2", "w9", sec(10))
	wk.IdempotencyKey = "wk9"
	appendEvents(t, s, wk)
	appendEvents(t, s, &events.ScheduleSet{Header: events.Header{SessionID: "s1", At: sec(11)}, Name: "every",
		Cron: "@every 1h", Kind: "test.kind", Input: []byte(`{}`), From: sec(11), Next: sec(11) + 3600e9})
	return s
}

// digestSound runs Verify's fast path alone.
func digestSound(t *testing.T, s *Store) bool {
	t.Helper()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	sound, err := s.verifyByDigest(context.Background(), snap, VerifyOptions{})
	if err != nil {
		t.Fatalf("verifyByDigest: %v", err)
	}
	return sound
}

// firstKey is the first stored key of the keyspace [lo, hi) and its value, or nil.
func firstKey(t *testing.T, s *Store, lo, hi []byte) (k, v []byte) {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	if !it.First() {
		return nil, nil
	}
	return bytes.Clone(it.Key()), bytes.Clone(it.Value())
}

// The fast path holds for a sound store with a key in every keyspace: the digests of the
// rebuild, folded in memory, and of the stored projection agree. Were it to fall back to
// the exact path on sound stores, Verify would still pass and only be slow: this is the test
// that sees it.
func TestVerifyByDigestSound(t *testing.T) {
	s := richStore(t)
	if !digestSound(t, s) {
		t.Fatal("the fast path did not find a sound store sound")
	}
	mustVerify(t, s)
}

// Every keyspace Verify compares is covered by the digests: one key of each (the first)
// missing, one extra, one with a changed value, and each is reported exactly (by the exact
// path, which the differing digest sends Verify to).
func TestVerifyByDigestFindsEachKeyspace(t *testing.T) {
	type keyspace struct {
		name   string
		lo, hi []byte
	}
	var spaces []keyspace
	for _, p := range projectionPrefixes {
		spaces = append(spaces, keyspace{string(p), []byte{p}, []byte{p + 1}})
	}
	spaces = append(spaces, keyspace{"last sequence", keyLastSeq, append(slices.Clone(keyLastSeq), 0)})
	probe := richStore(t)
	for _, ks := range spaces {
		if k, _ := firstKey(t, probe, ks.lo, ks.hi); k == nil {
			t.Errorf("keyspace %s: richStore has no key in it", ks.name)
		}
	}
	probe.Close()

	damage := []struct {
		name string
		do   func(t *testing.T, s *Store, k, v []byte) (want []string)
	}{
		{"missing", func(t *testing.T, s *Store, k, v []byte) []string {
			rawDelete(t, s, k)
			return []string{describeKey(k), "missing from the store"}
		}},
		{"extra", func(t *testing.T, s *Store, k, v []byte) []string {
			if bytes.HasPrefix(k, keyLastSeq) {
				return nil // a keyspace of one key: an extra key is outside it
			}
			extra := append(slices.Clone(k), 0xff)
			rawSet(t, s, extra, v)
			return []string{describeKey(extra), "stored, but not in the rebuild"}
		}},
		{"changed value", func(t *testing.T, s *Store, k, v []byte) []string {
			changed := append(slices.Clone(v), 'x')
			if bytes.HasPrefix(k, keyLastSeq) || k[0] == prefixCount {
				changed = encodeCount(9) // 8 bytes: read as a number
			}
			rawSet(t, s, k, changed)
			return []string{describeKey(k)}
		}},
	}
	for _, ks := range spaces {
		for _, d := range damage {
			t.Run(ks.name+"/"+d.name, func(t *testing.T) {
				s := richStore(t)
				k, v := firstKey(t, s, ks.lo, ks.hi)
				if k == nil {
					t.Skip("no key")
				}
				want := d.do(t, s, k, v)
				if want == nil {
					t.Skip("not a damage of this keyspace")
				}
				if digestSound(t, s) {
					t.Fatalf("the fast path found the store sound after the %s key %q", d.name, k)
				}
				p := verifyProblems(t, s)
				if !hasProblem(p, want...) {
					t.Errorf("Verify did not report %q; it reported:\n%s", want, strings.Join(p, "\n"))
				}
			})
		}
	}
}

// Verify stops when its context is done: here at its first progress report, after the
// first chunk of the fold, and the stored side's reading stops too (Verify waits for it).
func TestVerifyStopsWhenCancelled(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	var evs []events.Event
	for i := range 3000 {
		evs = append(evs, submitted("s1", "t"+strconv.Itoa(i), sec(1), false))
	}
	appendEvents(t, s, evs...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := 0
	_, err := s.Verify(ctx, VerifyOptions{Progress: func(done, total uint64) { reports++; cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Verify after a cancel: %v, want context.Canceled", err)
	}
	if reports != 1 {
		t.Errorf("%d progress reports after the cancel, want 1", reports)
	}
}
