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
			// The hook never holds the waiter: it may block more often than the test reads
			// (a commit can signal it twice, at its publication and at its sync), and a send
			// that waited for a reader left the waiter stuck in the hook, deaf to a's wake
			// (scripts/stress.sh ./work: hung in run 7 of 20 under load).
			blocked := make(chan struct{}, 1)
			defer work.SetWaitBlocks(func() {
				select {
				case blocked <- struct{}{}:
				default:
				}
			})()
			done := make(chan error, 1)
			go func() { done <- q.WaitSessionWakes(ctx, []string{"a"}) }()
			<-blocked // blocked with no wake of a
			select {
			case <-blocked: // an earlier block's: the next one read must come after b's wake
			default:
			}
			if _, err := q.Session("b").Wake(ctx, work.WakeRequest{}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-blocked: // b's signal taken, a's index read again: nothing, blocked again
			case err := <-done:
				t.Fatalf("the waiter on a returned for b's wake (err %v)", err)
			}
			select {
			case err := <-done:
				t.Fatalf("the waiter on a returned for b's wake (err %v)", err)
			default:
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
