package pebblelog

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/worklog/worklog/projection"
)

// viewTask reads task id through ViewDurable: whether it exists, and whether the read was
// durable.
func viewTask(t *testing.T, s *Store, id string) (found, durable bool) {
	t.Helper()
	durable, err := s.ViewDurable(func(r projection.Reader) error {
		rec, err := r.Task(id)
		found = rec != nil
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return found, durable
}

// TestViewDurable: a read that may have seen a batch applied but not yet synced says so
// (work's read-first repeat then goes through the writer, issue 11.1); once the syncer has
// answered a batch, reads of it are durable, also while the writer is busy with another
// group, and after a reopen.
func TestViewDurable(t *testing.T) {
	var armed atomic.Bool
	held, gate := make(chan struct{}), make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite {
			if armed.CompareAndSwap(true, false) {
				close(held)
				<-gate
			}
			return errorfs.ErrInjected
		}
		return nil
	})
	dir := t.TempDir()
	s := openT(t, dir, &Options{FS: errorfs.Wrap(vfs.Default, inj)})
	seedStore(t, s)
	if err := submitOnce(s, "a"); err != nil {
		t.Fatal(err)
	}
	if found, durable := viewTask(t, s, "a"); !found || !durable {
		t.Fatalf("committed task a: found %v, durable %v; want both", found, durable)
	}

	// The writer busy in a command that waits: reads do not wait for it.
	busy, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- s.Update(context.Background(), func(*Txn) error { close(busy); <-gate; return errors.New("left") })
	}()
	<-busy
	if found, durable := viewTask(t, s, "a"); !found || !durable {
		t.Errorf("task a while the writer is busy: found %v, durable %v; want both", found, durable)
	}
	gate <- struct{}{} // not closed: the injector uses gate below
	if err := <-done; err == nil {
		t.Fatal("the busy command did not fail")
	}

	armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- submitOnce(s, "k") }()
	<-held // k's WAL write is held; its batch becomes visible (the apply does not wait for it)
	found, durable := viewTask(t, s, "k")
	for deadline := time.Now().Add(5 * time.Second); !found && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		found, durable = viewTask(t, s, "k")
	}
	if !found || durable {
		t.Errorf("task k, applied but not synced: found %v, durable %v; want found, not durable", found, durable)
	}
	if found, durable := viewTask(t, s, "a"); !found || durable {
		t.Errorf("task a with k's batch pending: found %v, durable %v; want found, not durable (the read may have seen k)", found, durable)
	}
	close(gate)
	if err := <-first; !errors.Is(err, ErrStoreFailed) {
		t.Fatalf("submit of k: %v, want ErrStoreFailed", err)
	}
	s.Close()

	s = openT(t, dir, &Options{})
	if found, durable := viewTask(t, s, "a"); !found || !durable {
		t.Errorf("task a after a reopen: found %v, durable %v; want both", found, durable)
	}
}
