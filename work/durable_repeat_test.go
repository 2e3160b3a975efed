package work_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// An idempotent repeat is answered from what the previous repeat read (pebblelog's durable
// cache): it still answers the task as it is now, after every transition the writer made
// since, and a new task once a prune freed the key.
func TestRepeatAnswersTheTaskAsItIsNow(t *testing.T) {
	q := openQueue(t, t.TempDir(), nil)
	ctx := context.Background()
	s := q.Session("s")
	r := work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "key"}
	repeat := func(what string, want work.TaskState) work.Task {
		t.Helper()
		for i := range 2 { // the first read may fill the cache, the second is answered from it
			got, err := s.SubmitAt(ctx, r, dat(10))
			if err != nil {
				t.Fatalf("%s: repeat %d: %v", what, i, err)
			}
			if got.State != want {
				t.Fatalf("%s: repeat %d answered state %v, want %v", what, i, got.State, want)
			}
		}
		got, _ := s.SubmitAt(ctx, r, dat(10))
		return got
	}
	first, err := s.SubmitAt(ctx, r, dat(0))
	if err != nil {
		t.Fatal(err)
	}
	repeat("pending", work.TaskPending)
	ds, err := q.ClaimDueAt(ctx, dat(1), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %v %v", ds, err)
	}
	if got := repeat("claimed", work.TaskRunning); got.Attempts != 1 {
		t.Fatalf("the repeat after the claim answered %d attempts, want 1", got.Attempts)
	}
	if _, err := q.FinishAt(ctx, ds[0], work.Success(json.RawMessage(`"done"`)), dat(2)); err != nil {
		t.Fatal(err)
	}
	got := repeat("finished", work.TaskSucceeded)
	if got.Outcome == nil || string(got.Outcome.Output) != `"done"` {
		t.Fatalf("the repeat after the finish answered outcome %+v", got.Outcome)
	}
	// The answer's values are the caller's own: changing them changes no later answer.
	got.Input[0] = 'X'
	if again := repeat("after the caller changed an answer", work.TaskSucceeded); string(again.Input) != `{"n":1}` {
		t.Fatalf("a repeat answered input %s after the caller changed an earlier answer's", again.Input)
	}
	// A conflicting intent is refused from the cached record as from the stored one.
	other := r
	other.Input = json.RawMessage(`{"n":2}`)
	if _, err := s.SubmitAt(ctx, other, dat(10)); !errors.Is(err, work.ErrIdempotencyConflict) {
		t.Fatalf("a repeat with another input: %v, want a conflict", err)
	}
	if _, err := q.Prune(ctx, dat(3)); err != nil {
		t.Fatal(err)
	}
	fresh, err := s.SubmitAt(ctx, r, dat(20))
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID == first.ID || fresh.State != work.TaskPending {
		t.Fatalf("after the prune the key answered task %s (%v), want a new pending task (the pruned one was %s)", fresh.ID, fresh.State, first.ID)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

// The same for a direct wake's key: the repeat answers the same wake after its claim and
// ack, and a new wake once a prune freed the key.
func TestRepeatAnswersTheWakeAsItIsNow(t *testing.T) {
	q := openQueue(t, t.TempDir(), nil)
	ctx := context.Background()
	s := q.Session("s")
	r := work.WakeRequest{Payload: json.RawMessage(`{"w":1}`), IdempotencyKey: "wkey"}
	first, err := s.WakeAt(ctx, r, dat(0))
	if err != nil {
		t.Fatal(err)
	}
	repeat := func(what string) work.Wake {
		t.Helper()
		var got work.Wake
		for i := range 2 {
			if got, err = s.WakeAt(ctx, r, dat(10)); err != nil {
				t.Fatalf("%s: repeat %d: %v", what, i, err)
			}
		}
		return got
	}
	if got := repeat("recorded"); got.ID != first.ID {
		t.Fatalf("a repeat answered wake %s, want %s", got.ID, first.ID)
	}
	ds, err := q.ClaimWakesAt(ctx, dat(1), time.Minute, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim wakes: %v %v", ds, err)
	}
	if err := q.AckWakeAt(ctx, ds[0], dat(2)); err != nil {
		t.Fatal(err)
	}
	if got := repeat("acked"); got.ID != first.ID {
		t.Fatalf("a repeat after the ack answered wake %s, want %s", got.ID, first.ID)
	}
	res, err := q.Prune(ctx, dat(3))
	if err != nil {
		t.Fatal(err)
	}
	if res.Wakes == 0 {
		t.Fatalf("the prune removed no wake (%+v): the acked wake should go", res)
	}
	if got := repeat("pruned"); got.ID == first.ID {
		t.Fatalf("after the prune (%+v) the key still answered the pruned wake %s", res, got.ID)
	}
}

// Repeats from many goroutines beside the transitions of their tasks: each goroutine's
// answers for a task never go back to an earlier state (pending, running, finished), and a
// repeat that starts after a finish returned answers the finished task. Run with -race.
func TestRepeatsBesideTransitionsNeverGoBack(t *testing.T) {
	q := openQueue(t, t.TempDir(), &work.Options{Sync: work.SyncNever})
	ctx := context.Background()
	s := q.Session("s")
	const tasks = 40
	reqs := make([]work.TaskRequest, tasks)
	for i := range reqs {
		reqs[i] = work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprintf("key-%d", i)}
		if _, err := s.SubmitAt(ctx, reqs[i], dat(0)); err != nil {
			t.Fatal(err)
		}
	}
	rank := map[work.TaskState]int{work.TaskPending: 0, work.TaskRunning: 1, work.TaskSucceeded: 2}
	var finished sync.Map // task index → true once its Finish returned
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Go(func() {
			seen := make([]int, tasks)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				i := (n + g) % tasks
				_, done := finished.Load(i)
				got, err := s.SubmitAt(ctx, reqs[i], dat(10))
				if err != nil {
					errs <- err
					return
				}
				k := rank[got.State]
				if k < seen[i] || (done && k != 2) {
					errs <- fmt.Errorf("task %d: a repeat answered %v after this goroutine saw rank %d (finished before: %v)", i, got.State, seen[i], done)
					return
				}
				seen[i] = k
			}
		})
	}
	for i := range tasks {
		ds, err := q.ClaimDueAt(ctx, dat(1), time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %v %v", ds, err)
		}
		if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), dat(2)); err != nil {
			t.Fatal(err)
		}
		var idx int
		fmt.Sscanf(ds[0].Task.IdempotencyKey, "key-%d", &idx)
		finished.Store(idx, true)
		_ = i
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
