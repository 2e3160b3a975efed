package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestSubmitManyReadsItsKeysTogether (engineapi.NewKeyPrefetcher): a SubmitMany run the
// ordinary way (under the lock) reads the keys its cache does not hold in one statement, not
// one round trip each: a batch of 100 keys, half stored by another process, is the begin
// batch, the keys' read and the commit batch (prepares not counted). Every answer is what one read per key gave: the
// stored keys name their tasks (or conflict), the new ones make tasks, and a key repeated
// in the batch names the first request's task.
func TestSubmitManyReadsItsKeysTogether(t *testing.T) {
	dsn := pgtest.Schema(t)
	_, other := openEngine(t, dsn, nil)
	ctx := context.Background()
	stored := map[string]string{}
	for i := range 50 {
		tk, err := other.Session("s").Submit(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprint("key-", i)})
		if err != nil {
			t.Fatal(err)
		}
		stored[tk.IdempotencyKey] = tk.ID
	}
	e, q, tc := openCountedUnprepared(t, dsn) // a prepare goes to the connection the pool hands out
	// The ordinary way.
	e.ordinaryCommits = true
	// The ordinary way's statements, on another session's keys.
	if _, err := q.Session("warm-up").SubmitMany(ctx, []work.TaskRequest{{Kind: "k", IdempotencyKey: "a"}, {Kind: "k", IdempotencyKey: "b"}}); err != nil {
		t.Fatal(err)
	}
	var rs []work.TaskRequest
	for i := range 100 {
		kind := "k"
		if i == 10 {
			kind = "other" // a stored key with another intent: a conflict
		}
		rs = append(rs, work.TaskRequest{Kind: kind, IdempotencyKey: fmt.Sprint("key-", i)})
	}
	rs = append(rs, work.TaskRequest{Kind: "k", IdempotencyKey: "key-70"}) // repeated in the batch
	tc.n.Store(0)
	tc.trips()
	res, err := q.Session("s").SubmitMany(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if got := tc.n.Load(); got != 3 {
		t.Errorf("a SubmitMany of 101 keys the ordinary way took %d round trips, want 3: %q", got, tc.trips())
	}
	for i, r := range res {
		key := rs[i].IdempotencyKey
		switch {
		case i == 10:
			if r.Err == nil {
				t.Errorf("request %d: a stored key with another kind: %+v, want a conflict", i, r.Task)
			}
		case i < 50:
			if r.Err != nil || r.Task.ID != stored[key] {
				t.Errorf("request %d (stored key %s): %s, %v; want task %s", i, key, r.Task.ID, r.Err, stored[key])
			}
		case i == 100:
			if r.Err != nil || r.Task.ID != res[70].Task.ID {
				t.Errorf("a key repeated in the batch: %s, %v; want the first request's task %s", r.Task.ID, r.Err, res[70].Task.ID)
			}
		default:
			if r.Err != nil || r.Task.ID == "" || r.Task.Attempts != 0 {
				t.Errorf("request %d (new key %s): %+v, %v; want a new task", i, key, r.Task, r.Err)
			}
		}
	}
	e.ordinaryCommits = false
	mustVerify(t, q)
}
