package work_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TestConcurrentClaimFinish runs many workers claiming and finishing on one queue, with a
// shared logical clock that the workers advance. Some workers "crash": they drop deliveries,
// so leases expire and tasks are redelivered, and later try to finish what they dropped. Every
// delivery and every finish is recorded, and the record must show at-least-once delivery with
// fencing: never two live leases on a task, attempts 1..n without gaps, exactly one settlement
// per task by its last delivery, stale finishes refused, every task terminal, Verify clean.
func TestConcurrentClaimFinish(t *testing.T) {
	for _, c := range []struct {
		name  string
		tasks int
		open  func(t *testing.T) (*work.Queue, func() *work.Queue)
	}{
		{"memory", 600, func(t *testing.T) (*work.Queue, func() *work.Queue) {
			return work.NewInMemory(), nil
		}},
		{"durable", 240, func(t *testing.T) (*work.Queue, func() *work.Queue) {
			dir := t.TempDir()
			q, err := work.Open(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			return q, func() *work.Queue {
				q, err := work.Open(dir, nil)
				if err != nil {
					t.Fatal(err)
				}
				return q
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q, reopen := c.open(t)
			defer q.Close()
			tasks := c.tasks
			if raceBuild() {
				tasks /= 2 // Pebble checks its invariants under -race: every read costs more
			}
			testConcurrentClaimFinish(t, q, tasks)
			if reopen != nil {
				if err := q.Close(); err != nil {
					t.Fatal(err)
				}
				q2 := reopen()
				defer q2.Close()
				if err := q2.Verify(context.Background()); err != nil {
					t.Fatalf("Verify after reopening: %v", err)
				}
				if ds, err := q2.ClaimDueAt(context.Background(), concEpoch.Add(1000*time.Hour), time.Minute, 10); err != nil || len(ds) != 0 {
					t.Fatalf("after reopening, %d tasks are claimable (%v); every task was settled", len(ds), err)
				}
			}
		})
	}
}

var concEpoch = time.Date(2031, time.June, 1, 0, 0, 0, 0, time.UTC)

const (
	concWorkers = 16
	concCrashy  = 4                      // workers 0..3 drop deliveries
	concLease   = 200 * time.Millisecond // 200 ticks of the logical clock
)

type delivery struct {
	task      string
	attempt   uint32
	claimAt   time.Time
	expiresAt time.Time
	worker    int
}

type finishAttempt struct {
	task    string
	attempt uint32
	state   work.TaskState
	ok      bool // false: ErrStaleDelivery
	zombie  bool // a dropped delivery, finished late
}

func testConcurrentClaimFinish(t *testing.T, q *work.Queue, tasks int) {
	ctx := context.Background()
	start := time.Now()
	var clock atomic.Int64 // milliseconds after concEpoch
	now := func() time.Time { return concEpoch.Add(time.Duration(clock.Add(1)) * time.Millisecond) }

	// Half the tasks exist before the workers start; two submitters add the rest meanwhile.
	sessions := []string{"s-one", "s-two", "s-three"}
	type ref struct{ session, id string }
	var refsMu sync.Mutex
	var refs []ref
	submit := func(i int) error {
		s := sessions[i%len(sessions)]
		r := work.TaskRequest{Kind: "conc", Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), IdempotencyKey: fmt.Sprintf("k%d", i)}
		if i%3 == 0 {
			r.Wake = work.WakeOnCompletion
		}
		tk, err := q.Session(s).SubmitAt(ctx, r, now())
		if err != nil {
			return err
		}
		refsMu.Lock()
		refs = append(refs, ref{s, tk.ID})
		refsMu.Unlock()
		return nil
	}
	for i := 0; i < tasks/2; i++ {
		if err := submit(i); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu         sync.Mutex
		deliveries []delivery
		finishes   []finishAttempt
		zombies    []work.TaskDelivery // dropped, never finished
		settled    atomic.Int64
		failed     atomic.Value
		wg         sync.WaitGroup
	)
	fail := func(err error) { failed.CompareAndSwap(nil, err) }
	done := func() bool { return settled.Load() == int64(tasks) || failed.Load() != nil }

	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := tasks/2 + g; i < tasks; i += 2 {
				if err := submit(i); err != nil {
					fail(fmt.Errorf("submit %d: %w", i, err))
					return
				}
			}
		}()
	}

	finish := func(d work.TaskDelivery, zombie bool, rng *rand.Rand) error {
		o := work.Success(json.RawMessage(fmt.Sprintf(`{"attempt":%d}`, d.Attempt)))
		if rng.IntN(4) == 0 {
			o = work.Failure("no luck")
		}
		tk, err := q.FinishAt(ctx, d, o, now())
		fa := finishAttempt{task: d.Task.ID, attempt: d.Attempt, state: o.State, zombie: zombie}
		switch {
		case err == nil:
			fa.ok = true
			if tk.State != o.State || tk.Attempts != d.Attempt {
				return fmt.Errorf("finish of %s attempt %d returned state %s attempts %d", tk.ID, d.Attempt, tk.State, tk.Attempts)
			}
		case errors.Is(err, work.ErrStaleDelivery):
			var we *work.Error
			if !errors.As(err, &we) || we.ID != d.Task.ID {
				return fmt.Errorf("stale finish of %s: error %v does not name the task", d.Task.ID, err)
			}
		default:
			return fmt.Errorf("finish %s attempt %d: %w", d.Task.ID, d.Attempt, err)
		}
		mu.Lock()
		finishes = append(finishes, fa)
		mu.Unlock()
		if fa.ok {
			settled.Add(1)
		}
		return nil
	}

	// A worker that crashed before the others started: its three deliveries come back when
	// their leases expire, and its late finishes, tried after the drain, must all be stale.
	// This makes redelivery and fencing certain to happen, whatever the scheduling.
	at := now()
	early, err := q.ClaimDueAt(ctx, at, concLease, 3)
	if err != nil || len(early) != 3 {
		t.Fatalf("early claim: %d deliveries, %v", len(early), err)
	}
	for _, d := range early {
		deliveries = append(deliveries, delivery{d.Task.ID, d.Attempt, at, d.LeaseExpiresAt, -1})
	}
	zombies = append(zombies, early...)

	iterations := atomic.Int64{}
	for w := range concWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			var mine []work.TaskDelivery // this worker's dropped deliveries
			for !done() {
				if iterations.Add(1) > 2_000_000 {
					fail(errors.New("the workers did not drain the queue: livelock?"))
					return
				}
				// A crashed worker that comes back may try to finish what it dropped.
				if w < concCrashy && len(mine) > 0 && rng.IntN(5) == 0 {
					d := mine[0]
					mine = mine[1:]
					if err := finish(d, true, rng); err != nil {
						fail(err)
						return
					}
					continue
				}
				at := now()
				ds, err := q.ClaimDueAt(ctx, at, concLease, 1+rng.IntN(3))
				if err != nil {
					fail(fmt.Errorf("claim: %w", err))
					return
				}
				if len(ds) == 0 {
					runtime.Gosched()
					continue
				}
				mu.Lock()
				for _, d := range ds {
					deliveries = append(deliveries, delivery{d.Task.ID, d.Attempt, at, d.LeaseExpiresAt, w})
				}
				mu.Unlock()
				for _, d := range ds {
					if w < concCrashy && rng.IntN(10) < 3 {
						mine = append(mine, d) // crash: the lease runs out, the task comes back
						continue
					}
					if err := finish(d, false, rng); err != nil {
						fail(err)
						return
					}
				}
			}
			mu.Lock()
			zombies = append(zombies, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}

	// Every delivery a crashed worker never finished is stale now: its task was claimed again
	// and settled by a later delivery.
	rng := rand.New(rand.NewPCG(7, 7))
	for _, d := range zombies {
		if err := finish(d, true, rng); err != nil {
			t.Fatal(err)
		}
		if f := finishes[len(finishes)-1]; f.ok {
			t.Errorf("late finish of %s attempt %d succeeded after the queue drained", d.Task.ID, d.Attempt)
		}
	}

	// --- the record ---
	byTask := map[string][]delivery{}
	for _, d := range deliveries {
		byTask[d.task] = append(byTask[d.task], d)
	}
	redelivered := 0
	for _, r := range refs {
		ds := byTask[r.id]
		slices.SortFunc(ds, func(a, b delivery) int { return int(a.attempt) - int(b.attempt) })
		for k, d := range ds {
			if d.attempt != uint32(k+1) {
				t.Fatalf("task %s: attempts %v, want 1..%d without gaps", r.id, attemptsOf(ds), len(ds))
			}
			if !d.expiresAt.Equal(d.claimAt.Add(concLease)) {
				t.Errorf("task %s attempt %d: lease expires %v, claimed %v", r.id, d.attempt, d.expiresAt, d.claimAt)
			}
			if k > 0 && d.claimAt.Before(ds[k-1].expiresAt) {
				t.Errorf("task %s: attempt %d claimed at %v while attempt %d was leased until %v: two live leases",
					r.id, d.attempt, d.claimAt, ds[k-1].attempt, ds[k-1].expiresAt)
			}
		}
		if len(ds) > 1 {
			redelivered++
		}
		tk, ok, err := q.Session(r.session).Task(ctx, r.id)
		if err != nil || !ok {
			t.Fatalf("task %s: found %v, %v", r.id, ok, err)
		}
		if !tk.State.Terminal() {
			t.Errorf("task %s is %s after the workers drained the queue", r.id, tk.State)
		}
		if int(tk.Attempts) != len(ds) {
			t.Errorf("task %s has %d attempts, %d deliveries were made", r.id, tk.Attempts, len(ds))
		}
	}
	okBy := map[string]finishAttempt{}
	stale, zombieOK := 0, 0
	for _, f := range finishes {
		n := uint32(len(byTask[f.task]))
		if !f.ok {
			stale++
			if f.attempt >= n {
				t.Errorf("finish of %s attempt %d was refused as stale, but no later claim was made", f.task, f.attempt)
			}
			continue
		}
		if prev, dup := okBy[f.task]; dup {
			t.Errorf("task %s settled twice: attempts %d and %d", f.task, prev.attempt, f.attempt)
		}
		okBy[f.task] = f
		if f.attempt != n {
			t.Errorf("task %s was settled by attempt %d, but was claimed %d times: a claim after settlement", f.task, f.attempt, n)
		}
		if f.zombie {
			zombieOK++
		}
	}
	for _, r := range refs {
		f, ok := okBy[r.id]
		if !ok {
			t.Errorf("task %s was never settled", r.id)
			continue
		}
		if tk, _, _ := q.Session(r.session).Task(ctx, r.id); tk.State != f.state {
			t.Errorf("task %s is %s, settled as %s", r.id, tk.State, f.state)
		}
	}
	if len(refs) != tasks || len(okBy) != tasks {
		t.Errorf("%d tasks submitted, %d settled; want %d", len(refs), len(okBy), tasks)
	}
	if redelivered == 0 || stale == 0 {
		t.Errorf("the run redelivered %d tasks and refused %d stale finishes: the crash paths were not exercised", redelivered, stale)
	}
	if ds, err := q.ClaimDueAt(ctx, concEpoch.Add(1000*time.Hour), time.Minute, 10); err != nil || len(ds) != 0 {
		t.Errorf("after draining, %d tasks are claimable (%v)", len(ds), err)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	t.Logf("%d tasks, %d deliveries (%d tasks redelivered), %d stale finishes refused, %d late finishes won, logical time %v, %v",
		tasks, len(deliveries), redelivered, stale, zombieOK, time.Duration(clock.Load())*time.Millisecond, time.Since(start).Round(time.Millisecond))
}

// raceBuild reports whether the test binary was built with -race.
func raceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func attemptsOf(ds []delivery) []uint32 {
	out := make([]uint32, len(ds))
	for i, d := range ds {
		out[i] = d.attempt
	}
	return out
}
