package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestSubmitManyLostCommitRecordsNothing (spec part 3, "Batch submit": one transaction on
// PostgreSQL; a store failure is the batch's error and nothing was recorded): the connection
// is lost before the COMMIT of a batch of 500 submits. SubmitMany returns ErrBackend and no
// result, the log holds none of the batch and its keys are free; the same batch then
// succeeds whole, and the store verifies. (Submits one after another would each be a
// command of their own: the later ones would be stored.)
func TestSubmitManyLostCommitRecordsNothing(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	e.ordinaryCommits = true // the ordinary path, which the trace fails or counts
	tracing(e).beforeCommit = func(c *pgx.Conn) {
		if armed.CompareAndSwap(true, false) {
			dropConn(c)
		}
	}
	rs := make([]work.TaskRequest, 500)
	for i := range rs {
		rs[i] = work.TaskRequest{Kind: "k", Input: []byte(fmt.Sprint(i)), IdempotencyKey: fmt.Sprintf("key-%d", i)}
	}
	armed.Store(true)
	res, err := s.SubmitMany(ctx, rs)
	if !errors.Is(err, work.ErrBackend) || res != nil {
		t.Fatalf("SubmitMany with the connection lost before COMMIT: %d results, %v; want ErrBackend and none", len(res), err)
	}
	tracing(e).beforeCommit = nil
	e.ordinaryCommits = false
	if n := logLen(t, q); n != 1 {
		t.Fatalf("the log has %d events after the lost batch, want the 1 before it", n)
	}
	for _, key := range []string{"key-0", "key-499"} {
		if _, err := s.TaskByKey(ctx, key); !errors.Is(err, work.ErrTaskNotFound) {
			t.Errorf("TaskByKey(%s) after the lost batch: %v, want ErrTaskNotFound", key, err)
		}
	}
	res, err = s.SubmitMany(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("item %d: %v", i, r.Err)
		}
	}
	if n := logLen(t, q); n != 501 {
		t.Errorf("the log has %d events, want 501", n)
	}
	mustVerify(t, q)
}

// TestSubmitManyReadsNoRecord: a batch of new keyless tasks reads no record under the head
// lock. Its ids share a millisecond and are random after it, so most fall below the ids the
// batch put before them; a new id is known to have no record by comparing it with the
// greatest id stored when the group began (txn.maxTask), not with the group's own puts
// (which cost a round trip per task: 35% of SubmitMany's client CPU, most of its time).
func TestSubmitManyReadsNoRecord(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	s := q.Session("s")
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	tracing(e).recordRead = func() { reads.Add(1) }
	rs := make([]work.TaskRequest, 500)
	for i := range rs {
		rs[i] = work.TaskRequest{Kind: "k", Input: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	res, err := s.SubmitMany(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || string(r.Task.Input) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("SubmitMany of 500 new tasks read %d records from the server, want 0", n)
	}
	tracing(e).recordRead = nil
	mustVerify(t, q)
}
