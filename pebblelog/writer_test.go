package pebblelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Concurrent commands share batches; each command's events stay contiguous, the log is
// gap-free in commit order, and a command that fails after appending keeps nothing even when
// it shared a batch with others.
func TestUpdateGroupCommit(t *testing.T) {
	s := openT(t, t.TempDir(), &Options{})
	ctx := context.Background()
	errBoom := errors.New("boom")
	const workers, perWorker = 8, 40
	var wg sync.WaitGroup
	var failed atomic.Int64
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				session := fmt.Sprintf("s%d", w)
				id := fmt.Sprintf("t-%d-%d", w, i)
				fail := (w+i)%5 == 0
				err := s.Update(ctx, func(tx *Txn) error {
					// Three events per command: submit, claim, settle.
					if err := tx.Append(submitted(session, id, sec(i), false)); err != nil {
						return err
					}
					if err := tx.Append(claimed(session, id, sec(i), 1, "tok-"+id)); err != nil {
						return err
					}
					if fail {
						return errBoom
					}
					return tx.Append(settled(session, id, sec(i), 1, "tok-"+id))
				})
				switch {
				case fail && !errors.Is(err, errBoom):
					errs <- fmt.Errorf("failing command %s returned %v", id, err)
					return
				case fail:
					failed.Add(1)
				case err != nil:
					errs <- fmt.Errorf("command %s: %v", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	evs := readAll(t, s)
	wantCommands := workers*perWorker - int(failed.Load())
	if len(evs) != 3*wantCommands {
		t.Fatalf("log holds %d events, want %d (3 for each of %d successful commands)", len(evs), 3*wantCommands, wantCommands)
	}
	for i := 0; i < len(evs); i += 3 {
		id, _ := evs[i].Subject()
		for j := range 3 {
			ev := evs[i+j]
			if ev.Head().Seq != uint64(i+j+1) {
				t.Fatalf("event %d has seq %d", i+j+1, ev.Head().Seq)
			}
			if got, _ := ev.Subject(); got != id {
				t.Fatalf("seq %d belongs to %s inside the command of %s: commands interleaved", i+j+1, got, id)
			}
		}
		if evs[i+2].Type() != events.TypeTaskSettled {
			t.Fatalf("the command of %s committed without its last event", id)
		}
	}
	mustVerify(t, s)
}

func TestUpdateCanceledContextAppendsNothing(t *testing.T) {
	s := seeded(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := s.Update(ctx, func(tx *Txn) error {
		ran = true
		return tx.Append(submitted("s1", "never", sec(9), false))
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Update with a canceled context = %v", err)
	}
	if ran {
		t.Error("the command ran although its context was done")
	}
	if n := len(readAll(t, s)); n != 6 {
		t.Fatalf("log holds %d events, want 6", n)
	}
}

func TestCloseWaitsAndRefuses(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]error, 16)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = s.Update(ctx, func(tx *Txn) error {
				return tx.Append(submitted("s1", fmt.Sprintf("c%d", i), sec(i), false))
			})
		}()
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	acked := 0
	for _, err := range results {
		switch {
		case err == nil:
			acked++
		case !errors.Is(err, ErrClosed):
			t.Errorf("Update racing Close = %v, want nil or ErrClosed", err)
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := s.Update(ctx, func(*Txn) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Update after Close = %v, want ErrClosed", err)
	}
	for name, call := range map[string]func() error{
		"View":       func() error { return s.View(context.Background(), nil) },
		"ReadLog":    func() error { return s.ReadLog(ctx, 0, nil) },
		"Verify":     func() error { _, err := s.Verify(ctx, VerifyOptions{}); return err },
		"LastSeq":    func() error { _, err := s.LastSeq(context.Background()); return err },
		"Checkpoint": func() error { return s.Checkpoint(filepath.Join(t.TempDir(), "cp")) },
	} {
		if err := call(); !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	// Every acknowledged command is in the store.
	s = openT(t, dir, &Options{})
	if n := len(readAll(t, s)); n != acked {
		t.Fatalf("store holds %d events, %d commands were acknowledged", n, acked)
	}
	mustVerify(t, s)
}

// A Checkpoint taken while writers keep writing opens read-only, verifies, and holds a prefix
// of the live log that includes everything committed before Checkpoint was called.
func TestCheckpointWhileWriting(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	ctx := context.Background()
	const writers = 3
	var wg sync.WaitGroup
	stop := make(chan struct{})
	progress := make(chan struct{}, 1024)
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				session := fmt.Sprintf("s%d", w)
				id := fmt.Sprintf("t-%d-%d", w, i)
				err := s.Update(ctx, func(tx *Txn) error {
					if err := tx.Append(submitted(session, id, sec(i), i%3 == 0)); err != nil {
						return err
					}
					if i%2 == 0 {
						return nil
					}
					return tx.Append(claimed(session, id, sec(i), 1, "tok"))
				})
				if err != nil {
					errs <- err
					return
				}
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	for range 100 {
		<-progress
	}
	lo, err := s.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "checkpoint")
	cpErr := s.Checkpoint(cp)
	for range 50 {
		<-progress
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if cpErr != nil {
		t.Fatalf("Checkpoint: %v", cpErr)
	}
	hi, _ := s.LastSeq(context.Background())

	if err := s.Checkpoint(cp); err == nil {
		t.Error("a second Checkpoint into an existing directory succeeded")
	}

	c := openT(t, cp, &Options{ReadOnly: true})
	last, err := c.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if last < lo || last > hi {
		t.Fatalf("checkpoint LastSeq %d, want within [%d, %d]", last, lo, hi)
	}
	if last == hi {
		t.Logf("the checkpoint caught every write (%d): writers were slower than expected", hi)
	}
	mustVerify(t, c)
	// The checkpoint's log is a prefix of the live one, byte for byte.
	got := readAll(t, c)
	if uint64(len(got)) != last {
		t.Fatalf("checkpoint log holds %d events, LastSeq %d", len(got), last)
	}
	for i, ev := range got {
		live, err := s.Event(context.Background(), uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		a, _ := events.Encode(ev)
		b, _ := events.Encode(live)
		if !bytes.Equal(a, b) {
			t.Fatalf("checkpoint event %d differs from the live store's", i+1)
		}
	}
	mustVerify(t, s)

	// The checkpoint is a store of its own: it opens read-write and takes writes.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	w := openT(t, cp, &Options{})
	appendEvents(t, w, submitted("s9", "after-checkpoint", sec(1), false))
	mustVerify(t, w)
}

// On a crashable in-memory filesystem, everything acknowledged survives a crash that drops
// unsynced data, and with NoSync a crash loses a suffix of whole commands at most; Close syncs.
func TestCrashCloneStore(t *testing.T) {
	for _, noSync := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoSync=%v", noSync), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			s, err := Open("/store", &Options{FS: fs, NoSync: noSync})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const n = 200
			for i := range n {
				appendEvents(t, s, submitted("s1", fmt.Sprintf("t%d", i), sec(i), false),
					claimed("s1", fmt.Sprintf("t%d", i), sec(i), 1, "tok"))
				if i%50 != 49 {
					continue
				}
				clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
				c, err := Open("/store", &Options{FS: clone})
				if err != nil {
					t.Fatalf("opening the crash clone: %v", err)
				}
				last, _ := c.LastSeq(context.Background())
				if !noSync && last != uint64(2*(i+1)) {
					t.Fatalf("crash clone after %d acknowledged commands has LastSeq %d, want %d", i+1, last, 2*(i+1))
				}
				if last%2 != 0 {
					t.Fatalf("crash clone has LastSeq %d: a command was half kept", last)
				}
				mustVerify(t, c)
				c.Close()
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
			c, err := Open("/store", &Options{FS: clone})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if last, _ := c.LastSeq(context.Background()); last != 2*n {
				t.Fatalf("after Close a crash kept LastSeq %d, want %d", last, 2*n)
			}
			mustVerify(t, c)
		})
	}
}

// The writer folds commands waiting together into one batch. When one of them fails after
// appending, the others of its batch still commit, each alone, and the failed one keeps
// nothing. The writer is held by a first command until the others are queued, so the batch
// is certain to be shared.
func TestUpdateFailedCommandInSharedBatch(t *testing.T) {
	s := seeded(t)
	ctx := context.Background()
	release := make(chan struct{})
	entered := make(chan struct{})
	errBoom := errors.New("boom")
	results := make(chan string, 4)
	run := func(name string, fn func(tx *Txn) error) {
		go func() {
			if err := s.Update(ctx, fn); err != nil {
				results <- name + ": " + err.Error()
				return
			}
			results <- name + ": ok"
		}()
	}
	run("holder", func(tx *Txn) error {
		close(entered)
		<-release
		return tx.Append(submitted("s1", "h", sec(10), false))
	})
	<-entered
	run("before", func(tx *Txn) error { return tx.Append(submitted("s1", "b", sec(11), false)) })
	waitQueued(t, s, 1)
	run("failing", func(tx *Txn) error {
		if err := tx.Append(submitted("s1", "f", sec(12), false)); err != nil {
			return err
		}
		return errBoom
	})
	waitQueued(t, s, 2)
	run("after", func(tx *Txn) error { return tx.Append(submitted("s1", "a", sec(13), false)) })
	waitQueued(t, s, 3)
	close(release)
	got := map[string]bool{}
	for range 4 {
		got[<-results] = true
	}
	for _, want := range []string{"holder: ok", "before: ok", "failing: boom", "after: ok"} {
		if !got[want] {
			t.Errorf("results %v lack %q", got, want)
		}
	}
	var ids []string
	for _, ev := range readAll(t, s)[6:] {
		id, _ := ev.Subject()
		ids = append(ids, id)
	}
	if fmt.Sprint(ids) != "[h b a]" {
		t.Errorf("events after the seed belong to %v, want [h b a]", ids)
	}
	mustVerify(t, s)
}

// waitQueued waits until n commands wait in the writer's queue. The writer is held by a
// command, so the queue only grows.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	for len(s.reqs) < n {
		runtime.Gosched()
	}
}

// Open creates a missing directory, parents included. The new directory entries must be
// synced too, or a machine crash loses the whole store with every acknowledged write in it.
func TestOpenNewDirectorySurvivesCrash(t *testing.T) {
	for _, dir := range []string{"/store", "/a/b/c/store", "rel/store"} {
		fs := vfs.NewCrashableMem()
		s, err := Open(dir, &Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		seedStore(t, s)
		clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		s.Close()
		c, err := Open(dir, &Options{FS: clone})
		if err != nil {
			t.Fatalf("%s: opening the crash clone: %v", dir, err)
		}
		if last, _ := c.LastSeq(context.Background()); last != 6 {
			t.Errorf("%s: after a crash the store has LastSeq %d, want 6: its directory was not synced", dir, last)
		}
		c.Close()
	}
}

// TestDuplicateRecordIDsRefused: a TaskSubmitted or WakeRecorded whose id already has a record
// is refused whether the record is in the same batch, in the writer's record cache, only in
// the DB (cache disabled, or after a reopen), and whether the id is the greatest so far (the
// max-id shortcut skips the Get only for ids above every stored one) or below it.
func TestDuplicateRecordIDsRefused(t *testing.T) {
	for _, cache := range []int{0, -1} {
		t.Run(fmt.Sprintf("recordcache=%d", cache), func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir, &Options{RecordCacheSize: cache})
			appendEvents(t, s, submitted("s1", "t5", sec(1), false), requestedWake("s1", "w5", sec(1)))
			appendEvents(t, s, submitted("s1", "t9", sec(2), false), requestedWake("s1", "w9", sec(2)))
			refused := func(s *Store, evs ...events.Event) {
				t.Helper()
				if err := update(s, evs...); !errors.Is(err, projection.ErrInconsistent) {
					t.Fatalf("duplicate id: err = %v, want ErrInconsistent", err)
				}
			}
			check := func(s *Store) {
				t.Helper()
				refused(s, submitted("s1", "t9", sec(3), false)) // the greatest id
				refused(s, submitted("s1", "t5", sec(3), false)) // below the greatest
				refused(s, requestedWake("s1", "w9", sec(3)))
				refused(s, requestedWake("s1", "w5", sec(3)))
				refused(s, submitted("s1", "tz", sec(3), false), submitted("s1", "tz", sec(3), false)) // same batch
			}
			check(s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openT(t, dir, &Options{RecordCacheSize: cache})
			check(s)
			appendEvents(t, s, submitted("s1", "ta", sec(4), false)) // above the max: still accepted
			mustVerify(t, s)
		})
	}
}

// TestAnswerWaitsForEarlierSyncs: with pipelined commits a batch is visible before its fsync
// completes, so a later command can read what it wrote. A command that then writes nothing
// (a duplicate submit finding the task) has no fsync of its own to wait for; it must still not
// be answered before the batch it read is durable.
func TestAnswerWaitsForEarlierSyncs(t *testing.T) {
	var holding atomic.Bool
	gate := make(chan struct{})
	held := make(chan struct{}, 1)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if holding.Load() && strings.HasSuffix(op.Path, ".log") &&
			(op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
			select {
			case held <- struct{}{}:
			default:
			}
			<-gate
		}
		return nil
	})
	var release sync.Once
	letSyncsThrough := func() { release.Do(func() { holding.Store(false); close(gate) }) }
	s := openT(t, t.TempDir(), &Options{FS: errorfs.Wrap(vfs.Default, inj)})
	t.Cleanup(letSyncsThrough) // runs before the store's Close (cleanups run last-in first-out)
	holding.Store(true)
	first := make(chan error, 1)
	go func() { first <- update(s, submitted("s1", "t1", sec(1), false)) }()
	<-held // t1's batch is applied and its WAL fsync is being held

	var saw atomic.Bool
	second := make(chan error, 1)
	go func() {
		second <- s.Update(context.Background(), func(tx *Txn) error {
			rec, err := tx.Reader().Task("t1")
			saw.Store(rec != nil)
			return err
		})
	}()
	select {
	case err := <-second:
		t.Fatalf("a command that read t1 was answered (err %v) before t1's batch was durable", err)
	case err := <-first:
		t.Fatalf("t1's submit was answered (err %v) before its fsync", err)
	case <-time.After(300 * time.Millisecond):
	}
	letSyncsThrough()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if !saw.Load() {
		t.Fatal("the second command did not see t1: the test did not exercise a read of an unsynced batch")
	}
	mustVerify(t, s)
}

// A caller that gives up (its ctx ends) while its command waits behind a slow one gets
// ctx.Err() at once; once Update has returned, its fn never runs, so the caller may read what
// fn would have set without a race.
func TestAbandonedCommandDoesNotRun(t *testing.T) {
	s := seeded(t)
	gate := make(chan struct{})
	slow := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		slow <- s.Update(context.Background(), func(tx *Txn) error {
			close(started)
			<-gate
			return tx.Append(submitted("s1", "slow", sec(10), false))
		})
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ran := false
	err := s.Update(ctx, func(tx *Txn) error {
		ran = true
		return tx.Append(submitted("s1", "abandoned", sec(11), false))
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Update behind a held writer: err = %v, want context.DeadlineExceeded", err)
	}
	close(gate)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	if err := update(s, submitted("s1", "next", sec(12), false)); err != nil { // the writer has passed the abandoned command
		t.Fatal(err)
	}
	if ran {
		t.Error("the abandoned command ran after its Update returned")
	}
	if n := len(readAll(t, s)); n != 8 {
		t.Errorf("log holds %d events, want 8 (seed, slow, next)", n)
	}
}

// A caller answered by the store's failure while its fn runs returns only once fn has ended:
// it may read what fn set (the race detector checks this test).
func TestFailureWaitsForRunningCommand(t *testing.T) {
	s := seeded(t)
	gate := make(chan struct{})
	started := make(chan struct{})
	res := make(chan error, 1)
	var set string
	go func() {
		res <- s.Update(context.Background(), func(tx *Txn) error {
			close(started)
			<-gate
			set = "set by fn"
			return nil
		})
	}()
	<-started
	s.fh.fail(errors.New("injected by the test"))
	select {
	case err := <-res:
		t.Fatalf("Update returned (%v) while its fn was still running", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	if err := <-res; !errors.Is(err, ErrStoreFailed) {
		t.Fatalf("err = %v, want ErrStoreFailed", err)
	}
	if set != "set by fn" {
		t.Fatalf("fn's result: %q", set)
	}
}
