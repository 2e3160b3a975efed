package pebblelog

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/projection"
)

// dueKeys lists the due index and the per-kind due index, one line per key, sorted.
func dueKeys(t *testing.T, db pebble.Reader) []string {
	t.Helper()
	var lines []string
	for _, p := range []byte{prefixDue, prefixKindDue} {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
		if err != nil {
			t.Fatal(err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			lines = append(lines, fmt.Sprintf("%s %d = %s", describeKey(it.Key()), len(it.Key()), it.Value()))
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(lines)
	return lines
}

// wantDueKeys is what the format-6 due indexes hold for a store whose tasks are those of d.
func wantDueKeys(d format1Dump) []string {
	var lines []string
	for _, x := range d.Tasks {
		if at, in := x.EligibleAt(); in {
			k := dueKey(x.Priority, at, x.SubmitSeq)
			lines = append(lines, fmt.Sprintf("%s %d = %s", describeKey(k), len(k), x.ID))
			k = kindIndexKey(x.Kind, x.Priority, at, x.SubmitSeq)
			lines = append(lines, fmt.Sprintf("%s %d = %s", describeKey(k), len(k), x.ID))
		}
	}
	slices.Sort(lines)
	return lines
}

// scanAll is every entry a reader's scan of the due index returns at maxAt, as "id@at".
func scanAll(t *testing.T, s *Store, maxAt int64) []string {
	t.Helper()
	var got []string
	err := s.View(context.Background(), func(r projection.Reader) error {
		return r.ScanIndex(projection.IndexDue, "", math.MinInt64, maxAt, func(e projection.IndexEntry) bool {
			got = append(got, fmt.Sprintf("%s@%d", e.ID, e.At))
			return true
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// The upgrade to format 6 (upgrade6.go) on the format-3 fixture, whose due indexes have no
// priority in their keys: read-only, the store reads as it is (the due index in its old
// layout, in claim order, and Verify leaves the old layout alone); read-write, both due
// indexes are cleared and rebuilt from the records, keyed by priority (25-byte due keys),
// a stale entry of the old layout left by an older build is gone, the claim order is the
// same, and Verify (which folds the log) agrees.
func TestFormat3StoreUpgradesToFormat6(t *testing.T) {
	dir := t.TempDir()
	copyFixtureFrom(t, "format3-store", vfs.Default, dir)

	ro, err := Open(dir, &Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	before := scanAll(t, ro, math.MaxInt64)
	if len(before) < 2 {
		t.Fatalf("the fixture has %d due entries; the test needs some", len(before))
	}
	for _, k := range dueKeys(t, ro.db) {
		if !strings.HasSuffix(strings.SplitN(k, " = ", 2)[0], " 17") && strings.HasPrefix(k, "due index") {
			t.Fatalf("the fixture's due index is not in the old layout: %s", k)
		}
	}
	mustVerify(t, ro)
	var d format1Dump
	if err := ro.ScanTasks(t.Context(), func(x *projection.Task) error {
		d.Tasks = append(d.Tasks, x)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	// What an older build would leave if it ran after a crashed upgrade: an old-layout entry.
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebbleFormat, Logger: testLogger{t}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set(indexKey(prefixDue, 1, 999), []byte("task_gone"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, want := dueKeys(t, s.db), wantDueKeys(d)
	if !slices.Equal(got, want) {
		t.Errorf("the due indexes hold\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if after := scanAll(t, s, math.MaxInt64); !slices.Equal(after, before) {
		t.Errorf("claim order after the upgrade %v, before %v", after, before)
	}
	mustVerify(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m, k := formats(t, vfs.Default, dir); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after the upgrade: marker %d, format key %d; want %d", m, k, FormatVersion)
	}
}

// TestScanDuePriorities: the due index and a kind's index are walked in claim order, higher
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
