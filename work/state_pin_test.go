package work_test

import (
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// TestTaskStateNumbersPinned: work.TaskState (the API's) and events.TaskState (the wire's,
// which the projection folds) are converted by number (work/engine.go: TaskState(t.State),
// events.TaskState(o.State)). This pins the two enumerations to each other, state by state:
// same number, same name, same terminality, and no state on one side only. Renumbering
// either, or adding a state to one, fails here, not as a task reported in the wrong state.
func TestTaskStateNumbersPinned(t *testing.T) {
	pairs := []struct {
		api  work.TaskState
		wire events.TaskState
	}{
		{work.TaskPending, events.StatePending},
		{work.TaskRunning, events.StateRunning},
		{work.TaskSucceeded, events.StateSucceeded},
		{work.TaskFailed, events.StateFailed},
		{work.TaskCanceled, events.StateCanceled},
	}
	for _, p := range pairs {
		if int(p.api) != int(p.wire) {
			t.Errorf("%v is %d in work, %v is %d on the wire", p.api, int(p.api), p.wire, int(p.wire))
		}
		if p.api.String() != p.wire.String() {
			t.Errorf("state %d is %q in work, %q on the wire", int(p.api), p.api, p.wire)
		}
		if p.api.Terminal() != p.wire.Terminal() {
			t.Errorf("%v: terminal %v in work, %v on the wire", p.api, p.api.Terminal(), p.wire.Terminal())
		}
	}
	// No state beyond the last pair on either side: the next number has no name on both.
	next := len(pairs)
	if s := work.TaskState(next).String(); s != "TaskState(5)" {
		t.Errorf("work.TaskState(%d) is %q: a state work has and the wire does not", next, s)
	}
	if s := events.TaskState(next).String(); s != "state(5)" {
		t.Errorf("events.TaskState(%d) is %q: a state the wire has and work does not", next, s)
	}
}
