package console

import (
	"strings"
	"testing"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// TestSubmitRejectedShown: a task_submit_rejected event (postgres.SubmitTx of another intent)
// is shown with its key, the differing field and the kind on the log and task pages, and the
// task's story says what happened, not just the type's name.
func TestSubmitRejectedShown(t *testing.T) {
	ev := &events.TaskSubmitRejected{Header: events.Header{Seq: 9, SessionID: "s", At: 1e18},
		TaskID: "t1", IdempotencyKey: "order-7/charge", Field: "input", Kind: "charge_card"}
	if d := details(ev); !strings.Contains(d, "order-7/charge") || !strings.Contains(d, "input") || !strings.Contains(d, "charge_card") {
		t.Errorf("details = %q, want the key, the field and the kind", d)
	}
	task := &projection.Task{ID: "t1", SessionID: "s", State: events.StatePending}
	if r := taskRule(ev, task, task); !strings.Contains(r, "rejected") || !strings.Contains(r, "input") || !strings.Contains(r, "state unchanged") {
		t.Errorf("taskRule = %q, want the rejection explained", r)
	}
}
