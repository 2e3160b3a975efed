package pebblelog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// The upgrade to format 3 (upgrade.go) on the format-2 fixture (testdata/format2-store,
// written by the last format-2 build: TestWriteFormat2Fixture) and the format-1 one.

// format3Keys lists what the store holds in format 3's keyspaces, one line per key, sorted.
func format3Keys(t *testing.T, db pebble.Reader) []string {
	t.Helper()
	var lines []string
	for _, p := range format3Prefixes {
		if p == prefixPrunable || p == prefixSubject {
			// The retention index needs the acknowledgment times, which the dumps do not
			// hold, and the subject index the log: Verify compares both with the fold of the
			// log (mustVerify), and TestUpgradeBuildsRetentionIndex checks them on their own.
			continue
		}
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
		if err != nil {
			t.Fatal(err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			v := it.Value()
			if p == prefixCount && len(v) == 8 {
				lines = append(lines, fmt.Sprintf("%s = %d", describeKey(it.Key()), int64(binary.BigEndian.Uint64(v))))
			} else {
				lines = append(lines, fmt.Sprintf("%s = %s", describeKey(it.Key()), v))
			}
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(lines)
	return lines
}

// wantFormat3Keys is what format3Keys must list for a store whose tasks are those of the dump:
// each task in its session's list, in its kind's due index where it is in the due index, and
// counted once under its kind and state.
func wantFormat3Keys(d format1Dump) []string {
	var lines []string
	counts := map[countID]int64{}
	for _, x := range d.Tasks {
		lines = append(lines, fmt.Sprintf("%s = %s", describeKey(sessionTaskKey(x.SessionID, x.SubmitSeq)), x.ID))
		if at, in := x.EligibleAt(); in {
			lines = append(lines, fmt.Sprintf("%s = %s", describeKey(kindIndexKey(x.Kind, x.Priority, at, x.SubmitSeq)), x.ID))
		}
		counts[countID{x.Kind, x.State}]++
	}
	for id, n := range counts {
		lines = append(lines, fmt.Sprintf("%s = %d", describeKey(countKey(id.kind, id.state)), n))
	}
	slices.Sort(lines)
	return lines
}

func checkFormat3Keys(t *testing.T, s *Store, d format1Dump) {
	t.Helper()
	got, want := format3Keys(t, s.db), wantFormat3Keys(d)
	if !slices.Equal(got, want) {
		t.Errorf("format 3's keyspaces hold\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The format-2 fixture opens read-only as it is (its format-3 reads refused by name), then
// read-write, which builds the kind index, the session task lists and the counts from its
// records; the records read as before, the reads go through the new keyspaces, and Verify
// (which folds the log) agrees with what the upgrade built.
func TestFormat2StoreUpgrades(t *testing.T) {
	d := loadDump(t, "format2-records.json")
	dir := t.TempDir()
	copyFixtureFrom(t, "format2-store", vfs.Default, dir)
	if len(wantFormat3Keys(d)) < 20 {
		t.Fatalf("the fixture gives the upgrade only %d keys to build", len(wantFormat3Keys(d)))
	}

	ro, err := Open(dir, &Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open of a format-2 store: %v", err)
	}
	checkRecords(t, ro, d)
	mustVerify(t, ro)
	err = ro.View(context.Background(), func(r projection.Reader) error {
		for _, err := range []error{
			r.ScanIndex(projection.IndexKindDue, "crawl", math.MinInt64, 0, func(projection.IndexEntry) bool { return true }),
			r.ScanSessionTasks("s1", 0, func(uint64, string) bool { return true }),
			r.Counts(func(string, events.TaskState, int64) bool { return true }),
			r.ScanIndex(projection.IndexSessionWakes, "s1", math.MinInt64, 0, func(projection.IndexEntry) bool { return true }),
		} {
			if !errors.Is(err, ErrNeedsUpgrade) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "format 2") {
				t.Errorf("a format-3 read of a read-only format-2 store: %v, want ErrNeedsUpgrade naming the store and its format", err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if keys := format3Keys(t, ro.db); len(keys) != 0 {
		t.Errorf("a read-only open wrote %d keys", len(keys))
	}
	ro.Close()
	if m, k := formats(t, vfs.Default, dir); m != 2 || k != 2 {
		t.Fatalf("after a read-only open: marker %d, format key %d; want 2 and 2", m, k)
	}

	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatalf("read-write Open of a format-2 store: %v", err)
	}
	checkRecords(t, s, d)
	checkFormat3Keys(t, s, d)
	mustVerify(t, s)
	// The reads through the new keyspaces.
	err = s.View(context.Background(), func(r projection.Reader) error {
		var crawl []string
		if err := r.ScanIndex(projection.IndexKindDue, "crawl", math.MinInt64, 1<<62, func(e projection.IndexEntry) bool {
			crawl = append(crawl, e.ID)
			return true
		}); err != nil {
			return err
		}
		var s3 []string
		if err := r.ScanSessionTasks("s3", 0, func(_ uint64, id string) bool {
			s3 = append(s3, id)
			return true
		}); err != nil {
			return err
		}
		var resize int64
		if err := r.Counts(func(kind string, state events.TaskState, n int64) bool {
			if kind == "resize" && state == events.StatePending {
				resize = n
			}
			return true
		}); err != nil {
			return err
		}
		if len(crawl) != 2 || len(s3) != 3 || resize != 3 {
			t.Errorf("after the upgrade: %d crawl tasks in the kind index, %d tasks in s3's list, %d resize tasks pending; want 2, 3, 3",
				len(crawl), len(s3), resize)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m, k := formats(t, vfs.Default, dir); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after a read-write open: marker %d, format key %d; want %d", m, k, FormatVersion)
	}
	// Opened again, nothing is built twice, and it still reads read-only.
	s = openT(t, dir, &Options{})
	checkFormat3Keys(t, s, d)
	s.Close()
	ro, err = Open(dir, &Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	mustVerify(t, ro)
}

// The format-1 fixture is upgraded through format 2 to 3: its records carry their inputs
// (format 1), and the new keyspaces are built from them like any other.
func TestFormat1StoreUpgradesToFormat3(t *testing.T) {
	d := loadFormat1Dump(t)
	dir := t.TempDir()
	copyFixture(t, vfs.Default, dir)
	s := openT(t, dir, &Options{})
	checkRecords(t, s, d)
	checkFormat3Keys(t, s, d)
	mustVerify(t, s)
}

// A crash in the upgrade before its format key is durable (the key's synced write fails, and
// the crash keeps a random part of the unsynced build) leaves a format-2 store. Meanwhile a
// format-2 build may open it and change tasks without keeping the new keyspaces, so whatever
// the crash kept of them is stale: the next upgrade clears them and builds them again.
func TestUpgradeCrashBeforeFormatKey(t *testing.T) {
	d := loadDump(t, "format2-records.json")
	staleRuns := 0
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			copyFixtureFrom(t, "format2-store", mem, "/store")
			// The build's batches are committed without sync; the format key's write is the
			// first synced one.
			failSync := errorfs.InjectorFunc(func(op errorfs.Op) error {
				if strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
					return errorfs.ErrInjected
				}
				return nil
			})
			func() {
				defer func() { recover() }() // Pebble may treat the failed sync as fatal
				s, err := Open("/store", &Options{FS: errorfs.Wrap(mem, failSync)})
				if err == nil {
					s.Close()
					t.Fatal("Open succeeded though the format key's write failed")
				}
			}()
			crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(seed, 0))})
			// The crash keeps a prefix of the WAL: the format key, the build's last write,
			// may be in it, and then the whole build is.
			switch m, k := formats(t, crashed, "/store"); {
			case m != 2 || (k != 2 && k != FormatVersion):
				t.Fatalf("after the crash: marker %d, format key %d; want 2 and 2 or %d", m, k, FormatVersion)
			case k == 2:
				staleRuns++
				// What a format-2 build would leave: entries the build no longer matches.
				db, err := pebble.Open("/store", &pebble.Options{FS: crashed, FormatMajorVersion: pebbleFormat, Logger: testLogger{t}})
				if err != nil {
					t.Fatal(err)
				}
				stale := db.NewBatch()
				stale.Set(kindIndexKey("crawl", 0, 1, 999), []byte("task_gone"), nil)
				stale.Set(sessionTaskKey("s9", 999), []byte("task_gone"), nil)
				stale.Set(countKey("crawl", events.StateRunning), encodeCount(42), nil)
				if err := errors.Join(stale.Commit(pebble.Sync), db.Close()); err != nil {
					t.Fatal(err)
				}
			}

			s := openT(t, "/store", &Options{FS: crashed})
			checkRecords(t, s, d)
			checkFormat3Keys(t, s, d)
			mustVerify(t, s)
		})
	}
	if staleRuns == 0 {
		t.Error("no crash left the format key at 2: the stale keyspaces were never cleared")
	}
}

// A crash between the format key and the marker (the key is written and synced, the marker
// is not) leaves key 3 with marker 2: a format-2 build refuses it (the key is too new), and
// this build finishes the upgrade without building again.
func TestUpgrade3CrashBetweenKeyAndMarker(t *testing.T) {
	d := loadDump(t, "format2-records.json")
	mem := vfs.NewCrashableMem()
	copyFixtureFrom(t, "format2-store", mem, "/store")
	failMarker := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, MarkerFile+".tmp") {
			return errorfs.ErrInjected
		}
		return nil
	})
	_, err := Open("/store", &Options{FS: errorfs.Wrap(mem, failMarker)})
	if !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Open with a failing marker write: %v, want the injected error", err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	if m, k := formats(t, crashed, "/store"); m != 2 || k != FormatVersion {
		t.Fatalf("after the crash: marker %d, format key %d; want 2 and %d", m, k, FormatVersion)
	}
	// The build is durable with the key: every batch before a synced one is.
	db, err := pebble.Open("/store", &pebble.Options{FS: crashed, FormatMajorVersion: pebbleFormat, ReadOnly: true, Logger: testLogger{t}})
	if err != nil {
		t.Fatal(err)
	}
	got, want := format3Keys(t, db), wantFormat3Keys(d)
	db.Close()
	if !slices.Equal(got, want) {
		t.Fatalf("after the crash the keyspaces hold\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	s, err := Open("/store", &Options{FS: crashed})
	if err != nil {
		t.Fatalf("Open after a crash mid-upgrade: %v", err)
	}
	checkRecords(t, s, d)
	checkFormat3Keys(t, s, d)
	mustVerify(t, s)
	s.Close()
	if m, k := formats(t, crashed, "/store"); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after reopening: marker %d, format key %d; want %d", m, k, FormatVersion)
	}
}

// A store of a newer format than this build's is still refused, by the marker or the key,
// read-only or not, and left as it was.
func TestUpgradeRefusesNewerFormat(t *testing.T) {
	for _, where := range []string{"marker", "key"} {
		t.Run(where, func(t *testing.T) {
			dir := t.TempDir()
			copyFixtureFrom(t, "format2-store", vfs.Default, dir)
			newer := fmt.Sprintf("worklog store format %d", FormatVersion+1)
			if where == "marker" {
				writeFile(t, dir+"/"+MarkerFile, newer+"\n")
			} else {
				db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebbleFormat, Logger: testLogger{t}})
				if err != nil {
					t.Fatal(err)
				}
				if err := errors.Join(db.Set(keyFormat, []byte(newer), pebble.Sync), db.Close()); err != nil {
					t.Fatal(err)
				}
			}
			before := fileHashes(t, dir)
			for _, ro := range []bool{true, false} {
				_, err := Open(dir, &Options{ReadOnly: ro})
				wantOpenErr(t, err, ErrFormatTooNew, dir)
				if !strings.Contains(err.Error(), fmt.Sprint(FormatVersion+1)) {
					t.Errorf("read-only %v: %v does not name format %d", ro, err, FormatVersion+1)
				}
			}
			after := fileHashes(t, dir)
			for _, lock := range []string{"WORKLOG.lock", "LOCK"} { // the lock files Open takes
				delete(before, lock)
				delete(after, lock)
			}
			if !maps.Equal(before, after) {
				t.Errorf("a refused Open changed the store:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}
