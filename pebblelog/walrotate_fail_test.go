package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Issue 25, the host-killing panic: a compaction of ours (CompactPrunedLater after a prune,
// Tools.CompactRange) flushes the memtable when it overlaps the range, and the flush rotates
// the WAL in the compaction's goroutine. When the WAL write in flight fails meanwhile,
// Pebble's DB.rotateWAL panics with DB.mu unlocked, a fatal runtime error ("sync: unlock of
// unlocked mutex") that ends the process. walFS parked only our writer inside a commit; now
// every call of ours that can rotate the WAL is counted (failures.call) and parked the same
// way, and the caller gets the store's failure instead of waiting for it.

const compactRotationEnv = "WORKLOG_TEST_COMPACT_ROTATION_STORE"

// TestHelperCompactRotationAfterFailedWrite is not a test: TestCompactRotationAfterFailedWrite
// runs the test binary again with compactRotationEnv set to "<mode>:<dir>", so that the fatal
// error fails the test instead of ending the run.
func TestHelperCompactRotationAfterFailedWrite(t *testing.T) {
	mode, dir, _ := strings.Cut(helperDir(t, compactRotationEnv), ":")
	// A hang is a failure too (Close waiting forever on a parked compaction).
	time.AfterFunc(2*time.Minute, func() { say("hang"); os.Exit(4) })
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
	s := seededHelperStore(t, dir, &Options{FS: errorfs.Wrap(vfs.Default, inj), StallTimeout: time.Second})
	for i := range 50 {
		settleT(t, s, fmt.Sprintf("p%03d", i), sec(100+i))
	}
	pruneT(t, s, sec(1000), 1000) // the memtable holds the prune's deletions
	armed.Store(true)
	small := make(chan error, 1)
	go func() { small <- update(s, submitted("s1", "small", sec(2000), false)) }()
	<-held // the WAL writer is writing small's batch
	compacted := make(chan error, 1)
	switch mode {
	case "pruned":
		s.CompactPrunedLater()
		compacted <- nil // its error is logged; Close must still return
	case "range":
		go func() {
			compacted <- s.Tools().CompactRange(context.Background(), []byte{prefixEvent}, []byte{prefixEvent + 1})
		}()
	default:
		say("error mode " + mode)
		os.Exit(3)
	}
	// The compaction flushes the memtable: its WAL rotation waits in the old WAL's close for
	// the write held above, which only then fails.
	if err := waitForGoroutine(20*time.Second, "pebble/v2.(*DB).rotateWAL", "(*LogWriter).Close", "(*DB).Compact"); err != nil {
		say("error " + err.Error())
		os.Exit(3)
	}
	close(release)
	say(outcome("small", <-small))
	if err := <-compacted; mode == "range" {
		say(outcome("compact", err))
	}
	say(outcome("close", s.Close()))
	os.Exit(0)
}

func TestCompactRotationAfterFailedWrite(t *testing.T) {
	for _, mode := range []string{"pruned", "range"} {
		t.Run(mode, func(t *testing.T) {
			// The helper's store has a 1 s StallTimeout. Under load a WAL fsync of its setup,
			// before the write is held, can take longer and fail the store there (issue 25's
			// race-built count=5 run, 2 rounds in 5): such a round never reached the state
			// asserted (nothing said after "seeded"), so it is tried again on a new store; the
			// test fails only if five rounds in a row never do.
			var dir, out string
			for round := 1; ; round++ {
				dir = t.TempDir()
				stdout, stderr, err := startHelper("TestHelperCompactRotationAfterFailedWrite", compactRotationEnv, mode+":"+dir)
				setupStalled := err != nil && !strings.Contains(stdout, "refused") &&
					strings.Contains(stdout+stderr, "a WAL sync has waited")
				if setupStalled && round < 5 {
					t.Logf("round %d: a WAL sync of the setup outwaited the 1 s StallTimeout; again", round)
					continue
				}
				if err != nil {
					t.Fatalf("helper ended with %v\nstdout:\n%s\nstderr (tail):\n%s", err, stdout, tail(stderr, 3000))
				}
				out = stdout
				break
			}
			want := "seeded\nrefused small\nrefused compact\nrefused close\n"
			if mode == "pruned" {
				want = "seeded\nrefused small\nrefused close\n"
			}
			if out != want {
				t.Fatalf("helper said:\n%s\nwant:\n%s", out, want)
			}
			s := openT(t, dir, &Options{})
			if last, err := s.LastSeq(context.Background()); err != nil || last < 6 {
				t.Fatalf("reopened: LastSeq %d, %v; want the seed's 6 at least", last, err)
			}
			mustVerify(t, s)
		})
	}
}

// failures.call recovers a panic of Pebble's in the call (DB.commitWrite panics when a
// LogData or a commit outside the writer finds the WAL writer failed): the store fails, the
// database is treated as parked (Pebble's commit mutex stays held), and the caller gets the
// failure instead of the process ending.
func TestCallRecoversPebblePanic(t *testing.T) {
	f := newFailures(t.TempDir(), Options{})
	err := f.call("a test", func() error { panic(errors.New("boom")) })
	if !errors.Is(err, ErrStoreFailed) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("call of a panicking fn: err = %v, want ErrStoreFailed naming the panic", err)
	}
	if !f.parked.Load() {
		t.Error("after a recovered panic the database is not treated as parked")
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("calls in flight after the call returned: %d", n)
	}
}

// A call that parks (walFS, after a failed WAL write) does not keep its caller: once the store
// failed and a goroutine is parked, the caller gets the failure.
func TestCallReturnsWhenParked(t *testing.T) {
	f := newFailures(t.TempDir(), Options{})
	stuck := make(chan struct{})
	defer close(stuck)
	done := make(chan error, 1)
	go func() {
		done <- f.call("a test", func() error {
			f.parked.Store(true)
			f.fail(errors.New("injected"))
			<-stuck
			return nil
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrStoreFailed) {
			t.Fatalf("err = %v, want ErrStoreFailed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("call waited for a parked goroutine")
	}
	if f.calls.Load() != 1 {
		t.Errorf("calls in flight: %d, want the parked one", f.calls.Load())
	}
}
