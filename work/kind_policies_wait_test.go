package work

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waitResult runs WaitTasks(kinds) in the background and returns its answer channel.
func waitResult(q *Queue, kinds []string, d time.Duration) <-chan error {
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		ch <- q.WaitTasks(ctx, kinds)
	}()
	return ch
}

// blocked requires that the wait has not returned within d.
func blocked(t *testing.T, ch <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s: WaitTasks returned %v, want it to block", what, err)
	case <-time.After(d):
	}
}

// woken requires that the wait returns nil within d.
func woken(t *testing.T, ch <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: WaitTasks returned %v, want nil", what, err)
		}
	case <-time.After(d):
		t.Fatalf("%s: WaitTasks did not return within %v", what, d)
	}
}

// TestWaitTasksPolicies: WaitTasks does not wake for a kind that cannot be claimed (paused,
// its slots held, its bucket empty) and wakes when the pause lifts, a slot frees (a settle)
// or the rate allows the next claim.
func TestWaitTasksPolicies(t *testing.T) {
	ctx := context.Background()
	waitBackends(t, func(t *testing.T, q *Queue) {
		s := q.Session("s")
		for _, k := range []string{"p", "p", "m", "m", "r", "r"} {
			if _, err := s.Submit(ctx, TaskRequest{Kind: k}); err != nil {
				t.Fatal(err)
			}
		}
		// Paused: no wake while the task is due; a zero policy lifts it.
		if err := q.SetKindPolicy(ctx, "p", KindPolicy{Paused: true}); err != nil {
			t.Fatal(err)
		}
		for _, kinds := range [][]string{{"p"}, nil} {
			if kinds == nil { // every kind: only the paused one has work
				if err := q.SetKindPolicy(ctx, "m", KindPolicy{Paused: true}); err != nil {
					t.Fatal(err)
				}
				if err := q.SetKindPolicy(ctx, "r", KindPolicy{Paused: true}); err != nil {
					t.Fatal(err)
				}
			}
			ch := waitResult(q, kinds, time.Minute)
			blocked(t, ch, 300*time.Millisecond, "a paused kind")
			if kinds == nil {
				for _, k := range []string{"m", "r"} {
					if err := q.SetKindPolicy(ctx, k, KindPolicy{}); err != nil {
						t.Fatal(err)
					}
				}
			} else if err := q.SetKindPolicy(ctx, "p", KindPolicy{}); err != nil {
				t.Fatal(err)
			}
			woken(t, ch, 10*time.Second, "the pause lifted")
			if kinds != nil {
				if err := q.SetKindPolicy(ctx, "p", KindPolicy{Paused: true}); err != nil {
					t.Fatal(err)
				}
			}
		}

		// MaxRunning 1, held under a long lease: no wake until a settle frees the slot.
		if err := q.SetKindPolicy(ctx, "m", KindPolicy{MaxRunning: 1}); err != nil {
			t.Fatal(err)
		}
		ds, err := q.ClaimKinds(ctx, []string{"m"}, time.Hour, 10)
		if err != nil || len(ds) != 1 {
			t.Fatalf("ClaimKinds(m) = %d, %v; want 1", len(ds), err)
		}
		ch := waitResult(q, []string{"m"}, time.Minute)
		blocked(t, ch, 300*time.Millisecond, "a kind with its slot held")
		if _, err := q.Finish(ctx, ds[0], Success(nil)); err != nil {
			t.Fatal(err)
		}
		woken(t, ch, 10*time.Second, "a settle freed the slot")

		// Rate 2/s, burst 1: after the one token is taken the waiter wakes half a second on.
		if err := q.SetKindPolicy(ctx, "r", KindPolicy{Rate: 2, Burst: 1}); err != nil {
			t.Fatal(err)
		}
		// The clock starts before the claim: the token is taken at the claim's now, which is
		// later, so the next one is due at least 500ms after start however long the claim's
		// commit took (a durable claim's fsync took 300ms under load, and a clock started
		// after it saw a correct wake as early).
		start := time.Now()
		if ds, err := q.ClaimKinds(ctx, []string{"r"}, time.Hour, 10); err != nil || len(ds) != 1 {
			t.Fatalf("ClaimKinds(r) = %d, %v; want 1", len(ds), err)
		}
		ch = waitResult(q, []string{"r"}, time.Minute)
		woken(t, ch, 10*time.Second, "the bucket refilled")
		if d := time.Since(start); d < 450*time.Millisecond {
			t.Errorf("WaitTasks on an empty bucket returned %v after the claim began, before the next token (500ms)", d)
		}
		if ds, err := q.ClaimKinds(ctx, []string{"r"}, time.Hour, 10); err != nil || len(ds) != 1 {
			t.Errorf("ClaimKinds(r) after the wait = %d, %v; want 1", len(ds), err)
		}
	})
}

// TestIdleWaiterOnPausedKindDoesNotSpin: a worker loop (wait, then claim) on a paused kind
// with due work makes no claim while it stays paused: it blocks in WaitTasks.
func TestIdleWaiterOnPausedKindDoesNotSpin(t *testing.T) {
	ctx := context.Background()
	waitBackends(t, func(t *testing.T, q *Queue) {
		if _, err := q.Session("s").Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
			t.Fatal(err)
		}
		if err := q.SetKindPolicy(ctx, "k", KindPolicy{Paused: true}); err != nil {
			t.Fatal(err)
		}
		loopCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		claims := 0
		for loopCtx.Err() == nil {
			if err := q.WaitTasks(loopCtx, []string{"k"}); err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					break
				}
				t.Fatal(err)
			}
			claims++
			if ds, err := q.ClaimKinds(ctx, []string{"k"}, time.Minute, 1); err != nil || len(ds) != 0 {
				t.Fatalf("ClaimKinds of a paused kind = %d, %v", len(ds), err)
			}
		}
		if claims > 0 {
			t.Errorf("a waiter on a paused kind tried %d claims in 2s, want 0", claims)
		}
	})
}

// TestWaiterOnScheduleWithMissingZoneDoesNotSpin: a schedule whose tick is due but whose time
// zone this machine's database lacks is skipped by every claim; a waiter for its kind must
// not wake for it again and again (it did: WaitTasks returned at once, every time). Once the
// zone is back, the next claim submits the tick.
func TestWaiterOnScheduleWithMissingZoneDoesNotSpin(t *testing.T) {
	ctx := context.Background()
	const zone = "America/New_York"
	if _, err := time.LoadLocation(zone); err != nil {
		t.Skipf("this machine has no %s: %v", zone, err)
	}
	waitBackends(t, func(t *testing.T, q *Queue) {
		s := q.Session("s")
		sc := Schedule{Name: "report", Cron: "0 * * * *", TimeZone: zone, Task: TaskRequest{Kind: "k"}}
		if err := s.SetScheduleAt(ctx, sc, time.Now().Add(-3*time.Hour)); err != nil {
			t.Fatal(err)
		}
		loadLocation = func(name string) (*time.Location, error) {
			if name == zone {
				return nil, errors.New("unknown time zone " + name)
			}
			return time.LoadLocation(name)
		}
		defer func() { loadLocation = time.LoadLocation }()

		loopCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		claims := 0
		for loopCtx.Err() == nil {
			if err := q.WaitTasks(loopCtx, []string{"k"}); err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					break
				}
				t.Fatal(err)
			}
			claims++
			if ds, err := q.ClaimKinds(ctx, []string{"k"}, time.Minute, 1); err != nil || len(ds) != 0 {
				t.Fatalf("ClaimKinds with the zone missing = %d, %v", len(ds), err)
			}
		}
		if claims > 0 {
			t.Errorf("a waiter on a schedule whose zone is missing tried %d claims in 2s, want 0", claims)
		}

		loadLocation = time.LoadLocation // the zone is back: the next claim submits the latest tick
		ds, err := q.ClaimKinds(ctx, []string{"k"}, time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("ClaimKinds with the zone back = %d, %v; want the tick's task", len(ds), err)
		}
		if ds[0].Task.IdempotencyKey == "" || ds[0].Task.Kind != "k" {
			t.Errorf("claimed %+v, want the schedule's tick", ds[0].Task)
		}
	})
}

// TestWaitTasksPerSession: with MaxRunningPerSession, WaitTasks does not wake for a due task
// whose session's slots are all held, and wakes when a settle frees one, when a lease that
// holds one expires, and at once for another session's due task.
func TestWaitTasksPerSession(t *testing.T) {
	ctx := context.Background()
	waitBackends(t, func(t *testing.T, q *Queue) {
		a := q.Session("a")
		for range 3 {
			if _, err := a.Submit(ctx, TaskRequest{Kind: "ps"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := q.SetKindPolicy(ctx, "ps", KindPolicy{MaxRunningPerSession: 1}); err != nil {
			t.Fatal(err)
		}
		ds, err := q.ClaimKinds(ctx, []string{"ps"}, time.Hour, 10)
		if err != nil || len(ds) != 1 {
			t.Fatalf("ClaimKinds(ps) = %d, %v; want 1", len(ds), err)
		}
		ch := waitResult(q, []string{"ps"}, time.Minute)
		blocked(t, ch, 300*time.Millisecond, "a session with its slot held")
		if _, err := q.Finish(ctx, ds[0], Success(nil)); err != nil {
			t.Fatal(err)
		}
		woken(t, ch, 10*time.Second, "a settle freed the session's slot")

		// A short lease holds the slot: the waiter wakes at its expiry, with no signal.
		start := time.Now()
		if ds, err = q.ClaimKinds(ctx, []string{"ps"}, time.Second, 10); err != nil || len(ds) != 1 {
			t.Fatalf("ClaimKinds(ps) = %d, %v; want 1", len(ds), err)
		}
		ch = waitResult(q, []string{"ps"}, time.Minute)
		blocked(t, ch, 300*time.Millisecond, "a session with its slot held for a second")
		woken(t, ch, 10*time.Second, "the lease's expiry freed the slot")
		if d := time.Since(start); d < 900*time.Millisecond {
			t.Errorf("WaitTasks returned %v after the claim began, before the lease expired (1s)", d)
		}
		if ds, err = q.ClaimKinds(ctx, []string{"ps"}, time.Hour, 10); err != nil || len(ds) != 1 {
			t.Fatalf("ClaimKinds(ps) after the expiry = %d, %v; want 1", len(ds), err)
		}
		// a's slot is held again; another session's task is claimable at once.
		ch = waitResult(q, nil, time.Minute)
		blocked(t, ch, 300*time.Millisecond, "every kind, a's slot held")
		if _, err := q.Session("b").Submit(ctx, TaskRequest{Kind: "ps"}); err != nil {
			t.Fatal(err)
		}
		woken(t, ch, 10*time.Second, "another session's task")
	})
}
