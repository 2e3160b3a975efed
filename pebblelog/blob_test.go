package pebblelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// bigValue is a JSON string of n bytes of random letters (incompressible enough that a
// copy shows).
func bigValue(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	b[0], b[n-1] = '"', '"'
	for i := 1; i < n-1; i++ {
		b[i] = 'a' + byte(rng.IntN(26))
	}
	return b
}

// bigLife is one task's life with large values: submitted with a large input, claimed,
// settled with a large output, and its completion wake recorded with the same output slice
// (as the work package's Finish does), in one command.
func bigLife(t *testing.T, s *Store, task, wake string, input, output []byte) []events.Event {
	t.Helper()
	sub := submitted("s", task, sec(1), true)
	sub.Input = input
	cl := claimed("s", task, sec(2), 1, "tok")
	st := settled("s", task, sec(3), 1, "tok")
	st.Outcome.Output = output
	wk := &events.WakeRecorded{Header: events.Header{SessionID: "s", At: sec(3)}, WakeID: wake,
		Reason: events.WakeTaskFinished, TaskID: task, Outcome: st.Outcome}
	appendEvents(t, s, sub)
	appendEvents(t, s, cl)
	appendEvents(t, s, st, wk)
	return []events.Event{sub, cl, st, wk}
}

func blobNames(t *testing.T, fs vfs.FS, dir string) []string {
	t.Helper()
	names, err := fs.List(fs.PathJoin(dir, BlobDir))
	if oserrNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// Large values are stored in blob files, one per value (the completion wake shares its
// task's output blob), and every reader gets them back whole: RawLog the very wire bytes
// Append would have stored, ReadLog the events, View and ScanTasks the records' values; the
// task record in Pebble holds neither the input nor the output; Verify agrees; after a
// reopen too.
func TestBlobValuesReadBack(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	in, out := bigValue(1, BlobMin), bigValue(2, BlobMin+100)
	evs := bigLife(t, s, "t1", "w1", in, out)
	if n := blobNames(t, vfs.Default, dir); len(n) != 2 {
		t.Fatalf("blob files %v, want 2 (input, and the output shared by the settle and the wake)", n)
	}
	if du, err := s.DiskUsage(context.Background()); err != nil || du < uint64(len(in)+len(out)) {
		t.Errorf("DiskUsage %d, %v: less than the blobs' %d bytes", du, err, len(in)+len(out))
	}
	check := func(s *Store, when string) {
		t.Helper()
		var i int
		err := s.RawLog(context.Background(), 0, 0, func(seq uint64, raw []byte) error {
			want, err := events.Encode(evs[i])
			if err != nil {
				return err
			}
			if !bytes.Equal(raw, want) {
				t.Errorf("%s: RawLog at seq %d: %d bytes, not the event's %d wire bytes", when, seq, len(raw), len(want))
			}
			i++
			return nil
		})
		if err != nil || i != len(evs) {
			t.Fatalf("%s: RawLog: %d events, %v", when, i, err)
		}
		got := readAll(t, s)
		if !bytes.Equal(got[0].(*events.TaskSubmitted).Input, in) || !bytes.Equal(got[2].(*events.TaskSettled).Outcome.Output, out) ||
			!bytes.Equal(got[3].(*events.WakeRecorded).Outcome.Output, out) {
			t.Errorf("%s: ReadLog does not give the values back", when)
		}
		raw, ok, err := reader{r: s.db}.get(idKey(prefixTask, "t1"))
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		rec, err := decodeTask(idKey(prefixTask, "t1"), raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Input) != 0 || len(rec.Outcome.Output) != 0 || len(raw) > 1024 {
			t.Errorf("%s: the task record holds %d bytes (input %d, output %d)", when, len(raw), len(rec.Input), len(rec.Outcome.Output))
		}
		err = s.View(context.Background(), func(r projection.Reader) error {
			tk, err := r.Task("t1")
			if err != nil {
				return err
			}
			if !bytes.Equal(tk.Input, in) || !bytes.Equal(tk.Outcome.Output, out) {
				t.Errorf("%s: View: task values differ", when)
			}
			w, err := r.Wake("w1")
			if err != nil {
				return err
			}
			if !bytes.Equal(w.Outcome.Output, out) {
				t.Errorf("%s: View: completion wake's output differs", when)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		mustVerify(t, s)
	}
	check(s, "open")
	// The writer's own reads (the decide code's), from the record cache and the DB.
	err := s.Update(context.Background(), func(tx *Txn) error {
		tk, err := tx.Reader().Task("t1")
		if err != nil {
			return err
		}
		if !bytes.Equal(tk.Input, in) || !bytes.Equal(tk.Outcome.Output, out) {
			t.Errorf("Txn.Reader: task values differ")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, &Options{})
	check(s, "reopened")
}

// A staged value is written before its command and taken by it without a second blob; a
// staged value no command took is deleted when released; a blob whose batch never committed
// (written, then the process ended) is an orphan the next read-write Open deletes, and a
// read-only Open leaves alone.
func TestBlobStagingAndOrphans(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	in := bigValue(3, BlobMin)
	release, err := s.StageValues(in, []byte(`"small"`))
	if err != nil {
		t.Fatal(err)
	}
	if n := blobNames(t, vfs.Default, dir); len(n) != 1 {
		t.Fatalf("after staging: blobs %v, want 1", n)
	}
	sub := submitted("s", "t1", sec(1), false)
	sub.Input = in
	appendEvents(t, s, sub)
	release()
	if n := blobNames(t, vfs.Default, dir); len(n) != 1 {
		t.Fatalf("after the command took the staged blob: blobs %v, want 1", n)
	}
	unused, err := s.StageValues(bigValue(4, BlobMin))
	if err != nil {
		t.Fatal(err)
	}
	if n := blobNames(t, vfs.Default, dir); len(n) != 2 {
		t.Fatalf("after staging another: blobs %v, want 2", n)
	}
	unused()
	if n := blobNames(t, vfs.Default, dir); len(n) != 1 {
		t.Fatalf("a staged blob no command took was not deleted: %v", n)
	}
	// An orphan: a blob written, its batch never committed.
	ref, err := s.blobs.write(bigValue(5, BlobMin))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ro := openT(t, dir, &Options{ReadOnly: true})
	if n := blobNames(t, vfs.Default, dir); len(n) != 2 {
		t.Fatalf("a read-only Open changed the blobs: %v", n)
	}
	ro.Close()
	s = openT(t, dir, &Options{})
	n := blobNames(t, vfs.Default, dir)
	if len(n) != 1 || n[0] == ref.name {
		t.Fatalf("after reopening: blobs %v; the orphan %s must be gone, the task's kept", n, ref.name)
	}
	mustVerify(t, s)
}

// A blob the log refers to that is damaged, cut, grown or missing is an error of kind
// ErrCorruptStore naming the file, from every read that needs it and from Verify; never a
// panic, never the wrong bytes.
func TestBlobDamage(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(path string) error
		detail string
	}{
		{"flipped", func(p string) error { return flipByte(p, BlobMin/2) }, "checksum mismatch"},
		{"truncated", func(p string) error { return os.Truncate(p, BlobMin/2) }, "bytes, the log says"},
		{"grown", func(p string) error {
			f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			_, err = f.Write([]byte("x"))
			return errors.Join(err, f.Close())
		}, "bytes, the log says"},
		{"deleted", os.Remove, "missing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir, &Options{})
			sub := submitted("s", "t1", sec(1), false)
			sub.Input = bigValue(6, BlobMin)
			appendEvents(t, s, sub)
			names := blobNames(t, vfs.Default, dir)
			if len(names) != 1 {
				t.Fatalf("blobs %v", names)
			}
			file := BlobDir + "/" + names[0]
			if err := c.damage(filepath.Join(dir, BlobDir, names[0])); err != nil {
				t.Fatal(err)
			}
			isDamage := func(what string, err error) {
				t.Helper()
				var be *BlobError
				if !errors.Is(err, ErrCorruptStore) || !errors.As(err, &be) || be.File != file ||
					!strings.Contains(err.Error(), c.detail) {
					t.Errorf("%s: %v; want ErrCorruptStore naming %s (%s)", what, err, file, c.detail)
				}
			}
			isDamage("ReadLog", s.ReadLog(context.Background(), 0, func(events.Event) error { return nil }))
			isDamage("RawLog", s.RawLog(context.Background(), 0, 0, func(uint64, []byte) error { return nil }))
			_, err := s.Event(context.Background(), 1)
			isDamage("Event", err)
			isDamage("View", s.View(context.Background(), func(r projection.Reader) error { _, err := r.Task("t1"); return err }))
			isDamage("Txn.Reader", s.Update(context.Background(), func(tx *Txn) error { _, err := tx.Reader().Task("t1"); return err }))
			if p := verifyProblems(t, s); !hasProblem(p, file, c.detail) {
				t.Errorf("Verify does not name %s: %q", file, p)
			}
		})
	}
}

func flipByte(path string, off int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		return err
	}
	b[0] ^= 0x20
	_, err = f.WriteAt(b, off)
	return err
}

// A prune deletes its subjects' blob index entries in its batch and their blob files once
// the batch is durable, and no other subject's; Verify agrees before and after. A blob index
// entry the log does not explain, or one missing, is a Verify problem.
func TestBlobPruneAndVerify(t *testing.T) {
	for _, noSync := range []bool{false, true} {
		dir := t.TempDir()
		s := openT(t, dir, &Options{NoSync: noSync})
		bigLife(t, s, "t1", "w1", bigValue(7, BlobMin), bigValue(8, BlobMin))
		appendEvents(t, s, &events.WakeClaimed{Header: events.Header{SessionID: "s", At: sec(4)}, WakeID: "w1", Attempt: 1, LeaseToken: "wt", LeaseExpiresAt: sec(60)})
		appendEvents(t, s, &events.WakeAcked{Header: events.Header{SessionID: "s", At: sec(5)}, WakeID: "w1", Attempt: 1, LeaseToken: "wt"})
		sub := submitted("s", "t2", sec(6), false)
		sub.Input = bigValue(9, BlobMin)
		appendEvents(t, s, sub)
		if n := blobNames(t, vfs.Default, dir); len(n) != 3 {
			t.Fatalf("blobs %v, want 3", n)
		}
		if got := countKeys(t, s.db, prefixBlob); got != 4 { // t1: input, output; w1: output; t2: input
			t.Fatalf("blob index: %d entries, want 4", got)
		}
		mustVerify(t, s)
		var res PruneResult
		err := s.Update(context.Background(), func(tx *Txn) error {
			var err error
			res, err = tx.Prune(sec(100), 100)
			return err
		})
		if err != nil || res.Tasks != 1 || res.Wakes != 1 {
			t.Fatalf("NoSync %v: Prune: %+v, %v", noSync, res, err)
		}
		if n := blobNames(t, vfs.Default, dir); len(n) != 1 {
			t.Fatalf("NoSync %v: after the prune: blobs %v, want t2's only", noSync, n)
		}
		if got := countKeys(t, s.db, prefixBlob); got != 1 {
			t.Fatalf("NoSync %v: blob index after the prune: %d entries, want 1", noSync, got)
		}
		mustVerify(t, s)
		// An entry without an event that refers to it, and t2's entry missing.
		rawSet(t, s, blobIndexKey("t9", "00000000000000000000000000000000.blob"), nil)
		mustHaveProblem(t, verifyProblems(t, s), "stored, but not in the rebuild")
		rawDelete(t, s, blobIndexKey("t9", "00000000000000000000000000000000.blob"))
		names := blobNames(t, vfs.Default, dir)
		rawDelete(t, s, blobIndexKey("t2", names[0]))
		mustHaveProblem(t, verifyProblems(t, s), "missing from the store")
		s.Close()
	}
}

// A checkpoint holds the blobs its database refers to; the copy opens, reads them and
// verifies.
func TestBlobCheckpoint(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	in, out := bigValue(10, BlobMin), bigValue(11, BlobMin)
	bigLife(t, s, "t1", "w1", in, out)
	cp := filepath.Join(t.TempDir(), "cp")
	if err := s.Checkpoint(cp); err != nil {
		t.Fatal(err)
	}
	c := openT(t, cp, &Options{})
	err := c.View(context.Background(), func(r projection.Reader) error {
		tk, err := r.Task("t1")
		if err == nil && (!bytes.Equal(tk.Input, in) || !bytes.Equal(tk.Outcome.Output, out)) {
			t.Error("the checkpoint's task values differ")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, c)
}

// Crash safety on a crashable filesystem (only what was synced survives): a blob staged
// (written and synced) whose command never committed is an orphan the reopened store
// removes; a committed submit (Update returned, SyncAlways) keeps its blob: the file and its
// directory entry were synced before the batch committed.
func TestBlobCrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	s, err := Open("/store", &Options{FS: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := bigValue(12, BlobMin)
	sub := submitted("s", "t1", sec(1), false)
	sub.Input = in
	release, err := s.StageValues(in)
	if err != nil {
		t.Fatal(err)
	}
	// Crash: the blob is written, its command not run.
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	c, err := Open("/store", &Options{FS: crashed})
	if err != nil {
		t.Fatal(err)
	}
	if n := blobNames(t, crashed, "/store"); len(n) != 0 {
		t.Errorf("blob written, commit lost: the reopened store kept %v", n)
	}
	if err := c.View(context.Background(), func(r projection.Reader) error {
		tk, err := r.Task("t1")
		if tk != nil {
			t.Error("blob written, commit lost: the task exists")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.Close()

	appendEvents(t, s, sub)
	release()
	crashed = mem.CrashClone(vfs.CrashCloneCfg{})
	c, err = Open("/store", &Options{FS: crashed})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.View(context.Background(), func(r projection.Reader) error {
		tk, err := r.Task("t1")
		if err != nil {
			return err
		}
		if tk == nil || !bytes.Equal(tk.Input, in) {
			t.Errorf("commit durable: the task or its input is lost: %v %d %.40q", tk != nil, len(tk.Input), tk.Input)
		}
		return nil
	}); err != nil {
		t.Fatalf("commit durable: %v", err)
	}
	mustVerify(t, c)
}

const verifyMemDirEnv = "WORKLOG_BLOB_VERIFY_DIR"

// Verify's rebuild reads every blob; the fold keeps a large value for the decide code of the
// event's command (keepTaskInput), which the rebuild never runs: it must forget each one
// after its event, or a log of many large values is held whole in memory until the end of a
// 4096-event chunk. A child process verifies a store of eight 16 MiB inputs; its peak RSS
// must grow by less than 6 of them over a child that verifies the same history with tiny
// inputs (it held all 8, 128 MiB, before).
func TestBlobVerifyMemory(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("measures a child process's peak RSS")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("reads the peak RSS from /proc")
	}
	const n, size = 8, 16 << 20
	peak := func(valueSize int) int64 {
		dir := t.TempDir()
		s, err := Open(dir, &Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			sub := submitted("s", fmt.Sprintf("t%d", i), sec(i), false)
			sub.Input = bigValue(uint64(i), valueSize)
			appendEvents(t, s, sub)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestBlobVerifyMemoryHelper$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), verifyMemDirEnv+"="+dir)
		out, err := cmd.CombinedOutput()
		m := regexp.MustCompile(`peak-rss (\d+)`).FindSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		v, _ := strconv.ParseInt(string(m[1]), 10, 64)
		return v
	}
	base, big := peak(16), peak(size)
	grew := big - base
	t.Logf("Verify of %d x %d MiB: peak RSS grew by %d MiB (%.1f values)", n, size>>20, grew>>20, float64(grew)/size)
	if grew > 6*size {
		t.Errorf("Verify's peak RSS grew by %d MiB for %d values of %d MiB: it holds them", grew>>20, n, size>>20)
	}
}

// TestBlobVerifyMemoryHelper is the child of TestBlobVerifyMemory.
func TestBlobVerifyMemoryHelper(t *testing.T) {
	dir := os.Getenv(verifyMemDirEnv)
	if dir == "" {
		t.Skip("child process of TestBlobVerifyMemory")
	}
	s := openT(t, dir, &Options{})
	mustVerify(t, s)
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VmHWM")
	}
	kib, _ := strconv.ParseInt(string(m[1]), 10, 64)
	fmt.Printf("peak-rss %d\n", kib<<10)
}

// StageValues on a closed store writes nothing and says so.
func TestBlobStageAfterClose(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	release, err := s.StageValues(bigValue(30, BlobMin))
	release()
	if !errors.Is(err, ErrClosed) {
		t.Errorf("StageValues after Close: %v, want ErrClosed", err)
	}
	if n := blobNames(t, vfs.Default, dir); len(n) != 0 {
		t.Errorf("StageValues after Close wrote %v", n)
	}
}

// With NoSync too a blob file and its directory entry are fsynced before any batch that
// refers to it commits: NoSync weakens only how recent the commits a crash keeps are. A
// later WAL sync (the archive's PlanPrune, removePrunedBlobs, Close) makes the events
// durable; the crash clone must then hold their blobs, staged (StageValues) or written by
// the writer itself (a value nobody staged). Before, a NoSync blob was never fsynced, and
// the clone's log referred to a missing blob.
func TestBlobCrashNoSync(t *testing.T) {
	mem := vfs.NewCrashableMem()
	s, err := Open("/store", &Options{FS: mem, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	staged, direct := bigValue(40, BlobMin), bigValue(41, BlobMin+7)
	sub1 := submitted("s", "t1", sec(1), false)
	sub1.Input = staged
	release, err := s.StageValues(staged)
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, s, sub1)
	release()
	sub2 := submitted("s", "t2", sec(2), false)
	sub2.Input = direct // not staged: the writer writes its blob
	appendEvents(t, s, sub2)
	// A later WAL sync makes both events durable, with no sync of their blobs of its own.
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	c, err := Open("/store", &Options{FS: crashed})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.View(context.Background(), func(r projection.Reader) error {
		for id, want := range map[string][]byte{"t1": staged, "t2": direct} {
			tk, err := r.Task(id)
			if err != nil {
				return err
			}
			if tk == nil {
				t.Errorf("%s: the durable event is lost", id)
			} else if !bytes.Equal(tk.Input, want) {
				t.Errorf("%s: durable event, its input lost (%d bytes)", id, len(tk.Input))
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("the durable events' blobs: %v", err)
	}
	mustVerify(t, c)
}
