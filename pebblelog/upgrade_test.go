package pebblelog

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// format1Dump is testdata/format1-records.json: every record of the format-1 fixture as the
// format-1 build read it (TestWriteFormat1Fixture).
type format1Dump struct {
	LastSeq uint64
	Tasks   []*projection.Task
	Wakes   []*projection.Wake
}

func loadFormat1Dump(t *testing.T) format1Dump {
	t.Helper()
	return loadDump(t, "format1-records.json")
}

// loadDump reads a fixture's record dump (format1-records.json, format2-records.json).
func loadDump(t *testing.T, name string) format1Dump {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var d format1Dump
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Tasks) == 0 || len(d.Wakes) == 0 {
		t.Fatalf("the dump has %d tasks and %d wakes", len(d.Tasks), len(d.Wakes))
	}
	return d
}

// copyFixture copies testdata/format1-store into dir on fs, synced: every test opens a copy
// (an Open read-write upgrades it, and even a read-only one creates lock files).
func copyFixture(t *testing.T, fs vfs.FS, dir string) {
	t.Helper()
	copyFixtureFrom(t, "format1-store", fs, dir)
}

// copyFixtureFrom copies the fixture testdata/name into dir on fs, synced.
func copyFixtureFrom(t *testing.T, name string, fs vfs.FS, dir string) {
	t.Helper()
	src := filepath.Join("testdata", name)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		f, err := fs.Create(fs.PathJoin(dir, e.Name()), vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(f.Sync(), f.Close()); err != nil {
			t.Fatal(err)
		}
	}
	d, err := fs.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(d.Sync(), d.Close()); err != nil {
		t.Fatal(err)
	}
	if parent, err := fs.OpenDir(fs.PathDir(dir)); err == nil {
		parent.Sync()
		parent.Close()
	}
}

// formats returns the version in the marker and in the format key of the store in dir.
func formats(t *testing.T, fs vfs.FS, dir string) (marker, key int) {
	t.Helper()
	s, err := Open(dir, &Options{FS: fs, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open: %v", err)
	}
	defer s.Close()
	marker, key, err = s.storeFormats()
	if err != nil {
		t.Fatal(err)
	}
	return marker, key
}

// checkRecords reads every record of the dump through View (the snapshot path of the work
// package) and ScanTasks/ScanWakes (the replay tool's) and requires it equal, values included.
func checkRecords(t *testing.T, s *Store, d format1Dump) {
	t.Helper()
	err := s.View(context.Background(), func(r projection.Reader) error {
		for _, want := range d.Tasks {
			got, err := r.Task(want.ID)
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("task %s reads\n%+v\nwant\n%+v", want.ID, got, want)
			}
		}
		for _, want := range d.Wakes {
			got, err := r.Wake(want.ID)
			if err != nil {
				return err
			}
			if got != nil && want.Acked && want.AckedAt == 0 && s.format >= 3 {
				// Older formats kept no AckedAt; the upgrade to format 3 sets it from the
				// log, and Verify checks it against the fold.
				w := *want
				w.AckedAt = got.AckedAt
				want = &w
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("wake %s reads\n%+v\nwant\n%+v", want.ID, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	scanned := map[string][]byte{}
	if err := s.ScanTasks(context.Background(), func(x *projection.Task) error {
		scanned[x.ID] = x.Input
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, want := range d.Tasks {
		if string(scanned[want.ID]) != string(want.Input) {
			t.Errorf("ScanTasks: task %s input %.40q, want %.40q", want.ID, scanned[want.ID], want.Input)
		}
	}
	if last, err := s.LastSeq(context.Background()); err != nil || last != d.LastSeq {
		t.Errorf("LastSeq = %d, %v; want %d", last, err, d.LastSeq)
	}
}

// The format-1 fixture opens read-only without being upgraded (the replay tool), then
// read-write, which upgrades it; before and after, every record reads exactly as the
// format-1 build read it, and Verify finds nothing.
func TestFormat1StoreUpgrades(t *testing.T) {
	d := loadFormat1Dump(t)
	dir := t.TempDir()
	copyFixture(t, vfs.Default, dir)

	ro, err := Open(dir, &Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open of a format-1 store: %v", err)
	}
	checkRecords(t, ro, d)
	mustVerify(t, ro)
	ro.Close()
	if m, k := formats(t, vfs.Default, dir); m != 1 || k != 1 {
		t.Fatalf("after read-only opens: marker %d, format key %d; want 1 and 1 (no upgrade)", m, k)
	}

	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatalf("read-write Open of a format-1 store: %v", err)
	}
	checkRecords(t, s, d)
	mustVerify(t, s)

	// A record rewritten after the upgrade is written without its input and still reads
	// with it: claim the one task that is due.
	var due *projection.Task
	for _, x := range d.Tasks {
		if x.State == events.StatePending && !x.HasRunAt && x.CancelRequestedAt == 0 {
			due = x
		}
	}
	if due == nil || len(due.Input) == 0 {
		t.Fatal("the fixture has no due pending task with an input")
	}
	raw := func() *projection.Task {
		t.Helper()
		v, ok, err := reader{s.db, s.blobs}.get(idKey(prefixTask, due.ID))
		if err != nil || !ok {
			t.Fatalf("task record %s: %v, %v", due.ID, ok, err)
		}
		x, err := decodeTask(idKey(prefixTask, due.ID), v)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	if len(raw().Input) == 0 {
		t.Fatal("the format-1 record carries no input: the fixture does not test the upgrade")
	}
	at := due.CreatedAt + 1e9
	appendEvents(t, s, &events.TaskClaimed{
		Header: events.Header{SessionID: due.SessionID, At: at},
		TaskID: due.ID, Attempt: 1, LeaseToken: "tok-after-upgrade", LeaseExpiresAt: at + 60e9,
	})
	if in := raw().Input; len(in) != 0 {
		t.Errorf("the record rewritten after the upgrade carries its input (%q): still format 1", in)
	}
	err = s.View(context.Background(), func(r projection.Reader) error {
		x, err := r.Task(due.ID)
		if err == nil && (x.State != events.StateRunning || string(x.Input) != string(due.Input)) {
			t.Errorf("claimed task reads %s with input %q, want running with %q", x.State, x.Input, due.Input)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m, k := formats(t, vfs.Default, dir); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after a read-write open: marker %d, format key %d; want %d", m, k, FormatVersion)
	}
	// And it still opens read-only, for the replay tool.
	ro, err = Open(dir, &Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	mustVerify(t, ro)
}

// A crash between the upgrade's two writes (the format key is written and synced, the marker
// is not) leaves a store that opens, upgraded, with every record as before. The crash is a
// failed marker write followed by a crash clone of the filesystem, which keeps only what was
// synced.
func TestUpgradeCrashBetweenKeyAndMarker(t *testing.T) {
	d := loadFormat1Dump(t)
	mem := vfs.NewCrashableMem()
	copyFixture(t, mem, "/store")
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
	if m, k := formats(t, crashed, "/store"); m != 1 || k != FormatVersion {
		t.Fatalf("after the crash: marker %d, format key %d; want 1 and %d (the key is written first)", m, k, FormatVersion)
	}
	// A format-1 build reads the format key before anything else in the database and refuses
	// a newer one (checkFormatKey), so it cannot misread the records written from now on.

	s, err := Open("/store", &Options{FS: crashed})
	if err != nil {
		t.Fatalf("Open after a crash mid-upgrade: %v", err)
	}
	checkRecords(t, s, d)
	mustVerify(t, s)
	s.Close()
	if m, k := formats(t, crashed, "/store"); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after reopening: marker %d, format key %d; want %d", m, k, FormatVersion)
	}
}

// The other order (marker written, format key not) is not what upgrade writes, but a store
// left that way (by a crash of some other tool, or by hand) must open too.
func TestUpgradeMarkerAheadOfKey(t *testing.T) {
	d := loadFormat1Dump(t)
	dir := t.TempDir()
	copyFixture(t, vfs.Default, dir)
	if err := writeMarker(vfs.Default, dir); err != nil {
		t.Fatal(err)
	}
	if m, k := formats(t, vfs.Default, dir); m != FormatVersion || k != 1 {
		t.Fatalf("marker %d, format key %d; want %d and 1", m, k, FormatVersion)
	}
	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatalf("Open with the marker ahead of the format key: %v", err)
	}
	checkRecords(t, s, d)
	mustVerify(t, s)
	s.Close()
	if m, k := formats(t, vfs.Default, dir); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after Open: marker %d, format key %d; want %d", m, k, FormatVersion)
	}
}

// A failed format-key write fails Open and changes nothing: the store is still format 1 and
// opens (and upgrades) next time.
func TestUpgradeFailedKeyWrite(t *testing.T) {
	d := loadFormat1Dump(t)
	mem := vfs.NewCrashableMem()
	copyFixture(t, mem, "/store")
	// Pebble writes the format key through its WAL; fail that WAL's sync.
	failSync := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
			return errorfs.ErrInjected
		}
		return nil
	})
	func() {
		defer func() {
			// Pebble treats a failed WAL sync as fatal (Logger.Fatalf), which panics here:
			// either way, Open must not report success.
			recover()
		}()
		s, err := Open("/store", &Options{FS: errorfs.Wrap(mem, failSync)})
		if err == nil {
			s.Close()
			t.Fatal("Open succeeded though the format key's write failed")
		}
	}()
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	if m, k := formats(t, crashed, "/store"); m != 1 || k != 1 {
		t.Fatalf("after a failed key write: marker %d, format key %d; want 1 and 1", m, k)
	}
	s, err := Open("/store", &Options{FS: crashed})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkRecords(t, s, d)
}

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
