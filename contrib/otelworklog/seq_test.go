package otelworklog_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// TestProcessSpanCarriesTheSettleSeq (issue 45 §4): the process span of a recorded result
// has worklog.event.seq, the seq of the task_settled event that recorded it, found in the
// log at that seq; a span whose result recorded nothing (a lost lease) has none.
func TestProcessSpanCarriesTheSettleSeq(t *testing.T) {
	s := newSetup(t, 0)
	q, err := work.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	task, err := s.inst.Submit(context.Background(), q.Session("s"), work.TaskRequest{Kind: "resize", Input: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	runTasks(t, q, s, 1, map[string]runner.Handler{"resize": func(context.Context, work.Task) (json.RawMessage, error) {
		return json.RawMessage(`"ok"`), nil
	}})
	proc := spanNamed(t, s.spans.Ended(), "process resize")
	got, ok := attrMap(proc.Attributes())["worklog.event.seq"]
	if !ok {
		t.Fatalf("process span has no worklog.event.seq: %v", attrMap(proc.Attributes()))
	}
	seq, err := strconv.ParseUint(got, 10, 64)
	if err != nil || seq == 0 {
		t.Fatalf("worklog.event.seq = %q", got)
	}
	var ev events.Event
	errFound := errors.New("found")
	if err := q.ReadLog(context.Background(), seq, func(e events.Event) error { ev = e; return errFound }); !errors.Is(err, errFound) {
		t.Fatalf("ReadLog(%d): %v", seq, err)
	}
	if id, _ := ev.Subject(); ev.Head().Seq != seq || ev.Type() != events.TypeTaskSettled || id != task.ID {
		t.Errorf("the event at worklog.event.seq %d is %s of %s (seq %d), want task_settled of %s", seq, ev.Type(), id, ev.Head().Seq, task.ID)
	}

	// Nothing recorded: no attribute.
	h := s.inst.Hooks()
	d := work.NewTaskDelivery(work.Task{ID: "task_lost", Kind: "lost", SessionID: "s"}, 1, proc.EndTime(), "token")
	h.TaskEnd(h.TaskStart(context.Background(), d), d, runner.TaskResult{Result: runner.LeaseLost, Err: runner.ErrLeaseLost})
	lost := spanNamed(t, s.spans.Ended(), "process lost")
	if got, ok := attrMap(lost.Attributes())["worklog.event.seq"]; ok {
		t.Errorf("a lost lease's span has worklog.event.seq %q, want none", got)
	}
}
