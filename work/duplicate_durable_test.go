package work_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

// A duplicate submit on Pebble is answered by a read outside the writer (the key and its
// task, ViewDurable) only when what it read is durable: a batch is visible while its WAL
// fsync is still running, and a failed fsync takes it back. Here the fsync of the first
// submit of a key is held while the task is visible; a repeat of the request must not be
// answered with the task before the fsync, and once the fsync fails it gets the store's
// failure too. A repeat of a key whose task is durable is answered meanwhile.
func TestDuplicateSubmitWaitsForTheTaskToBeDurable(t *testing.T) {
	armed, held, release, q := openHeldWALSync(t)
	defer q.Close()
	var once atomic.Bool
	defer func() { // a failing test must not leave the fsync held: Close would wait for it
		if once.CompareAndSwap(false, true) {
			close(release)
		}
	}()
	ctx := context.Background()
	s := q.Session("s1")
	durable := work.TaskRequest{Kind: "k", IdempotencyKey: "durable"}
	first, err := s.Submit(ctx, durable)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	doomedReq := work.TaskRequest{Kind: "k", IdempotencyKey: "doomed"}
	doomed := make(chan error, 1)
	go func() { _, err := s.Submit(ctx, doomedReq); doomed <- err }()
	<-held
	// Wait until the doomed task is visible to reads (Task reads the committed state).
	for visible := false; !visible; {
		tasks, err := s.Tasks(ctx, work.TaskFilter{Limit: 100})
		if err != nil {
			t.Fatalf("reading tasks while the sync is held: %v", err)
		}
		for _, tk := range tasks {
			visible = visible || tk.IdempotencyKey == "doomed"
		}
	}
	// A repeat of the durable key is answered by the read, without waiting for the writer's
	// held batch.
	type answer struct {
		tk  work.Task
		err error
	}
	fast := make(chan answer, 1)
	go func() { tk, err := s.Submit(ctx, durable); fast <- answer{tk, err} }()
	select {
	case a := <-fast:
		if a.err != nil || a.tk.ID != first.ID {
			t.Fatalf("repeat of a durable key: %+v, %v; want task %s", a.tk, a.err, first.ID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a repeat of a durable key waited for the held fsync of another batch")
	}
	repeat := make(chan error, 1)
	go func() { _, err := s.Submit(ctx, doomedReq); repeat <- err }()
	select {
	case err := <-repeat:
		t.Fatalf("a repeat of the key whose task is not durable returned %v before the fsync", err)
	case <-time.After(300 * time.Millisecond):
	}
	once.Store(true)
	close(release)
	for name, c := range map[string]chan error{"the first submit": doomed, "the repeat": repeat} {
		if err := <-c; !errors.Is(err, pebblelog.ErrStoreFailed) {
			t.Errorf("%s returned %v, want the store's failure", name, err)
		}
	}
}
