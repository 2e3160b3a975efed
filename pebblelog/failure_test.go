package pebblelog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/projection"
)

const failedSyncEnv = "WORKLOG_TEST_FAILED_SYNC_STORE"

// TestHelperFailedSync is not a test: TestFailedSync runs the test binary again with
// failedSyncEnv set. This seeds a store, makes every WAL sync fail, and reports what the
// next commands return, one line each. Pebble may end the process instead.
func TestHelperFailedSync(t *testing.T) {
	dir := os.Getenv(failedSyncEnv)
	if dir == "" {
		t.Skip("helper process for TestFailedSync")
	}
	say := func(s string) { os.Stdout.WriteString(s + "\n") }
	inj := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
			return errorfs.ErrInjected
		}
		return nil
	})}
	s, err := Open(dir, Options{FS: errorfs.Wrap(vfs.Default, inj)})
	if err != nil {
		say("error " + err.Error())
		os.Exit(3)
	}
	seedStore(t, s)
	say("seeded")
	inj.On()
	for _, id := range []string{"doomed", "after"} {
		err := s.Update(context.Background(), func(tx *Txn) error {
			return tx.Append(submitted("s1", id, sec(20), false))
		})
		switch {
		case err == nil:
			say("acked " + id)
		case errors.Is(err, ErrStoreFailed):
			say("refused " + id)
		default:
			say("error " + id + ": " + err.Error())
		}
	}
	os.Exit(0)
}

// A failed WAL fsync leaves the store's state on disk unknown. The command whose sync failed
// must never be acknowledged, and no later one either: either the store refuses every write
// with ErrStoreFailed, or the process ends (Pebble treats a failed WAL write as fatal and
// calls its logger's Fatalf, which panics). Reopened, the store holds every acknowledged
// command, is consistent, and holds the unacknowledged one whole or not at all.
func TestFailedSync(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFailedSync$", "-test.count=1")
	cmd.Env = append(os.Environ(), failedSyncEnv+"="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	out := stdout.String()
	if !strings.Contains(out, "seeded\n") {
		t.Fatalf("helper did not seed the store: %v\nstdout:\n%s\nstderr:\n%s", runErr, out, stderr.String())
	}
	if strings.Contains(out, "acked ") {
		t.Fatalf("a command was acknowledged although the WAL sync failed:\n%s", out)
	}
	switch {
	case runErr != nil && strings.Contains(stderr.String(), "fatal commit error"):
		t.Logf("the failed sync ended the process (fail-stop): %v", runErr)
	case runErr == nil && strings.Contains(out, "refused doomed\nrefused after\n"):
		t.Logf("the store refused every write after the failed sync")
	default:
		t.Fatalf("helper ended with %v\nstdout:\n%s\nstderr (tail):\n%s", runErr, out, tail(stderr.String(), 2000))
	}

	s := openT(t, dir, Options{})
	last, err := s.LastSeq()
	if err != nil {
		t.Fatal(err)
	}
	// The write reached the OS before its sync failed, so the process crash may keep it.
	if last != 6 && last != 7 {
		t.Fatalf("reopened store has LastSeq %d, want 6 (seed) or 7 (seed and the unacknowledged command)", last)
	}
	if got := len(readAll(t, s)); uint64(got) != last {
		t.Fatalf("log holds %d events, LastSeq %d", got, last)
	}
	mustVerify(t, s)
	t.Logf("reopened with LastSeq %d", last)
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
	s := openT(t, dir, Options{FS: errorfs.Wrap(vfs.Default, inj)})
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

	s = openT(t, dir, Options{})
	if err := s.View(func(r projection.Reader) error {
		rec, err := r.Task("k")
		t.Logf("after reopen, task k exists: %v", rec != nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, s)
}
