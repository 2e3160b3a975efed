package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// within fails t unless fn returns within d; it returns fn's error. The test goes on (and the
// server is thawed by the watchdog the caller set) when fn hangs.
func within(t *testing.T, what string, d time.Duration, fn func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		took := time.Since(start)
		if took > d {
			t.Errorf("%s took %v, want at most %v", what, took.Round(time.Millisecond), d)
		}
		return took, err
	case <-time.After(d + 60*time.Second):
		t.Fatalf("%s did not return within %v", what, d+60*time.Second)
		return 0, nil
	}
}

// With the server frozen (SIGSTOP of its processes) while a group's COMMIT is on its way:
// a Submit with a short context returns with its context, a read without one and the Submit
// whose COMMIT is in flight end at Close, which returns within CloseTimeout and its grace;
// the in-flight Submit is ErrCommitUnknown (the server, resumed, may still commit it), never a
// success nor a plain failure; after SIGCONT every acknowledged task is there. Close used to
// wait for the server to resume (42 s in the run).
func TestFrozenServerClose(t *testing.T) {
	dsn := pgtest.Schema(t)
	fr := pgtest.NewFreezer(t, dsn)
	watchdog := time.AfterFunc(30*time.Second, fr.Thaw) // before the fix: Close hung until here
	defer watchdog.Stop()
	e, q := openEngine(t, dsn, &Options{CloseTimeout: 2 * time.Second})
	ctx := context.Background()
	s := q.Session("s")
	var acked []string
	for i := 0; i < 5; i++ { // also caches the commit batch's statements: the COMMIT goes out in one write
		task, err := s.Submit(ctx, work.TaskRequest{Kind: "before", IdempotencyKey: fmt.Sprint("before-", i)})
		if err != nil {
			t.Fatal(err)
		}
		acked = append(acked, task.ID)
	}
	frozen := make(chan struct{})
	var once sync.Once
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(*pgx.Conn) { once.Do(func() { fr.Freeze(); close(frozen) }) }
	inFlight := make(chan error, 1)
	go func() {
		_, err := s.Submit(ctx, work.TaskRequest{Kind: "in-flight", IdempotencyKey: "in-flight"})
		inFlight <- err
	}()
	<-frozen

	_, err := within(t, "a Submit with a 500 ms context on the frozen server", 10*time.Second, func() error {
		sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := s.Submit(sctx, work.TaskRequest{Kind: "short", IdempotencyKey: "short"})
		return err
	})
	if err == nil {
		t.Fatal("a Submit on the frozen server succeeded")
	}
	read := make(chan error, 1)
	go func() { _, _, err := s.Task(ctx, acked[0]); read <- err }()

	took, err := within(t, "Close on the frozen server", 2*time.Second+closeGrace+5*time.Second, q.Close)
	t.Logf("Close returned after %v: %v", took.Round(time.Millisecond), err)
	select {
	case err := <-inFlight:
		if !errors.Is(err, ErrCommitUnknown) || !errors.Is(err, work.ErrBackend) {
			t.Errorf("the Submit whose COMMIT was in flight = %v, want ErrBackend wrapping ErrCommitUnknown", err)
		}
	case <-time.After(closeGrace):
		t.Error("the Submit whose COMMIT was in flight did not return at Close")
	}
	select {
	case err := <-read:
		if err == nil {
			t.Error("a read on the frozen server succeeded")
		}
	case <-time.After(closeGrace):
		t.Error("a read without a deadline did not end at Close")
	}

	fr.Thaw()
	q2, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	for _, id := range acked {
		if _, found, err := q2.Session("s").Task(ctx, id); err != nil || !found {
			t.Fatalf("acknowledged task %s after the thaw: %v %v", id, found, err)
		}
	}
	mustVerify(t, q2)
}

// With the server frozen and no Close, the writer's transaction ends at WriteTimeout: a
// Submit without a deadline whose COMMIT is in flight returns (ErrCommitUnknown: the server
// cannot be asked) instead of waiting for the server to resume, and after SIGCONT the queue
// goes on by itself.
func TestFrozenServerWriteTimeout(t *testing.T) {
	dsn := pgtest.Schema(t)
	fr := pgtest.NewFreezer(t, dsn)
	watchdog := time.AfterFunc(30*time.Second, fr.Thaw)
	defer watchdog.Stop()
	e, q := openEngine(t, dsn, &Options{WriteTimeout: time.Second, CommitResolveTimeout: time.Second})
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before", IdempotencyKey: "before"}); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(*pgx.Conn) { once.Do(fr.Freeze) }
	// resolve asks once more, 5 s at most per question, after CommitResolveTimeout.
	_, err := within(t, "a Submit whose COMMIT is in flight on the frozen server", 20*time.Second, func() error {
		_, err := s.Submit(ctx, work.TaskRequest{Kind: "in-flight", IdempotencyKey: "in-flight"})
		return err
	})
	if !errors.Is(err, ErrCommitUnknown) {
		t.Errorf("Submit = %v, want ErrCommitUnknown", err)
	}
	fr.Thaw()
	tracing(e).beforeCommit = nil
	e.ordinaryCommits = false
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := s.Submit(ctx, work.TaskRequest{Kind: "after", IdempotencyKey: "after"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue did not recover after the thaw: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustVerify(t, q)
}

// A caller that leaves while its closure waits on the server (here a read of the key index
// that another connection's lock holds) returns at once: the read is cancelled and its group
// rolled back and re-run without it. It used to wait until the lock went away.
func TestCallerLeavesDuringAClosuresRead(t *testing.T) {
	dsn := pgtest.Schema(t)
	_, q := openEngine(t, dsn, nil)
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "first"}); err != nil {
		t.Fatal(err)
	}
	blocker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	if _, err := blocker.Exec(ctx, "BEGIN; LOCK TABLE task_keys IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(60*time.Second, func() { blocker.PgConn().CancelRequest(ctx) })
	defer release.Stop()
	_, err = within(t, "a Submit with a 500 ms context whose key lookup waits on a lock", 10*time.Second, func() error {
		sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := s.Submit(sctx, work.TaskRequest{Kind: "k", IdempotencyKey: "waits"})
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Submit = %v, want the context's deadline", err)
	}
	if _, err := blocker.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	// The key was never taken: another intent under it is a new task, not a conflict.
	if task, err := s.Submit(ctx, work.TaskRequest{Kind: "other", IdempotencyKey: "waits"}); err != nil || task.Kind != "other" {
		t.Fatalf("Submit under the abandoned key = %+v, %v", task, err)
	}
	mustVerify(t, q)
}
