package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestNewKeyedSubmitIsOneRoundTrip (issue 24, W1 from one goroutine, as bench/ submits: every
// task with a key): a new keyed Submit, RequestWake and SubmitMany are one round trip in all
// when repeats are rare. The writer's run before the lock takes the unread key as absent and
// the batch's insert of the key's row proves it. Before, read-first's lookup went first:
// two round trips (the SubmitMany, which has no read-first, read each key under the lock:
// one round trip a key, and two more).
func TestNewKeyedSubmitIsOneRoundTrip(t *testing.T) {
	e, q, tc := openCountedUnprepared(t, pgtest.Schema(t))
	ctx := context.Background()
	s := q.Session("s")
	for i := range 3 { // the cache becomes exact and alone; every statement gets prepared
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "warm-up", IdempotencyKey: fmt.Sprint("warm-up-", i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Wake(ctx, work.WakeRequest{IdempotencyKey: fmt.Sprint("warm-up-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "warm-up", IdempotencyKey: "warm-up-2"}); err != nil {
		t.Fatal(err) // a repeat the cache answers: the read of the head gets prepared
	}
	e.readFirst.left[0].Store(0) // the repeat turned read-first on
	const n = 20
	count := func(what string, want, wantFast int, fn func(i int) error) {
		t.Helper()
		tc.n.Store(0)
		fast := e.head.fast.Load()
		for i := range n {
			if err := fn(i); err != nil {
				t.Fatalf("%s %d: %v", what, i, err)
			}
		}
		if got := tc.n.Load(); got != int64(want) {
			t.Errorf("%d %s from one goroutine took %d round trips, want %d", n, what, got, want)
		}
		if got := e.head.fast.Load() - fast; got != int64(wantFast) {
			t.Errorf("%d of %d %s took the fast path, want %d", got, n, what, wantFast)
		}
	}
	count("new keyed submits", n, n, func(i int) error {
		_, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(`{"n":1}`), IdempotencyKey: fmt.Sprint("key-", i)})
		return err
	})
	count("new keyed wakes", n, n, func(i int) error {
		_, err := s.Wake(ctx, work.WakeRequest{Payload: []byte(`1`), IdempotencyKey: fmt.Sprint("wake-", i)})
		return err
	})
	count("keyed SubmitManys of 50 new tasks", n, n, func(i int) error {
		rs := make([]work.TaskRequest, 50)
		for j := range rs {
			rs[j] = work.TaskRequest{Kind: "m", IdempotencyKey: fmt.Sprint("many-", i, "-", j)}
		}
		res, err := s.SubmitMany(ctx, rs)
		for _, r := range res {
			if err == nil {
				err = r.Err
			}
		}
		return err
	})
	// The repeats: one round trip each. The first the writer's cache answers (it put the key),
	// with the read of the head that proves the cache current; it turns read-first on, which
	// answers the others with a read of the key, without the writer.
	count("repeats of cached keys", n, 1, func(i int) error {
		task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: []byte(`{"n":1}`), IdempotencyKey: fmt.Sprint("key-", i)})
		if err == nil && task.Kind != "k" {
			err = fmt.Errorf("the repeat answered %+v", task)
		}
		return err
	})
	if got, want := logLen(t, q), 6+2*n+n*50; got != want {
		t.Errorf("the log has %d events, want %d", got, want)
	}
	mustVerify(t, q)
}

// TestKeyStoredBeforeTheCacheIsProven: the keys another writer stored before this writer's
// cache began (a restart, a cache started over) are in neither its cache nor a hint, and
// its run before the lock takes each as absent. The batch's insert of the key's row fails on
// the key table's primary key, the whole batch rolls back, and the group runs the ordinary
// way, which reads the key under the lock: each request is answered exactly as before — the
// stored task or wake, or the conflict; a SubmitMany's other requests are submitted once —
// and nothing is stored twice. The repeat turns read-first on: the next repeats are one
// statement each, as before, and new keys take one round trip again
// readFirstAfterRepeat requests after the last repeat seen.
func TestKeyStoredBeforeTheCacheIsProven(t *testing.T) {
	dsn := pgtest.Schema(t)
	_, qa := openEngine(t, dsn, nil)
	ctx := context.Background()
	sa := qa.Session("s")
	const n = 21
	ids := make([]string, n)
	for i := range n {
		task, err := sa.Submit(ctx, work.TaskRequest{Kind: "a", IdempotencyKey: fmt.Sprint("key-", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = task.ID
	}
	wake, err := sa.Wake(ctx, work.WakeRequest{Payload: []byte(`"a"`), IdempotencyKey: "wake"})
	if err != nil {
		t.Fatal(err)
	}
	events := n + 1

	b, qb, tc := openCountedUnprepared(t, dsn) // A writes no more: B's writer is alone
	s := qb.Session("s")
	for range 3 {
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "warm-up"}); err != nil {
			t.Fatal(err)
		}
		events++
	}
	proven := func(what string, fn func() error) {
		t.Helper()
		stored := b.head.fastKey.Load()
		if err := fn(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		if b.head.fastKey.Load() != stored+1 {
			t.Errorf("%s: no fast batch was refused on the key's row: the case proves nothing", what)
		}
		b.readFirst.left[0].Store(0) // the next request of either kind skips read-first again
		b.readFirst.left[1].Store(0)
	}
	proven("a repeated wake", func() error {
		w, err := s.Wake(ctx, work.WakeRequest{Payload: []byte(`"a"`), IdempotencyKey: "wake"})
		if err == nil && w.ID != wake.ID {
			err = fmt.Errorf("answered wake %s, want %s", w.ID, wake.ID)
		}
		return err
	})
	proven("a repeated submit", func() error {
		task, err := s.Submit(ctx, work.TaskRequest{Kind: "a", IdempotencyKey: "key-0"})
		if err == nil && task.ID != ids[0] {
			err = fmt.Errorf("answered task %s, want %s", task.ID, ids[0])
		}
		return err
	})
	proven("a conflicting submit", func() error {
		_, err := s.Submit(ctx, work.TaskRequest{Kind: "b", IdempotencyKey: "key-1"})
		if !errors.Is(err, work.ErrIdempotencyConflict) {
			return fmt.Errorf("got %v, want ErrIdempotencyConflict", err)
		}
		return nil
	})
	proven("a SubmitMany with a stored key among new ones", func() error {
		res, err := s.SubmitMany(ctx, []work.TaskRequest{
			{Kind: "m", IdempotencyKey: "new-1"}, {Kind: "a", IdempotencyKey: "key-2"}, {Kind: "m", IdempotencyKey: "new-2"},
		})
		if err != nil {
			return err
		}
		events += 2
		for i, r := range res {
			if r.Err != nil || (i == 1) != (r.Task.ID == ids[2]) || (i != 1 && r.Task.Kind != "m") {
				return fmt.Errorf("result %d: %+v", i, r)
			}
		}
		return nil
	})
	proven("a large SubmitMany (its keys by COPY) with a stored key among new ones", func() error {
		rs := taskRequests(2*copyMin, "big", true)
		for i := range rs {
			rs[i].IdempotencyKey = "big-" + rs[i].IdempotencyKey
		}
		rs[copyMin].IdempotencyKey = "key-20"
		res, err := s.SubmitMany(ctx, rs)
		if err != nil {
			return err
		}
		events += len(rs) - 1
		if r := res[copyMin]; r.Err == nil && r.Task.ID != ids[20] {
			return fmt.Errorf("the stored key's item answered %+v, want task %s", r, ids[20])
		}
		rs = slices.Delete(rs, copyMin, copyMin+1)
		checkSubmitted(t, s, rs, slices.Delete(res, copyMin, copyMin+1))
		return nil
	})
	// A command that looks a key up and inserts nothing: nothing would prove the key absent,
	// so its group runs the ordinary way and reads it.
	var got string
	if err := b.Update(ctx, func(tx engineapi.Txn) error {
		var err error
		got, err = tx.TaskKey("s", "key-3")
		return err
	}); err != nil || got != ids[3] {
		t.Errorf("a lookup of key-3 inside a command: %q, %v; want %s", got, err, ids[3])
	}

	// A repeat seen: the next keyed requests read first. Repeats are one statement each.
	if _, err := s.Submit(ctx, work.TaskRequest{Kind: "a", IdempotencyKey: "key-4"}); err != nil {
		t.Fatal(err)
	}
	tc.n.Store(0)
	for i := 5; i < n; i++ {
		task, err := s.Submit(ctx, work.TaskRequest{Kind: "a", IdempotencyKey: fmt.Sprint("key-", i)})
		if err != nil || task.ID != ids[i] {
			t.Fatalf("repeat %d: %+v, %v; want %s", i, task, err, ids[i])
		}
	}
	if got := tc.n.Load(); got != n-5 {
		t.Errorf("%d repeats took %d round trips, want %d", n-5, got, n-5)
	}
	// New keys: read first (two round trips each) until readFirstAfterRepeat have been,
	// then one round trip each.
	submitNew := func(from, to int) int64 {
		tc.n.Store(0)
		for i := from; i < to; i++ {
			if _, err := s.Submit(ctx, work.TaskRequest{Kind: "new", IdempotencyKey: fmt.Sprint("new-key-", i)}); err != nil {
				t.Fatal(err)
			}
			events++
		}
		return tc.n.Load()
	}
	if got := submitNew(0, readFirstAfterRepeat); got != 2*readFirstAfterRepeat {
		t.Errorf("%d new keyed submits after a repeat took %d round trips, want %d", readFirstAfterRepeat, got, 2*readFirstAfterRepeat)
	}
	if got := submitNew(readFirstAfterRepeat, readFirstAfterRepeat+n); got != n {
		t.Errorf("the next %d new keyed submits took %d round trips, want %d", n, got, n)
	}
	if got := logLen(t, qb); got != events {
		t.Errorf("the log has %d events, want %d", got, events)
	}
	mustVerify(t, qb)
}
