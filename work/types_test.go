package work_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

func TestTaskState(t *testing.T) {
	for _, c := range []struct {
		s        work.TaskState
		name     string
		terminal bool
	}{
		{work.TaskPending, "pending", false},
		{work.TaskRunning, "running", false},
		{work.TaskSucceeded, "succeeded", true},
		{work.TaskFailed, "failed", true},
		{work.TaskCanceled, "canceled", true},
		{work.TaskState(7), "TaskState(7)", false},
		{work.TaskState(-1), "TaskState(-1)", false},
	} {
		if got := c.s.String(); got != c.name {
			t.Errorf("String() = %q, want %q", got, c.name)
		}
		if got := c.s.Terminal(); got != c.terminal {
			t.Errorf("%s.Terminal() = %v, want %v", c.name, got, c.terminal)
		}
	}
}

func TestWakeKindString(t *testing.T) {
	for k, want := range map[work.WakeKind]string{
		work.WakeRequested:    "requested",
		work.WakeTaskFinished: "task_finished",
		work.WakeKind(5):      "WakeKind(5)",
	} {
		if got := k.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

func TestOutcomeConstructors(t *testing.T) {
	out := json.RawMessage(`{"ok":true}`)
	for _, c := range []struct {
		got, want work.Outcome
	}{
		{work.Success(out), work.Outcome{State: work.TaskSucceeded, Output: out}},
		{work.SuccessWithSummary("s", out), work.Outcome{State: work.TaskSucceeded, Summary: "s", Output: out}},
		{work.Failure("boom"), work.Outcome{State: work.TaskFailed, Error: "boom"}},
		{work.Cancellation(), work.Outcome{State: work.TaskCanceled}},
	} {
		if c.got.State != c.want.State || c.got.Summary != c.want.Summary || c.got.Error != c.want.Error ||
			string(c.got.Output) != string(c.want.Output) {
			t.Errorf("got %+v, want %+v", c.got, c.want)
		}
	}
}

func TestPendingTask(t *testing.T) {
	created := time.Unix(100, 0)
	in := json.RawMessage(`{"a":1}`)
	task := work.PendingTask("task_1", "session_1", work.TaskRequest{Kind: "k", Input: in, IdempotencyKey: "key"}, created)
	if task.ID != "task_1" || task.SessionID != "session_1" || task.Kind != "k" || task.IdempotencyKey != "key" ||
		task.State != work.TaskPending || task.Attempts != 0 || task.Outcome != nil ||
		!task.FinishedAt.IsZero() || !task.CancelRequestedAt.IsZero() {
		t.Errorf("PendingTask = %+v", task)
	}
	if !task.ScheduledAt.Equal(created) || !task.CreatedAt.Equal(created) {
		t.Errorf("immediate task scheduled %v created %v, want both %v", task.ScheduledAt, task.CreatedAt, created)
	}
	in[2] = 'b'
	if string(task.Input) != `{"a":1}` {
		t.Errorf("PendingTask keeps the caller's buffer: input now %s", task.Input)
	}

	runAt := time.Unix(500, 0)
	sched := work.PendingTask("task_2", "session_1", work.TaskRequest{Kind: "k", RunAt: runAt}, created)
	if !sched.ScheduledAt.Equal(runAt) {
		t.Errorf("scheduled task ScheduledAt %v, want %v", sched.ScheduledAt, runAt)
	}
	if string(sched.Input) != "null" {
		t.Errorf("nil input = %s, want null", sched.Input)
	}
	// Each null is its own: changing one changes no other.
	sched.Input[0] = 'X'
	again := work.PendingTask("task_3", "session_1", work.TaskRequest{Kind: "k"}, created)
	if string(again.Input) != "null" {
		t.Errorf("a changed null leaked into another task: %s", again.Input)
	}
}

func TestRequestedWake(t *testing.T) {
	w := work.RequestedWake("wake_1", "session_1", work.WakeRequest{IdempotencyKey: "k"}, time.Unix(100, 0))
	if w.ID != "wake_1" || w.SessionID != "session_1" || w.IdempotencyKey != "k" ||
		w.Reason.Kind != work.WakeRequested || string(w.Reason.Payload) != "null" || w.Reason.Outcome != nil {
		t.Errorf("RequestedWake = %+v", w)
	}
}

func TestTaskFinishedWake(t *testing.T) {
	req := work.TaskRequest{Kind: "k"}
	task := work.PendingTask("task_1", "session_1", req, time.Unix(100, 0))
	if _, ok := work.TaskFinishedWake("wake_1", task, time.Unix(101, 0)); ok {
		t.Error("a pending task without an outcome made a completion wake")
	}

	// The seed's check: an outcome that does not match the state makes no wake.
	mismatched := task
	mismatched.State = work.TaskSucceeded
	f := work.Failure("mismatched outcome")
	mismatched.Outcome = &f
	if _, ok := work.TaskFinishedWake("wake_1", mismatched, time.Unix(101, 0)); ok {
		t.Error("a mismatched outcome made a completion wake")
	}
	running := task
	running.State = work.TaskRunning
	s := work.Success(nil)
	s.State = work.TaskRunning
	running.Outcome = &s
	if _, ok := work.TaskFinishedWake("wake_1", running, time.Unix(101, 0)); ok {
		t.Error("a running task made a completion wake")
	}

	done := task
	done.State = work.TaskSucceeded
	o := work.SuccessWithSummary("done", json.RawMessage(`{"n":1}`))
	done.Outcome = &o
	w, ok := work.TaskFinishedWake("wake_1", done, time.Unix(101, 0))
	if !ok {
		t.Fatal("a succeeded task made no completion wake")
	}
	if w.ID != "wake_1" || w.SessionID != "session_1" || w.IdempotencyKey != "" || !w.CreatedAt.Equal(time.Unix(101, 0)) ||
		w.Reason.Kind != work.WakeTaskFinished || w.Reason.TaskID != "task_1" || w.Reason.State != work.TaskSucceeded ||
		w.Reason.Outcome == nil || w.Reason.Outcome.Summary != "done" || string(w.Reason.Outcome.Output) != `{"n":1}` {
		t.Errorf("TaskFinishedWake = %+v", w)
	}
	// The wake holds its own copy of the outcome.
	o.Summary = "changed"
	o.Output[1] = 'X'
	if w.Reason.Outcome.Summary != "done" || string(w.Reason.Outcome.Output) != `{"n":1}` {
		t.Errorf("the wake shares the task's outcome: %+v", w.Reason.Outcome)
	}
}

func TestDeliveriesRedactTheirToken(t *testing.T) {
	const token = "lease_0123456789abcdef"
	task := work.PendingTask("task_1", "session_1", work.TaskRequest{Kind: "k"}, time.Unix(100, 0))
	td := work.NewTaskDelivery(task, 1, time.Unix(130, 0), token)
	wd := work.NewWakeDelivery(work.RequestedWake("wake_1", "session_1", work.WakeRequest{}, time.Unix(100, 0)), 2, time.Unix(130, 0), token)
	if td.LeaseToken() != token || wd.LeaseToken() != token || td.Attempt != 1 || wd.Attempt != 2 {
		t.Fatal("the constructors lost a field")
	}
	type holder struct {
		D work.TaskDelivery
		W work.WakeDelivery
	}
	for _, v := range []any{td, wd, &td, &wd, []work.TaskDelivery{td}, []work.WakeDelivery{wd}, holder{td, wd}, &holder{td, wd}} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
			out := fmt.Sprintf(verb, v)
			if strings.Contains(out, token) || strings.Contains(strings.ToLower(out), fmt.Sprintf("%x", token)) {
				t.Errorf("fmt %s of %T prints the lease token: %s", verb, v, out)
			}
		}
	}
	for _, v := range []any{td, wd} {
		out := fmt.Sprintf("%+v", v)
		if !strings.Contains(out, "[redacted]") || !strings.Contains(out, "Attempt") {
			t.Errorf("%%+v of %T = %s, want the fields with the token redacted", v, out)
		}
	}
	if out := fmt.Sprint(td); !strings.Contains(out, "task_1") {
		t.Errorf("fmt of a delivery = %s, want its task", out)
	}
}
