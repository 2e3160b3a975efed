package work

import (
	"context"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
)

// TestQueueClockDecidesEveryPlainMethod: every method without an At twin's time takes its
// time from the queue's one clock (engineapi.Config.Clock), never from time.Now: each
// command's event is stamped with the clock's time, and the times a call returns (creation,
// lease expiry, finish, Stats' At) are the clock's. The clock is years in the past, so a
// method that read the host's clock shows.
func TestQueueClockDecidesEveryPlainMethod(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	q := newEngineQueue(newMemEngine(), engineapi.Config{Clock: func() time.Time { return t0 }})
	defer q.Close()
	s := q.Session("s")
	const lease = time.Minute
	at := func(what string, got, want time.Time) {
		t.Helper()
		if !got.Equal(want) {
			t.Errorf("%s: %v, want the queue's clock's %v", what, got, want)
		}
	}

	task, err := s.Submit(ctx, TaskRequest{Kind: "k", Wake: WakeOnCompletion})
	if err != nil {
		t.Fatal(err)
	}
	at("Submit: CreatedAt", task.CreatedAt, t0)
	if _, err := s.Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(ctx, TaskRequest{Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at("Stats: At", st.At, t0)
	if st.DueNow != 4 {
		t.Errorf("Stats: DueNow %d, want 4", st.DueNow)
	}

	ds, err := q.ClaimDue(ctx, lease, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("ClaimDue: %v, %v", ds, err)
	}
	at("ClaimDue: LeaseExpiresAt", ds[0].LeaseExpiresAt, t0.Add(lease))
	ext, err := q.Extend(ctx, ds[0], 2*lease)
	if err != nil {
		t.Fatal(err)
	}
	at("Extend: LeaseExpiresAt", ext.LeaseExpiresAt, t0.Add(2*lease))
	done, err := q.Finish(ctx, ext, Success(nil))
	if err != nil {
		t.Fatal(err)
	}
	at("Finish: FinishedAt", done.FinishedAt, t0)

	ks, err := q.ClaimKinds(ctx, []string{"k"}, lease, 1)
	if err != nil || len(ks) != 1 {
		t.Fatalf("ClaimKinds: %v, %v", ks, err)
	}
	at("ClaimKinds: LeaseExpiresAt", ks[0].LeaseExpiresAt, t0.Add(lease))
	rel, err := q.Release(ctx, ks[0], ReleaseRequest{})
	if err != nil {
		t.Fatal(err)
	}
	at("Release: ScheduledAt", rel.ScheduledAt, t0)

	res, sc, err := q.SettleAndClaim(ctx, nil, nil, lease, 1)
	if err != nil || len(res) != 0 || len(sc) != 1 {
		t.Fatalf("SettleAndClaim: %v, %v, %v", res, sc, err)
	}
	at("SettleAndClaim: LeaseExpiresAt", sc[0].LeaseExpiresAt, t0.Add(lease))
	res, _, err = q.SettleAndClaim(ctx, []Settle{{Delivery: sc[0], Outcome: new(Failure("no"))}}, nil, lease, 0)
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("SettleAndClaim: %v, %v", res, err)
	}
	at("SettleAndClaim: FinishedAt", res[0].Task.FinishedAt, t0)

	pending, err := s.Submit(ctx, TaskRequest{Kind: "other"})
	if err != nil {
		t.Fatal(err)
	}
	canceled, err := s.Cancel(ctx, pending.ID)
	if err != nil {
		t.Fatal(err)
	}
	at("Cancel: FinishedAt", canceled.FinishedAt, t0)

	w, err := s.Wake(ctx, WakeRequest{Payload: []byte(`1`)})
	if err != nil {
		t.Fatal(err)
	}
	at("Wake: CreatedAt", w.CreatedAt, t0)
	wds, err := q.ClaimWakes(ctx, lease, 10)
	if err != nil || len(wds) == 0 {
		t.Fatalf("ClaimWakes: %v, %v", wds, err)
	}
	at("ClaimWakes: LeaseExpiresAt", wds[0].LeaseExpiresAt, t0.Add(lease))
	for _, d := range wds {
		if err := q.AckWake(ctx, d); err != nil {
			t.Fatal(err)
		}
	}

	// Every command's event carries its time: all of them the clock's.
	n := 0
	err = q.ReadLog(ctx, 0, func(ev events.Event) error {
		n++
		if h := ev.Head(); h.At != t0.UnixNano() {
			t.Errorf("event %d (%s) at %v, want the queue's clock's %v", h.Seq, ev.Type(), fromNanos(h.At), t0)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no events")
	}
}

// TestQueueClockDecidesTheBackgroundPruner: the background pruner prunes what finished more
// than Retention before the queue's clock, not the host's. Of two tasks, one finished before
// the clock's now-Retention and one years after it (but long before the host's now): the
// first is pruned, and in the same prune (which runs until nothing older is left) the second
// is not.
func TestQueueClockDecidesTheBackgroundPruner(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	q := newEngineQueue(newMemEngine(), engineapi.Config{Clock: func() time.Time { return t0 },
		Retention: time.Hour, PruneInterval: 5 * time.Millisecond})
	defer q.Close()
	s := q.Session("s")
	finish := func(at time.Time) Task {
		t.Helper()
		task, err := s.SubmitAt(ctx, TaskRequest{Kind: "k"}, at)
		if err != nil {
			t.Fatal(err)
		}
		ds, err := q.ClaimDueAt(ctx, at, time.Minute, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %v, %v", ds, err)
		}
		if _, err := q.FinishAt(ctx, ds[0], Success(nil), at); err != nil {
			t.Fatal(err)
		}
		return task
	}
	// The later task first: a pruner that ran between the two finishes still decides both.
	later := finish(t0.AddDate(10, 0, 0))
	early := finish(t0.Add(-2 * time.Hour))
	deadline := time.Now().Add(time.Minute)
	for {
		_, ok, err := s.Task(ctx, early.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background pruner did not prune the task that finished before the queue's clock's now-Retention")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok, err := s.Task(ctx, later.ID); err != nil || !ok {
		t.Fatalf("the task that finished after the queue's clock's now-Retention: found %v, %v: pruned by another clock", ok, err)
	}
}
