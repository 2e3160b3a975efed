package postgres

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/internal/pgtest"
)

// A command whose closure fails inside a group does not fail the others: the group is
// discarded and each command runs again alone; the failing one's events are not kept.
func TestFailingCommandDoesNotFailItsGroup(t *testing.T) {
	e, q := openEngine(t, pgtest.Schema(t), nil)
	ctx := context.Background()
	hold, held := make(chan struct{}), make(chan struct{})
	go e.Update(ctx, func(engineapi.Txn) error { close(held); <-hold; return nil })
	<-held // the writer runs the holding command; the next ones queue up as one group

	const n = 6
	boom := errors.New("boom")
	var runs [n]atomic.Int32
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.Update(ctx, func(tx engineapi.Txn) error {
				runs[i].Add(1)
				ev := &events.TaskSubmitted{Header: events.Header{SessionID: "s", At: 1},
					TaskID: fmt.Sprintf("task_%d", i), Kind: "k", Input: []byte("null")}
				if err := tx.Append(ev); err != nil {
					return err
				}
				if i == 2 {
					return boom // after appending: its event must not be kept
				}
				return nil
			})
		}()
	}
	for len(e.cmds) < n {
		runtime.Gosched() // until all are queued behind the holding command
	}
	close(hold)
	wg.Wait()
	for i, err := range errs {
		switch {
		case i == 2 && !errors.Is(err, boom):
			t.Errorf("the failing command: %v, want its own error", err)
		case i != 2 && err != nil:
			t.Errorf("command %d: %v", i, err)
		}
		// Those before the failing one in the group ran there and again alone; those after it
		// ran alone only.
		if r := runs[i].Load(); i != 2 && (r < 1 || r > 2) {
			t.Errorf("command %d ran %d times, want once or twice", i, r)
		}
	}
	var ids []string
	q.ReadLog(ctx, 0, func(ev events.Event) error {
		ids = append(ids, ev.(*events.TaskSubmitted).TaskID)
		return nil
	})
	if len(ids) != n-1 {
		t.Errorf("log holds %v, want the %d commands that did not fail", ids, n-1)
	}
	for _, id := range ids {
		if id == "task_2" {
			t.Error("the failing command's event was kept")
		}
	}
	mustVerify(t, q)
}
