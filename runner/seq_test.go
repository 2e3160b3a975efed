package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// eventAt reads the log's event at seq.
func eventAt(t *testing.T, q *work.Queue, seq uint64) events.Event {
	t.Helper()
	var got events.Event
	errFound := errors.New("found")
	err := q.ReadLog(context.Background(), seq, func(ev events.Event) error {
		got = ev
		return errFound
	})
	if !errors.Is(err, errFound) || got.Head().Seq != seq {
		t.Fatalf("ReadLog(%d): %v, event %v", seq, err, got)
	}
	return got
}

// TestTaskEndSeqIsTheSettleEvent: TaskResult.Seq is the seq of the log event that recorded
// the result: a retry's task_released, then the success's task_settled, each of the attempt
// the hook was told about.
func TestTaskEndSeqIsTheSettleEvent(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{
		"flaky": func(_ context.Context, task work.Task) (json.RawMessage, error) {
			if task.Attempts < 2 {
				return nil, errors.New("not yet")
			}
			return json.RawMessage(`"ok"`), nil
		},
	}, Concurrency: 1, LeaseFor: time.Minute, MaxAttempts: 3, Hooks: hooks,
		Backoff: func(uint32, error) time.Duration { return time.Millisecond }})
	task := submit(t, q, "flaky", "1")
	for _, want := range []struct {
		result runner.Result
		typ    events.Type
	}{{runner.Retried, events.TypeTaskReleased}, {runner.Succeeded, events.TypeTaskSettled}} {
		e := hooks.next(t)
		if e.r.Result != want.result || e.r.SettleErr != nil {
			t.Fatalf("attempt %d: %s (settle error %v), want %s", e.d.Attempt, e.r.Result, e.r.SettleErr, want.result)
		}
		if e.r.Seq == 0 {
			t.Fatalf("attempt %d (%s): TaskResult.Seq is 0, want the seq of its %s", e.d.Attempt, e.r.Result, want.typ)
		}
		ev := eventAt(t, q, e.r.Seq)
		var attempt uint32
		switch ev := ev.(type) {
		case *events.TaskReleased:
			attempt = ev.Attempt
		case *events.TaskSettled:
			attempt = ev.Attempt
		}
		if id, _ := ev.Subject(); ev.Type() != want.typ || id != task.ID || attempt != e.d.Attempt {
			t.Errorf("attempt %d (%s): the event at Seq %d is %s of %s attempt %d, want %s of %s attempt %d",
				e.d.Attempt, e.r.Result, e.r.Seq, ev.Type(), id, attempt, want.typ, task.ID, e.d.Attempt)
		}
	}
}
