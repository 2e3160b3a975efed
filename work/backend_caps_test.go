package work_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// forwarding is a custom Backend (not worklog's own type) that implements every optional
// capability by forwarding to the backend of a real queue, as a decorator (metrics,
// tracing) would: New must find each capability on it, not only on worklog's own type.
type forwarding struct {
	work.Backend // the Backend methods
	inner        work.Backend
	clock        time.Time
}

func (f *forwarding) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return f.inner.(work.LogReader).ReadLog(ctx, from, fn)
}
func (f *forwarding) Follow(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return f.inner.(work.Follower).Follow(ctx, from, fn)
}
func (f *forwarding) Verify(ctx context.Context) error { return f.inner.(work.Verifier).Verify(ctx) }
func (f *forwarding) Prune(ctx context.Context, before time.Time) (work.PruneResult, error) {
	return f.inner.(work.Pruner).Prune(ctx, before)
}
func (f *forwarding) WaitTasks(ctx context.Context, kinds []string) error {
	return f.inner.(work.Waiter).WaitTasks(ctx, kinds)
}
func (f *forwarding) WaitWakes(ctx context.Context) error {
	return f.inner.(work.Waiter).WaitWakes(ctx)
}
func (f *forwarding) Checkpoint(dir string) error { return f.inner.(work.Checkpointer).Checkpoint(dir) }
func (f *forwarding) Now() time.Time              { return f.clock }

var _ interface {
	work.LogReader
	work.Follower
	work.Verifier
	work.Pruner
	work.Waiter
	work.Checkpointer
	work.Clock
} = (*forwarding)(nil)

// TestNewGetsEveryCapabilityOfItsBackend (issue 20, spec part 3 "Part 1's seed seam stays"):
// a queue built with New(b) uses every optional capability b implements: the log, Verify,
// Prune, waiting, Checkpoint and b's clock. worklog's own backend implements them all, so
// New(work.BackendOf(q)) is a full queue too.
func TestNewGetsEveryCapabilityOfItsBackend(t *testing.T) {
	ctx := context.Background()
	base, err := work.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	t0 := time.Date(2003, 4, 5, 6, 7, 8, 0, time.UTC)
	for _, c := range []struct {
		name string
		q    *work.Queue
	}{
		{"custom", work.New(&forwarding{Backend: work.BackendOf(base), inner: work.BackendOf(base), clock: t0})},
		{"own", work.New(work.BackendOf(base))},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := c.q // not closed: it shares base's backend, which base closes
			tk, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"})
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "custom" && !tk.CreatedAt.Equal(t0) {
				t.Errorf("Submit at %v, want the backend's clock's %v", tk.CreatedAt, t0)
			}
			if err := q.WaitTasks(ctx, nil); err != nil { // a task is due: at once
				t.Errorf("WaitTasks: %v", err)
			}
			n := 0
			if err := q.ReadLog(ctx, 0, func(events.Event) error { n++; return nil }); err != nil || n == 0 {
				t.Errorf("ReadLog: %d events, %v", n, err)
			}
			stop := errors.New("stop")
			if err := q.Follow(ctx, 0, func(events.Event) error { return stop }); err != stop {
				t.Errorf("Follow: %v, want the callback's error", err)
			}
			if err := q.Verify(ctx); err != nil {
				t.Errorf("Verify: %v", err)
			}
			ds, err := q.ClaimDueAt(ctx, tk.CreatedAt, time.Minute, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("claim: %v, %v", ds, err)
			}
			if _, err := q.FinishAt(ctx, ds[0], work.Success(nil), tk.CreatedAt); err != nil {
				t.Fatal(err)
			}
			res, err := q.Prune(ctx, tk.CreatedAt.Add(time.Second))
			if err != nil || res.Tasks < 1 {
				t.Errorf("Prune: %+v, %v; want the finished task pruned", res, err)
			}
			if err := q.Checkpoint(filepath.Join(t.TempDir(), "copy")); err != nil {
				t.Errorf("Checkpoint: %v", err)
			}
		})
	}
}

// TestNewNamesTheMissingCapability: on a Backend that implements none of the optional
// interfaces, each call that needs one is an ErrBackend error naming it, never a no-op.
func TestNewNamesTheMissingCapability(t *testing.T) {
	ctx := context.Background()
	q := work.New(&spyBackend{})
	calls := []struct {
		capability string
		call       func() error
	}{
		{"work.LogReader", func() error { return q.ReadLog(ctx, 0, func(events.Event) error { return nil }) }},
		{"work.Follower", func() error { return q.Follow(ctx, 0, func(events.Event) error { return nil }) }},
		{"work.Verifier", func() error { return q.Verify(ctx) }},
		{"work.Pruner", func() error { _, err := q.Prune(ctx, now); return err }},
		{"work.Waiter", func() error { return q.WaitTasks(ctx, nil) }},
		{"work.Waiter", func() error { return q.WaitWakes(ctx) }},
		{"work.Checkpointer", func() error { return q.Checkpoint(t.TempDir() + "/copy") }},
		{"work.RunningBackend", func() error { _, err := q.Stats(ctx); return err }},
		{"work.SessionBackend", func() error { _, err := q.Session("s").TaskByKey(ctx, "k"); return err }},
		{"work.SessionBackend", func() error { _, err := q.Session("s").RetryAt(ctx, "t", now, now); return err }},
		{"work.KindPolicyBackend", func() error { return q.SetKindPolicy(ctx, "k", work.KindPolicy{Paused: true}) }},
		{"work.KindPolicyBackend", func() error { _, err := q.KindPolicies(ctx); return err }},
		{"work.ScheduleBackend", func() error {
			return q.Session("s").SetSchedule(ctx, work.Schedule{Name: "n", Cron: "@every 1m", Task: work.TaskRequest{Kind: "k"}})
		}},
		{"work.ScheduleBackend", func() error { return q.Session("s").RemoveSchedule(ctx, "n") }},
		{"work.ScheduleBackend", func() error { _, err := q.Session("s").Schedules(ctx); return err }},
		{"work.SessionWakeClaimer", func() error {
			_, err := q.ClaimSessionWakes(work.WithWorker(ctx, "w"), []string{"s"}, time.Second, 1)
			return err
		}},
		{"work.SessionWakeWaiter", func() error { return q.WaitSessionWakes(ctx, []string{"s"}) }},
		{"work.RunningBackend", func() error {
			_, err := q.ClaimKinds(work.WithWorker(ctx, "w"), []string{"k"}, time.Second, 1)
			return err
		}},
	}
	for _, c := range calls {
		err := c.call()
		if !errors.Is(err, work.ErrBackend) || !strings.Contains(err.Error(), c.capability) {
			t.Errorf("%s: %v, want an ErrBackend error naming %s", c.capability, err, c.capability)
		}
	}
}
