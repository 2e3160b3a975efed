package work_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// Issue 11.1 through the public API: submit K, and submit K again while K's batch is applied
// but its WAL write is still in flight, then fails. The repeat finds K and writes nothing; it
// must fail with K's batch (ErrBackend wrapping pebblelog.ErrStoreFailed), never return K,
// which is gone after a reopen.
func TestDuplicateSubmitOfFailedBatch(t *testing.T) {
	var armed atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite {
			if armed.CompareAndSwap(true, false) {
				close(held)
				<-release // the repeat is submitted meanwhile
			}
			return errorfs.ErrInjected
		}
		return nil
	})
	dir := t.TempDir()
	q, err := work.Open(dir, &work.Options{FS: errorfs.Wrap(vfs.Default, inj)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := q.Session("s1")
	req := work.TaskRequest{Kind: "k", IdempotencyKey: "K"}
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "warm-up"}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	first := make(chan error, 1)
	go func() { _, err := s.Submit(ctx, req); first <- err }()
	<-held // K's batch is applied (the writer applies before the WAL write); its WAL write is held
	type answer struct {
		tk  work.Task
		err error
	}
	repeat := make(chan answer, 1)
	go func() { tk, err := s.Submit(ctx, req); repeat <- answer{tk, err} }()
	// The repeat must not be answered while K's write is held (it would be answered with K
	// before K is durable). Its read of K happens in the store's writer, which this package
	// cannot observe: the grace below lets it run before K's write fails. Every assertion
	// holds in either order (read before or after the failure), so the grace only decides
	// how often the read of the failing batch is exercised, never whether the test passes.
	var a answer
	select {
	case a = <-repeat:
		close(release)
	case <-time.After(300 * time.Millisecond):
		close(release)
		a = <-repeat
	}
	tk, err := a.tk, a.err
	if err == nil {
		t.Errorf("the repeat of K was answered with task %s although K's batch failed", tk.ID)
	} else if !errors.Is(err, work.ErrBackend) || !errors.Is(err, pebblelog.ErrStoreFailed) {
		t.Errorf("repeat of K: err = %v, want ErrBackend wrapping pebblelog.ErrStoreFailed", err)
	}
	if err := <-first; !errors.Is(err, work.ErrBackend) || !errors.Is(err, pebblelog.ErrStoreFailed) {
		t.Errorf("submit of K: err = %v, want ErrBackend wrapping pebblelog.ErrStoreFailed", err)
	}
	armed.Store(false)
	q.Close()

	q, err = work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.Session("s1").Submit(ctx, req); err != nil {
		t.Fatalf("submit of K after the reopen: %v", err)
	}
}

// Options.StallTimeout reaches the store: a WAL sync that never returns (a disk that stopped
// answering) fails the store after the timeout, and the caller, which set no deadline of its
// own, gets ErrBackend wrapping pebblelog.ErrStoreFailed instead of waiting forever.
func TestStallTimeoutOption(t *testing.T) {
	var armed atomic.Bool
	gate := make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && strings.HasSuffix(op.Path, ".log") &&
			(op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) {
			<-gate
		}
		return nil
	})
	q, err := work.Open(t.TempDir(), &work.Options{FS: errorfs.Wrap(vfs.Default, inj), StallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := q.Session("s1")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "warm-up"}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	done := make(chan error, 1)
	go func() { _, err := s.Submit(ctx, work.TaskRequest{Kind: "stalled"}); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, work.ErrBackend) || !errors.Is(err, pebblelog.ErrStoreFailed) {
			t.Errorf("submit on a stalled disk: err = %v, want ErrBackend wrapping pebblelog.ErrStoreFailed", err)
		}
	case <-time.After(10 * time.Second):
		// 50 times the option, a third of the default (30 s): not a timing bound on the
		// watchdog, a check that the option, not the default, is in force.
		t.Error("submit on a stalled disk still waits after 10 s: Options.StallTimeout did not reach the store")
	}
	armed.Store(false)
	close(gate)
	q.Close() // may report the failure; it must return
}
