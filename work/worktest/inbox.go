package worktest

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// inboxScenarios: submissions committed in a backend's own transaction (postgres.SubmitTx)
// and taken in by the queue in the background with Submit's rules (docs/design.md §9).
func inboxScenarios() []scenario {
	return []scenario{
		{"inbox: committed, repeated, rejected, rolled back", func(e *env) {
			if e.h.SubmitTx == nil {
				e.t.Skip("the backend has no inbox (Harness.SubmitTx)")
			}
			s := e.q.Session("s1")
			r := work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "inbox-1",
				Priority: 7, Headers: map[string]string{"traceparent": "00-a-b-01"}}
			n := e.logLen()
			e.h.SubmitTx(e.t, e.q, "s1", r, true)
			e.awaitLog(n + 1)
			evs := e.appended("a committed inbox submission", n, events.TypeTaskSubmitted)
			id := evs[0].(*events.TaskSubmitted).TaskID
			// The same intent again: nothing new (Submit answers with the same task).
			e.h.SubmitTx(e.t, e.q, "s1", r, true)
			// A rolled-back one: nothing, ever.
			e.h.SubmitTx(e.t, e.q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "inbox-gone"}, false)
			// Another intent: an audited rejection naming the field and the task.
			other := r
			other.Input = json.RawMessage(`{"n":2}`)
			e.h.SubmitTx(e.t, e.q, "s1", other, true)
			e.awaitLog(n + 2)
			evs = e.appended("the inbox submissions after the first", n+1, events.TypeTaskSubmitRejected)
			rej := evs[0].(*events.TaskSubmitRejected)
			if rej.TaskID != id || rej.Field != "input" || rej.IdempotencyKey != "inbox-1" || rej.Kind != "k" || rej.SessionID != "s1" {
				e.t.Fatalf("rejection %+v, want task %s, field input, key inbox-1", rej, id)
			}
			// Other headers only: the same intent (headers are not part of it), nothing new.
			// Another priority: a rejection naming priority, after it (rows are taken in
			// commit order here: one queue, one committer).
			sameIntent := r
			sameIntent.Headers = map[string]string{"tenant": "t2"}
			e.h.SubmitTx(e.t, e.q, "s1", sameIntent, true)
			prio := r
			prio.Priority = 8
			e.h.SubmitTx(e.t, e.q, "s1", prio, true)
			e.awaitLog(n + 3)
			evs = e.appended("the inbox submission of another priority", n+2, events.TypeTaskSubmitRejected)
			if rej := evs[0].(*events.TaskSubmitRejected); rej.TaskID != id || rej.Field != "priority" {
				e.t.Fatalf("rejection %+v, want task %s, field priority", rej, id)
			}
			t, err := s.Submit(e.ctx, r)
			e.ok("Submit of the inbox request", err)
			if t.ID != id {
				e.t.Fatalf("Submit of the same request = %s, want the inbox's task %s", t.ID, id)
			}
			// The task carries what the inbox row carried: priority and headers too.
			if t.Priority != 7 || t.Headers["traceparent"] != "00-a-b-01" || len(t.Headers) != 1 {
				e.t.Fatalf("the inbox's task has priority %d and headers %v, want 7 and the submission's", t.Priority, t.Headers)
			}
			byKey, err := s.TaskByKey(e.ctx, "inbox-1")
			e.ok("TaskByKey", err)
			if byKey.ID != id {
				e.t.Fatalf("TaskByKey(inbox-1) = %s, want %s", byKey.ID, id)
			}
			if _, err := s.TaskByKey(e.ctx, "inbox-gone"); !errors.Is(err, work.ErrTaskNotFound) {
				e.t.Fatalf("TaskByKey of the rolled-back submission: %v, want ErrTaskNotFound", err)
			}
			ts, err := s.Tasks(e.ctx, work.TaskFilter{Limit: 10})
			e.ok("Tasks", err)
			if len(ts) != 1 {
				e.t.Fatalf("%d tasks, want 1", len(ts))
			}
		}},
	}
}

// awaitLog waits until the log holds at least n events (the inbox is taken in in the
// background).
func (e *env) awaitLog(n int) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.logLen() < n {
		if time.Now().After(deadline) {
			e.t.Fatalf("the log holds %d events after 30s, want %d", e.logLen(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
