package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/projection"
)

// fullDisk is an errorfs injector for a disk without free space for new sstables: while on,
// every write to an .sst file fails with ENOSPC, so Pebble's flushes fail and are retried,
// while the WAL (whose files Pebble recycles) still takes writes.
type fullDisk struct{ on atomic.Bool }

func (d *fullDisk) MaybeError(op errorfs.Op) error {
	if d.on.Load() && strings.HasSuffix(op.Path, ".sst") && op.Kind == errorfs.OpFileWrite {
		return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
	}
	return nil
}

func (d *fullDisk) String() string { return "fullDisk" }

// submitAll submits tasks prefix-1, prefix-2, ... from workers goroutines until one of them
// is refused, and returns the acknowledged ids and the first error.
func submitAll(s *Store, prefix string, workers int, ctxTimeout time.Duration) (acked []string, firstErr error) {
	return submitN(s, prefix, workers, ctxTimeout, 0)
}

// submitN is submitAll stopping after n submits (0: no limit).
func submitN(s *Store, prefix string, workers int, ctxTimeout time.Duration, n int64) (acked []string, firstErr error) {
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var once sync.Once
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := next.Add(1)
				if n > 0 && k > n {
					return
				}
				id := fmt.Sprintf("%s-%06d", prefix, k)
				ev := submitted("s1", id, sec(1), false)
				ev.Input = []byte(fmt.Sprintf(`{"pad":%q}`, strings.Repeat(id, 40)))
				ctx, cancel := context.WithTimeout(context.Background(), ctxTimeout)
				err := s.Update(ctx, func(tx *Txn) error { return tx.Append(ev) })
				cancel()
				mu.Lock()
				if err == nil {
					acked = append(acked, id)
				} else if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				if err != nil {
					once.Do(func() { close(stop) })
					return
				}
			}
		})
	}
	wg.Wait()
	return acked, firstErr
}

// wantTasks checks that every id has a task record in the store in dir, opened afresh, and
// that the store verifies.
func wantTasks(t *testing.T, dir string, ids []string) {
	t.Helper()
	s := openT(t, dir, &Options{})
	if err := s.View(context.Background(), func(r projection.Reader) error {
		for _, id := range ids {
			rec, err := r.Task(id)
			if err != nil {
				return err
			}
			if rec == nil {
				return fmt.Errorf("acknowledged task %s is missing", id)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, s)
}

// Issue 11.5: a full disk makes every flush fail; once both memtables are full, the writer
// waits in Pebble's write stall. Before, every call then blocked forever, contexts included.
// Now the stall watchdog fails the store after StallTimeout and every waiting caller gets
// ErrStoreFailed naming the stall and the flush's error; once space returns the writer gets
// out, Close completes, and every acknowledged submit is in the reopened store.
//
// The state asserted is a commit blocked in the write stall when the store fails. Under load
// a WAL fsync slower than the 300 ms StallTimeout can trip the watchdog first ("a WAL sync has
// waited", no flush error in it: issue 25's stress run, 1 run in 6): such a round did not
// reach the state, so it is closed and tried again on a new store; the test fails only if
// five rounds in a row never do.
func TestFullDiskStallFailsStore(t *testing.T) {
	const stall = 300 * time.Millisecond
	for round := 1; ; round++ {
		dir := t.TempDir()
		disk := &fullDisk{}
		s, err := Open(dir, &Options{FS: errorfs.Wrap(vfs.Default, disk), MemTableSize: 256 << 10, StallTimeout: stall})
		if err != nil {
			t.Fatal(err)
		}
		disk.on.Store(true)
		start := time.Now()
		// Contexts far longer than the stall bound: the answer must come from the watchdog.
		acked, err := submitAll(s, "t", 8, time.Minute)
		t.Logf("round %d: %d submits acknowledged; first refusal after %v: %v", round, len(acked), time.Since(start), err)
		if !errors.Is(err, ErrStoreFailed) {
			t.Fatalf("a submit during the stall: err = %v, want ErrStoreFailed", err)
		}
		var se *stallError
		if errors.As(err, &se) && se.What == "WAL sync" && se.Reason == "" && round < 5 {
			// A slow fsync, not the write stall under test: try again on a new store.
			disk.on.Store(false)
			waitFor(t, "the writer to leave its commit", func() bool { return s.fh.commitSince.Load() == 0 })
			s.Close()
			continue
		}
		if !errors.As(err, &se) || !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("err = %v, want a stall error whose cause is the flush's ENOSPC", err)
		}
		if err := update(s, submitted("s1", "after", sec(2), false)); !errors.Is(err, ErrStoreFailed) {
			t.Errorf("a submit after the failure: err = %v, want ErrStoreFailed", err)
		}

		disk.on.Store(false) // space returns: the flush goes through and the writer gets out
		waitFor(t, "the writer to leave its stalled commit", func() bool { return s.fh.commitSince.Load() == 0 })
		if err := s.Close(); err != nil {
			t.Fatalf("Close after space returned: %v", err)
		}
		wantTasks(t, dir, acked)
		return
	}
}

// While the writer is stalled, a caller's context bounds its wait, before the watchdog
// fires, whether the call was still queued or already waiting for its batch.
func TestStalledUpdateHonoursContext(t *testing.T) {
	dir := t.TempDir()
	disk := &fullDisk{}
	s, err := Open(dir, &Options{FS: errorfs.Wrap(vfs.Default, disk), MemTableSize: 256 << 10, StallTimeout: -1, MaxBatchCommands: 4})
	if err != nil {
		t.Fatal(err)
	}
	disk.on.Store(true)
	// Submit until the writer is stuck in the stall. Under load a 200 ms context can end
	// before the memtables are full, with no stall yet (issue 25's stress run: "timed out
	// waiting for a write stall"): then submit more, until the state under test holds.
	stalled := func() bool { return s.fh.stallReason.Load() != nil && s.fh.commitSince.Load() != 0 }
	var acked []string
	deadline := time.Now().Add(time.Minute)
	for round := 0; ; round++ {
		a, err := submitAll(s, fmt.Sprint("t", round), 16, 200*time.Millisecond)
		acked = append(acked, a...)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a submit during the stall: err = %v, want context.DeadlineExceeded", err)
		}
		if stalled() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no write stall after a minute of submits onto a full disk")
		}
	}
	// The writer is stuck in the stall and its queue (4) fills: later calls cannot even be queued.
	waitFor(t, "a write stall", stalled)
	for i := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := s.Update(ctx, func(tx *Txn) error { return tx.Append(submitted("s1", fmt.Sprint("late-", i), sec(3), false)) })
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("submit %d while stalled: err = %v, want context.DeadlineExceeded", i, err)
		}
	}
	disk.on.Store(false)
	if err := s.Close(); err != nil {
		t.Fatalf("Close after space returned: %v", err)
	}
	wantTasks(t, dir, acked)
}

// Close of a store whose writer is still stalled returns within StallTimeout with an error;
// the database is closed in the background once space returns, and the store opens again.
//
// The state Close is asserted in is a commit blocked inside Pebble's write stall when the
// store fails. Under load, a WAL fsync slower than the 200 ms StallTimeout can trip the
// watchdog first, with no commit blocked; Close then closes Pebble cleanly and rightly
// returns nil (issue 25's flake). Such a round did not reach the state: it is closed and
// tried again on a new store, and the test fails only if five rounds in a row never do.
func TestCloseWhileStalled(t *testing.T) {
	const stall = 200 * time.Millisecond
	var (
		dir   string
		disk  *fullDisk
		s     *Store
		acked []string
	)
	for round := 1; ; round++ {
		dir = t.TempDir()
		disk = &fullDisk{}
		var err error
		s, err = Open(dir, &Options{FS: errorfs.Wrap(vfs.Default, disk), MemTableSize: 256 << 10, StallTimeout: stall})
		if err != nil {
			t.Fatal(err)
		}
		disk.on.Store(true)
		acked, err = submitAll(s, "t", 8, time.Minute)
		if !errors.Is(err, ErrStoreFailed) {
			t.Fatalf("err = %v, want ErrStoreFailed", err)
		}
		var se *stallError
		if errors.As(err, &se) && se.What == "commit" && s.fh.stallReason.Load() != nil && s.fh.commitSince.Load() != 0 {
			break // a commit is blocked in the write stall: the state under test
		}
		t.Logf("round %d: the store failed without a commit blocked in a write stall (%v); again", round, err)
		disk.on.Store(false)
		s.Close()
		if round == 5 {
			t.Fatal("five rounds failed the store before a commit blocked in the write stall")
		}
	}
	err := s.Close()
	if !errors.Is(err, ErrStoreFailed) {
		t.Fatalf("Close while stalled: err = %v, want ErrStoreFailed", err)
	}
	t.Logf("Close: %v", err)
	disk.on.Store(false)
	reopenWhenUnlocked(t, dir) // the background close releases the locks once Pebble returns
	wantTasks(t, dir, acked)
}

// Open of a store whose WAL must be flushed while the disk is full gives up after
// StallTimeout with an *OpenError of kind ErrStoreFailed naming the flush's error, instead of
// retrying for minutes. Once space returns, the store opens with everything acknowledged.
func TestOpenOnFullDiskIsBounded(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatal(err)
	}
	acked, err := submitN(s, "t", 4, time.Minute, 400) // in the WAL only: Open must flush it
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	disk := &fullDisk{}
	disk.on.Store(true)
	const stall = 300 * time.Millisecond
	start := time.Now()
	s, err = Open(dir, &Options{FS: errorfs.Wrap(vfs.Default, disk), StallTimeout: stall})
	took := time.Since(start)
	if err == nil {
		s.Close()
		t.Fatal("Open flushed a WAL onto a full disk")
	}
	t.Logf("Open gave up after %v: %v", took, err)
	var oe *OpenError
	if !errors.As(err, &oe) || oe.Kind != ErrStoreFailed || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Open: err = %v, want an *OpenError of kind ErrStoreFailed caused by ENOSPC", err)
	}
	if took > 20*stall {
		t.Errorf("Open took %v with StallTimeout %v", took, stall)
	}
	disk.on.Store(false)
	reopenWhenUnlocked(t, dir)
	wantTasks(t, dir, acked)
}

// reopenWhenUnlocked opens and closes the store in dir once a background close (of an
// abandoned Open or Close) has released its locks.
func reopenWhenUnlocked(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := Open(dir, &Options{})
		if err == nil {
			s.Close()
			return
		}
		if !errors.Is(err, ErrLocked) || time.Now().After(deadline) {
			t.Fatalf("reopen after space returned: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor waits until cond holds, or fails the test after 10 s (a bound on a hang, not a
// timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A creation that fails before WORKLOG.tmp exists (the disk is full when the marker is
// written) leaves only the two lock files, which Open takes first. The directory never held
// data: the next Open, once the disk has room, makes the store there.
func TestCreationFailedBeforeMarker(t *testing.T) {
	var full atomic.Bool
	full.Store(true)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && strings.HasSuffix(op.Path, MarkerFile+".tmp") && op.Kind == errorfs.OpCreate {
			return &os.PathError{Op: "create", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	fs := errorfs.Wrap(vfs.NewMem(), inj)
	_, err := Open("/store", &Options{FS: fs})
	if !errors.Is(err, ErrStoreFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Open on a full disk: %v, want ErrStoreFailed caused by ENOSPC", err)
	}
	names, _ := fs.List("/store")
	t.Logf("left behind: %v", names)
	full.Store(false)
	s, err := Open("/store", &Options{FS: fs})
	if err != nil {
		t.Fatalf("Open once the disk has room: %v", err)
	}
	appendEvents(t, s, submitted("s1", "t1", sec(1), false))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
