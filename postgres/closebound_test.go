package postgres

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// Issue 25: Close is bounded by CloseTimeout (and its grace) even when the writer is
// resolving a group whose COMMIT was in flight on a frozen server (resolve may ask for up to
// CommitResolveTimeout): Close used to be able to wait CommitResolveTimeout on top.
func TestCloseBoundedWhileResolving(t *testing.T) {
	dsn := pgtest.Schema(t)
	fr := pgtest.NewFreezer(t, dsn)
	watchdog := time.AfterFunc(90*time.Second, fr.Thaw)
	defer watchdog.Stop()
	const closeTimeout = time.Second
	e, q := openEngine(t, dsn, &Options{WriteTimeout: time.Second, CommitResolveTimeout: 40 * time.Second, CloseTimeout: closeTimeout})
	ctx := context.Background()
	s := q.Session("s")
	for i := range 3 { // caches the commit batch's statements
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before", IdempotencyKey: string(rune('a' + i))}); err != nil {
			t.Fatal(err)
		}
	}
	var once sync.Once
	frozen := make(chan struct{})
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(*pgx.Conn) { once.Do(func() { fr.Freeze(); close(frozen) }) }
	inFlight := make(chan error, 1)
	go func() {
		_, err := s.Submit(ctx, work.TaskRequest{Kind: "in-flight", IdempotencyKey: "in-flight"})
		inFlight <- err
	}()
	<-frozen
	// Past WriteTimeout the writer gives up on the COMMIT and resolves it, asking for up to
	// CommitResolveTimeout.
	time.Sleep(3 * time.Second)
	took, err := within(t, "Close while the writer resolves on the frozen server", closeTimeout+closeGrace+3*time.Second, q.Close)
	t.Logf("Close returned after %v: %v", took.Round(time.Millisecond), err)
	if err != nil { // the writer and its connections end within CloseTimeout and the socket cut
		t.Errorf("Close = %v, want nil", err)
	}
	select {
	case err := <-inFlight:
		if !errors.Is(err, ErrCommitUnknown) && !errors.Is(err, work.ErrBackend) {
			t.Errorf("the Submit whose COMMIT was in flight = %v, want ErrBackend", err)
		}
	case <-time.After(closeGrace):
		t.Error("the Submit whose COMMIT was in flight did not return at Close")
	}
	fr.Thaw()
}
