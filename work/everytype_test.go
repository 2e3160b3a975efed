package work_test

import (
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// TestConformanceAppendsEveryType runs the conformance suite on an in-memory queue that
// records the type of every event appended, and fails for a known event type the suite never
// makes a command append: a new type whose decide code (work/engine.go) or conformance tests
// (work/worktest) were forgotten (docs/design.md §8, steps 5 and 6).
func TestConformanceAppendsEveryType(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole conformance suite once more")
	}
	var mu sync.Mutex
	seen := map[events.Type]bool{}
	record := func(ty events.Type) {
		mu.Lock()
		seen[ty] = true
		mu.Unlock()
	}
	t.Run("suite", func(t *testing.T) {
		worktest.Run(t, worktest.Harness{
			New:    func(t *testing.T) *work.Queue { return work.NewRecordingQueue(record) },
			Reopen: func(t *testing.T, q *work.Queue) *work.Queue { return work.New(work.BackendOf(q)) },
		})
	})
	t.Run("undecided inbox rows", func(t *testing.T) {
		// An older build's SubmitTx left rows decided when taken in: another intent under a
		// key taken is a task_submit_rejected (type 16), which nothing else appends.
		q := work.NewRecordingQueue(record)
		defer q.Close()
		r := work.TaskRequest{Kind: "k", Input: []byte(`1`), IdempotencyKey: "a"}
		other := r
		other.Input = []byte(`2`)
		for _, r := range []work.TaskRequest{r, other} {
			if err := work.SubmitTxRecording(q, "s1", r, true); err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			done := seen[events.TypeTaskSubmitRejected]
			mu.Unlock()
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no task_submit_rejected after 30s")
			}
		}
	})
	if t.Failed() {
		return
	}
	for _, ty := range events.AllTypes() {
		if !seen[ty] {
			t.Errorf("no conformance test makes a command append a %s event: add its decide code to work/engine.go and its tests to work/worktest (docs/design.md §8)", ty)
		}
	}
}
