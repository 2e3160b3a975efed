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

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// A follower hands out an event only once it is durable: on Pebble a batch is visible to
// ReadLog while its WAL fsync is still running, and a failed fsync takes it back. Here the
// fsync of the doomed submit is held while it is visible, two followers start (one from the
// start, one from the doomed sequence), and then the fsync fails: neither may have handed the
// doomed event out, and both end with the store's failure.
func TestFollowNeverHandsOutAnEventWhoseSyncFails(t *testing.T) {
	armed, held, release, q := openHeldWALSync(t)
	defer q.Close()
	ctx := context.Background()
	s := q.Session("s1")
	for range 3 {
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	armed.Store(true)
	doomed := make(chan error, 1)
	go func() { _, err := s.Submit(ctx, work.TaskRequest{Kind: "doomed"}); doomed <- err }()
	<-held
	// Wait until the doomed event is visible to reads: the state a follower must not trust.
	for visible := false; !visible; {
		err := q.ReadLog(ctx, 4, func(ev events.Event) error { visible = true; return nil })
		if err != nil {
			t.Fatalf("ReadLog while the sync is held: %v", err)
		}
	}

	type result struct {
		seqs []uint64
		err  error
	}
	start := func(from uint64) (<-chan result, <-chan uint64) {
		out, seen := make(chan result, 1), make(chan uint64, 16)
		go func() {
			var r result
			r.err = q.Follow(ctx, from, func(ev events.Event) error {
				r.seqs = append(r.seqs, ev.Head().Seq)
				seen <- ev.Head().Seq
				return nil
			})
			out <- r
		}()
		return out, seen
	}
	fromStart, seenStart := start(1)
	fromDoomed, _ := start(4)
	for want := uint64(1); want <= 3; want++ {
		select {
		case got := <-seenStart:
			if got != want {
				t.Fatalf("the follower handed out seq %d, want %d", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the follower did not hand out the durable seq %d", want)
		}
	}
	// The followers now wait (or, if wrong, read on into the visible, undurable event). The
	// grace lets a wrong follower get there before the sync fails; the test passes in either
	// order for a right one, so it only decides how often a wrong one is caught.
	time.Sleep(300 * time.Millisecond)
	close(release)
	if err := <-doomed; !errors.Is(err, pebblelog.ErrStoreFailed) {
		t.Fatalf("the doomed submit returned %v, want the store's failure", err)
	}
	for name, c := range map[string]<-chan result{"from 1": fromStart, "from 4": fromDoomed} {
		select {
		case r := <-c:
			for _, seq := range r.seqs {
				if seq > 3 {
					t.Errorf("follower %s handed out seq %d, whose fsync failed", name, seq)
				}
			}
			if !errors.Is(r.err, work.ErrBackend) || !errors.Is(r.err, pebblelog.ErrStoreFailed) {
				t.Errorf("follower %s ended with %v, want ErrBackend wrapping pebblelog.ErrStoreFailed", name, r.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("follower %s still runs after the store failed", name)
		}
	}
}

// openHeldWALSync opens a Pebble queue whose first WAL sync after armed is set is held
// (held closes when it starts) until release is closed, and then fails.
func openHeldWALSync(t *testing.T) (armed *atomic.Bool, held, release chan struct{}, q *work.Queue) {
	t.Helper()
	armed = new(atomic.Bool)
	held, release = make(chan struct{}), make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && strings.HasSuffix(op.Path, ".log") &&
			(op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) {
			if armed.CompareAndSwap(true, false) {
				close(held)
			}
			<-release
			return errorfs.ErrInjected
		}
		return nil
	})
	q, err := work.Open(t.TempDir(), &work.Options{FS: errorfs.Wrap(vfs.Default, inj)})
	if err != nil {
		t.Fatal(err)
	}
	return armed, held, release, q
}
