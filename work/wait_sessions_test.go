package work_test

import (
	"context"
	"testing"

	"github.com/worklog/worklog/work"
)

// TestWaitSessionWakesIgnoresOtherSessions: a waiter on session a's wakes does not return for
// a wake of session b — it has taken b's signal, looked, and blocked again — and returns for
// a wake of a. In memory and on Pebble; no timing: the waiter says when it blocks.
func TestWaitSessionWakesIgnoresOtherSessions(t *testing.T) {
	for _, c := range []struct {
		name string
		open func(t *testing.T) *work.Queue
	}{
		{"memory", func(*testing.T) *work.Queue { return work.NewInMemory() }},
		{"pebble", func(t *testing.T) *work.Queue {
			q, err := work.Open(t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return q
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			q := c.open(t)
			defer q.Close()
			blocked := make(chan struct{}, 1)
			defer work.SetWaitBlocks(func() { blocked <- struct{}{} })()
			done := make(chan error, 1)
			go func() { done <- q.WaitSessionWakes(ctx, []string{"a"}) }()
			<-blocked // blocked with no wake of a
			if _, err := q.Session("b").Wake(ctx, work.WakeRequest{}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-blocked: // b's signal taken, a's index read again: nothing, blocked again
			case err := <-done:
				t.Fatalf("the waiter on a returned for b's wake (err %v)", err)
			}
			if _, err := q.Session("a").Wake(ctx, work.WakeRequest{}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("WaitSessionWakes after a's wake: %v", err)
			}
		})
	}
}
