package worktest

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// inboxScenarios: submissions made in a backend's own transaction (postgres.SubmitTx),
// answered inside it as Submit answers at the commit (docs/postgres.md "Submit inside the
// application's transaction").
func inboxScenarios() []scenario {
	return []scenario{
		{"submit_tx: answered in the transaction, seen at the commit", func(e *env) {
			if e.h.SubmitTx == nil {
				e.t.Skip("the backend has no SubmitTx (Harness.SubmitTx)")
			}
			s := e.q.Session("s1")
			r := work.TaskRequest{Kind: "k", Input: json.RawMessage(`{"n":1}`), IdempotencyKey: "inbox-1",
				Priority: 7, Headers: map[string]string{"traceparent": "00-a-b-01"}}
			n := e.logLen()
			t, err := e.h.SubmitTx(e.t, e.q, "s1", r, true)
			e.ok("SubmitTx", err)
			if t.ID == "" || t.State != work.TaskPending || t.Kind != "k" || t.Priority != 7 || t.Headers["traceparent"] != "00-a-b-01" {
				e.t.Fatalf("SubmitTx answered %+v, want a new pending task of the request", t)
			}
			// Seen at once: every read after the commit (no waiting).
			got, found, err := s.Task(e.ctx, t.ID)
			e.ok("Task after the commit", err)
			if !found || got.ID != t.ID || !got.CreatedAt.Equal(t.CreatedAt) || !got.ScheduledAt.Equal(t.ScheduledAt) || string(got.Input) != `{"n":1}` {
				e.t.Fatalf("Task after the commit = %+v, SubmitTx answered %+v", got, t)
			}
			byKey, err := s.TaskByKey(e.ctx, "inbox-1")
			e.ok("TaskByKey", err)
			if byKey.ID != t.ID {
				e.t.Fatalf("TaskByKey(inbox-1) = %s, want %s", byKey.ID, t.ID)
			}
			evs := e.appended("a committed SubmitTx, after a read", n, events.TypeTaskSubmitted)
			if id := evs[0].(*events.TaskSubmitted).TaskID; id != t.ID {
				e.t.Fatalf("the log's task %s, SubmitTx answered %s", id, t.ID)
			}
			// The same intent again (other headers too: not part of it): that task, nothing new.
			same := r
			same.Headers = map[string]string{"tenant": "t2"}
			again, err := e.h.SubmitTx(e.t, e.q, "s1", same, true)
			e.ok("SubmitTx of the same intent", err)
			if again.ID != t.ID || again.Priority != 7 || again.Headers["traceparent"] != "00-a-b-01" {
				e.t.Fatalf("SubmitTx of the same intent = %+v, want the task %s as submitted", again, t.ID)
			}
			// A rolled-back one: nothing, ever.
			_, err = e.h.SubmitTx(e.t, e.q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "inbox-gone"}, false)
			e.ok("SubmitTx rolled back", err)
			// Another intent: the conflict, inside the transaction, naming the field.
			other := r
			other.Input = json.RawMessage(`{"n":2}`)
			_, err = e.h.SubmitTx(e.t, e.q, "s1", other, true)
			if d := e.wantErr("SubmitTx of another input", err, work.ErrIdempotencyConflict); d.Field != "input" || d.ID != t.ID {
				e.t.Fatalf("conflict %+v, want field input naming %s", d, t.ID)
			}
			prio := r
			prio.Priority = 8
			_, err = e.h.SubmitTx(e.t, e.q, "s1", prio, true)
			if d := e.wantErr("SubmitTx of another priority", err, work.ErrIdempotencyConflict); d.Field != "priority" {
				e.t.Fatalf("conflict %+v, want field priority", d)
			}
			sub, err := s.Submit(e.ctx, r)
			e.ok("Submit of the SubmitTx's request", err)
			if sub.ID != t.ID {
				e.t.Fatalf("Submit of the same request = %s, want the SubmitTx's task %s", sub.ID, t.ID)
			}
			if _, err := s.TaskByKey(e.ctx, "inbox-gone"); !errors.Is(err, work.ErrTaskNotFound) {
				e.t.Fatalf("TaskByKey of the rolled-back submission: %v, want ErrTaskNotFound", err)
			}
			// A key Submit stored: SubmitTx answers with its task, or the conflict.
			first, err := s.Submit(e.ctx, work.TaskRequest{Kind: "k", IdempotencyKey: "by-submit"})
			e.ok("Submit", err)
			viaTx, err := e.h.SubmitTx(e.t, e.q, "s1", work.TaskRequest{Kind: "k", IdempotencyKey: "by-submit"}, true)
			e.ok("SubmitTx of Submit's key", err)
			if viaTx.ID != first.ID {
				e.t.Fatalf("SubmitTx of Submit's key = %s, want %s", viaTx.ID, first.ID)
			}
			_, err = e.h.SubmitTx(e.t, e.q, "s1", work.TaskRequest{Kind: "k2", IdempotencyKey: "by-submit"}, true)
			if d := e.wantErr("SubmitTx of another kind under Submit's key", err, work.ErrIdempotencyConflict); d.Field != "kind" {
				e.t.Fatalf("conflict %+v, want field kind", d)
			}
			// Without a key: a new task each time.
			a, err := e.h.SubmitTx(e.t, e.q, "s1", work.TaskRequest{Kind: "nokey"}, true)
			e.ok("SubmitTx without a key", err)
			b, err := e.h.SubmitTx(e.t, e.q, "s1", work.TaskRequest{Kind: "nokey"}, true)
			e.ok("SubmitTx without a key", err)
			if a.ID == b.ID {
				e.t.Fatalf("two keyless SubmitTx answered one task %s", a.ID)
			}
			ts, err := s.Tasks(e.ctx, work.TaskFilter{Limit: 10})
			e.ok("Tasks", err)
			if len(ts) != 4 {
				e.t.Fatalf("%d tasks, want 4 (the SubmitTx's, Submit's, two without a key)", len(ts))
			}
			st, err := e.q.Stats(e.ctx)
			e.ok("Stats", err)
			if st.Total.Pending != 4 {
				e.t.Fatalf("Stats: %d pending tasks, want 4", st.Total.Pending)
			}
			// Claimed, in submission order.
			ds, err := e.q.ClaimDue(e.ctx, time.Minute, 10)
			e.ok("ClaimDue", err)
			var order []string
			for _, d := range ds {
				order = append(order, d.Task.ID)
			}
			if len(order) != 4 || order[0] != t.ID || order[1] != first.ID || order[2] != a.ID || order[3] != b.ID {
				e.t.Fatalf("claimed %v, want %v", order, []string{t.ID, first.ID, a.ID, b.ID})
			}
		}},
	}
}
