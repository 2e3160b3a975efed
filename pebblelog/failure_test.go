package pebblelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/projection"
)

const failedSyncEnv = "WORKLOG_TEST_FAILED_SYNC_STORE"

// TestHelperFailedSync is not a test: TestFailedSync runs the test binary again with
// failedSyncEnv set (in a process of its own, so that a regression back to ending the process
// fails the test instead of killing it). This seeds a store, makes every WAL sync fail, and
// reports what the next commands return, one line each.
func TestHelperFailedSync(t *testing.T) {
	dir := helperDir(t, failedSyncEnv)
	inj := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
			return errorfs.ErrInjected
		}
		return nil
	})}
	s := seededHelperStore(t, dir, &Options{FS: errorfs.Wrap(vfs.Default, inj)})
	inj.On()
	for _, id := range []string{"doomed", "after"} {
		say(outcome(id, update(s, submitted("s1", id, sec(20), false))))
	}
	say(outcome("view", s.View(context.Background(), func(projection.Reader) error { return nil })))
	say(outcome("close", s.Close()))
	os.Exit(0)
}

// helperDir is the store directory a helper process was started with (runHelper): the
// value of env. In an ordinary test run env is unset and the helper skips.
func helperDir(t *testing.T, env string) string {
	dir := os.Getenv(env)
	if dir == "" {
		t.Skip("helper process, run by the test that sets " + env)
	}
	return dir
}

// seededHelperStore opens the helper's store with o and seeds it, saying "seeded"; a failed
// Open is said and ends the helper (exit 3).
func seededHelperStore(t *testing.T, dir string, o *Options) *Store {
	s, err := Open(dir, o)
	if err != nil {
		say("error " + err.Error())
		os.Exit(3)
	}
	seedStore(t, s)
	say("seeded")
	return s
}

// say reports one line of a helper process's story to the test that runs it.
func say(s string) { os.Stdout.WriteString(s + "\n") }

func outcome(what string, err error) string {
	switch {
	case err == nil:
		return "acked " + what
	case errors.Is(err, ErrStoreFailed):
		return "refused " + what
	default:
		return "error " + what + ": " + err.Error()
	}
}

// runHelper runs the test binary's helper test name with env=dir and returns its stdout; the
// helper must exit 0 (it does not end by a panic or a fatal error).
func runHelper(t *testing.T, name, env, dir string) string {
	t.Helper()
	stdout, stderr, err := startHelper(name, env, dir)
	if err != nil {
		t.Fatalf("%s ended with %v\nstdout:\n%s\nstderr (tail):\n%s", name, err, stdout, tail(stderr, 3000))
	}
	return stdout
}

// startHelper runs the test binary's helper name with env=dir and returns what it wrote and
// how it ended, for a caller that tells a round that did not reach its state from a failure.
func startHelper(name, env, dir string) (stdout, stderr string, err error) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+dir)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// A failed WAL fsync leaves the store's state on disk unknown. The command whose sync failed
// must never be acknowledged, and no later one either: the store refuses every call with
// ErrStoreFailed (before, Pebble could end the process through our logger's Fatalf, which
// panicked). Reopened, the store holds every acknowledged command, is consistent, and holds
// the unacknowledged one whole or not at all.
func TestFailedSync(t *testing.T) {
	dir := t.TempDir()
	out := runHelper(t, "TestHelperFailedSync", failedSyncEnv, dir)
	// Close may report Pebble's own error closing the failed WAL: it still closes.
	if want := "seeded\nrefused doomed\nrefused after\nrefused view\n"; !strings.HasPrefix(out, want) || !strings.Contains(out, " close") {
		t.Fatalf("helper said:\n%s\nwant:\n%s(and Close's outcome)", out, want)
	}
	s := openT(t, dir, &Options{})
	last, err := s.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The write reached the OS before its sync failed, so the reopened store may keep it.
	if last != 6 && last != 7 {
		t.Fatalf("reopened store has LastSeq %d, want 6 (seed) or 7 (seed and the unacknowledged command)", last)
	}
	if got := len(readAll(t, s)); uint64(got) != last {
		t.Fatalf("log holds %d events, LastSeq %d", got, last)
	}
	mustVerify(t, s)
	t.Logf("reopened with LastSeq %d", last)
}

const manifestFailEnv = "WORKLOG_TEST_MANIFEST_FAIL_STORE"

// TestHelperManifestFailure is not a test: see TestManifestWriteFailure.
func TestHelperManifestFailure(t *testing.T) {
	dir := helperDir(t, manifestFailEnv)
	inj := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.Contains(op.Path, "MANIFEST-") && op.Kind == errorfs.OpFileWrite {
			return errorfs.ErrInjected
		}
		return nil
	})}
	s := seededHelperStore(t, dir, &Options{FS: errorfs.Wrap(vfs.Default, inj), StallTimeout: time.Second})
	inj.On()
	go s.db.Flush() // its goroutine waits for a flush that never ends
	select {
	case <-s.fh.ch:
	case <-time.After(10 * time.Second):
		say("the store did not fail")
		os.Exit(4)
	}
	if s.fh.parked.Load() {
		say("parked")
	}
	say(outcome("submit", update(s, submitted("s1", "after", sec(20), false))))
	start := time.Now()
	err := s.Close()
	say(outcome("close", err))
	if time.Since(start) > 5*time.Second {
		say("close took " + time.Since(start).String())
	}
	os.Exit(0)
}

// A MANIFEST write that fails after a flush wrote its sstable is one of the places where
// Pebble calls Fatalf and must not go on (it could write a MANIFEST that no longer matches
// its files). The flush goroutine is parked for good; the store fails at once, refuses every
// call, and Close returns an error within StallTimeout instead of waiting for Pebble. The
// process survives. A new process opens the store with every acknowledged command.
func TestManifestWriteFailure(t *testing.T) {
	dir := t.TempDir()
	out := runHelper(t, "TestHelperManifestFailure", manifestFailEnv, dir)
	if want := "seeded\nparked\nrefused submit\nrefused close\n"; out != want {
		t.Fatalf("helper said:\n%s\nwant:\n%s", out, want)
	}
	s := openT(t, dir, &Options{})
	if last, err := s.LastSeq(context.Background()); err != nil || last != 6 {
		t.Fatalf("reopened: LastSeq %d, %v; want the seed's 6", last, err)
	}
	mustVerify(t, s)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// submitOnce is a submit made idempotent the way work's decide code does it: a task that
// exists already is answered without writing anything.
func submitOnce(s *Store, id string) error {
	return s.Update(context.Background(), func(tx *Txn) error {
		rec, err := tx.Reader().Task(id)
		if err != nil || rec != nil {
			return err
		}
		return tx.Append(submitted("s1", id, sec(20), false))
	})
}

// TestDuplicateOfFailedBatchFails (issue 11.1): a duplicate submit writes nothing, so it has
// no batch of its own; it read the task from an earlier batch that is applied but not yet
// durable. When that batch's WAL write fails, the duplicate must fail with it: answering it
// would tell the caller the task exists while it is gone after a reopen.
func TestDuplicateOfFailedBatchFails(t *testing.T) {
	var armed atomic.Bool
	held := make(chan struct{})
	gate := make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite {
			if armed.CompareAndSwap(true, false) {
				close(held)
				<-gate // the WAL write is delayed until the duplicate has read the task
			}
			return errorfs.ErrInjected
		}
		return nil
	})
	dir := t.TempDir()
	s := openT(t, dir, &Options{FS: errorfs.Wrap(vfs.Default, inj)})
	seedStore(t, s)
	armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- submitOnce(s, "k") }()
	<-held // k's batch is applied (visible) and its WAL write hangs

	ran := make(chan struct{})
	second := make(chan error, 1)
	go func() {
		second <- s.Update(context.Background(), func(tx *Txn) error {
			rec, err := tx.Reader().Task("k")
			if err == nil && rec == nil {
				err = errors.New("the duplicate did not see k: the test did not exercise a read of the failing batch")
			}
			close(ran)
			return err
		})
	}()
	<-ran
	close(gate)
	for name, ch := range map[string]chan error{"submit": first, "duplicate": second} {
		if err := <-ch; !errors.Is(err, ErrStoreFailed) {
			t.Errorf("%s of k after its batch's WAL write failed: err = %v, want ErrStoreFailed", name, err)
		}
	}
	if err := submitOnce(s, "later"); !errors.Is(err, ErrStoreFailed) {
		t.Errorf("a submit after the failure: err = %v, want ErrStoreFailed", err)
	}
	s.Close()

	s = openT(t, dir, &Options{})
	if err := s.View(context.Background(), func(r projection.Reader) error {
		rec, err := r.Task("k")
		t.Logf("after reopen, task k exists: %v", rec != nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, s)
}

// TestReturnableFatalFormats: the Fatalf formats that fatalLogger returns from must still be
// Pebble's (a Pebble upgrade that rewords one would silently park a goroutine where Pebble
// copes with a return, or worse, the other way round: see failures.fatal). It reads the
// source of the Pebble module this test was built with.
func TestReturnableFatalFormats(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/cockroachdb/pebble/v2").Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Skipf("Pebble's source is not available: %v", err)
	}
	var src strings.Builder
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for _, f := range returnableFatalFormats {
		if !strings.Contains(src.String(), "Fatalf("+strconv.Quote(f)) {
			t.Errorf("no Fatalf(%q) in %s", f, dir)
		}
	}
	for _, p := range returnableFatalPrefixes {
		if q := strconv.Quote(p); !strings.Contains(src.String(), "Fatalf("+q[:len(q)-1]) {
			t.Errorf("no Fatalf format starting %q in %s", p, dir)
		}
	}
}

const walRotationEnv = "WORKLOG_TEST_WAL_ROTATION_STORE"

// TestHelperWALRotationAfterFailedWrite is not a test: see TestWALRotationAfterFailedWrite.
func TestHelperWALRotationAfterFailedWrite(t *testing.T) {
	dir := helperDir(t, walRotationEnv)
	var armed atomic.Bool
	release := make(chan struct{})
	held := make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite {
			if armed.CompareAndSwap(true, false) {
				close(held)
				<-release
			}
			return errorfs.ErrInjected
		}
		return nil
	})
	s := seededHelperStore(t, dir, &Options{FS: errorfs.Wrap(vfs.Default, inj), MemTableSize: 256 << 10, StallTimeout: time.Second})
	armed.Store(true)
	small := make(chan error, 1)
	go func() { small <- update(s, submitted("s1", "small", sec(20), false)) }()
	<-held // the WAL writer is writing small's batch
	big := make(chan error, 1)
	go func() {
		ev := submitted("s1", "big", sec(21), false)
		ev.Input = []byte(`"` + strings.Repeat("b", 200<<10) + `"`) // larger than half a memtable: rotates the WAL
		big <- update(s, ev)
	}()
	// Only once big's commit is inside Pebble's WAL rotation, waiting in the old WAL's close
	// for the write held above, may that write fail: released earlier, the store fails before
	// big's commit, and the rotation this test is about never happens.
	if err := waitForGoroutine(10*time.Second, "pebble/v2.(*DB).rotateWAL", "(*LogWriter).Close"); err != nil {
		say("error " + err.Error())
		os.Exit(3)
	}
	close(release) // small's WAL write fails
	say(outcome("small", <-small))
	say(outcome("big", <-big))
	say(outcome("close", s.Close()))
	os.Exit(0)
}

// waitForGoroutine waits until a goroutine's stack holds every one of frames (substrings of
// its function names, in any order), polling the stacks of all goroutines: the way to see
// that Pebble is blocked at a point it offers no hook for. The limit bounds a hang; it is
// not a timing assumption.
func waitForGoroutine(limit time.Duration, frames ...string) error {
	deadline := time.Now().Add(limit)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if !slices.ContainsFunc(frames, func(f string) bool { return !strings.Contains(g, f) }) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no goroutine in %s after %v", strings.Join(frames, " and "), limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// A commit that rotates the WAL while the WAL writer's write fails: Pebble's rotation gets the
// write's error from closing the old WAL and panics with its mutex unlocked, a fatal runtime
// error that no recover catches. walFS parks the writer in that close instead: the store
// fails, both callers get ErrStoreFailed, Close returns, the process survives, and a new
// process opens the store.
func TestWALRotationAfterFailedWrite(t *testing.T) {
	dir := t.TempDir()
	out := runHelper(t, "TestHelperWALRotationAfterFailedWrite", walRotationEnv, dir)
	if want := "seeded\nrefused small\nrefused big\nrefused close\n"; out != want {
		t.Fatalf("helper said:\n%s\nwant:\n%s", out, want)
	}
	s := openT(t, dir, &Options{})
	if last, err := s.LastSeq(context.Background()); err != nil || last < 6 {
		t.Fatalf("reopened: LastSeq %d, %v; want the seed's 6 at least", last, err)
	}
	mustVerify(t, s)
}

// A checkpoint whose copy of the WAL fails (a full destination disk) fails the checkpoint,
// not the store: only the store's own WAL files are watched.
func TestFailedCheckpointDoesNotFailStore(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "cp")
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasPrefix(op.Path, dest) && strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite {
			return errorfs.ErrInjected
		}
		return nil
	})
	s := openT(t, t.TempDir(), &Options{FS: errorfs.Wrap(vfs.Default, inj)})
	seedStore(t, s)
	if err := s.Checkpoint(dest); !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Checkpoint: err = %v, want the injected error", err)
	}
	appendEvents(t, s, submitted("s1", "after", sec(30), false))
	mustVerify(t, s)
}

// Issue 20: the file names in Pebble's messages are found by one regular expression, for a
// running store's failures (fileIn) as for Open's errors (pebbleFileIn). The failure side had
// its own, narrower one: a file number past six digits, or a number given with its type,
// named no file.
func TestFileIn(t *testing.T) {
	for _, c := range []struct{ msg, want string }{
		{"pebble: object size mismatch: /data/q/000012.sst: 4096 vs 8192", "000012.sst"},
		{"pebble: object size mismatch: /data/q/1234567.sst: 4096 vs 8192", "1234567.sst"},
		{"file 000005 (type sstable) is unknown", "000005.sst"},
		{"L0: 000005: checksum mismatch in /data/q/000007.blob", "000007.blob"},
		{"reading /data/q/MANIFEST-000010", "MANIFEST-000010"},
		{"L0: 000005: no name", ""},
		{"nothing here", ""},
	} {
		if got := fileIn(c.msg); got != c.want {
			t.Errorf("fileIn(%q) = %q, want %q", c.msg, got, c.want)
		}
	}
}
