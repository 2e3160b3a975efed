package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// TestPostgresSubmitTxRejectionShown: an inbox row an older build's SubmitTx left undecided,
// whose key names a task of another intent, is taken in as a task_submit_rejected event, and
// replay shows it on the PostgreSQL queue: in the log (key and the differing field), its
// JSON, and the story of the task the key names (issue 24 §3: "an audited rejection in the
// log that replay shows"). Today's SubmitTx answers the conflict inside the transaction.
func TestPostgresSubmitTxRejectionShown(t *testing.T) {
	pgtest.Need(t)
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.Schema(t)
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	task, err := q.Session("orders").Submit(ctx, work.TaskRequest{Kind: "charge_card", Input: json.RawMessage(`{"cents":100}`), IdempotencyKey: "order-7/charge"})
	if err != nil {
		t.Fatal(err)
	}
	old, err := events.Encode(&events.TaskSubmitted{Header: events.Header{Seq: 1, SessionID: "orders"}, TaskID: "inbox",
		Kind: "charge_card", Input: json.RawMessage(`{"cents":200}`), IdempotencyKey: "order-7/charge"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO submit_inbox (session, request) VALUES ('orders', $1)`, old); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.SubmitTx(ctx, tx, q, "other", work.TaskRequest{Kind: "k"}); err != nil { // its notification wakes the take-in
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := mustReplay(t, "log", dsn, "--type", "task_submit_rejected")
		if strings.Contains(out, "task_submit_rejected") {
			for _, want := range []string{"task=" + task.ID, "key=order-7/charge", "differs=input", "kind=charge_card"} {
				if !strings.Contains(out, want) {
					t.Errorf("replay log does not show %q:\n%s", want, out)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no task_submit_rejected in replay log after 30 s:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	js := mustReplay(t, "log", dsn, "--json", "--type", "task_submit_rejected")
	ev := map[string]any{}
	_ = json.Unmarshal([]byte(strings.TrimSpace(js)), &ev)
	if ev["event"] != "task_submit_rejected" || ev["task_id"] != task.ID || ev["idempotency_key"] != "order-7/charge" || ev["field"] != "input" {
		t.Errorf("log --json of the rejection: %s", js)
	}
	if story := mustReplay(t, "task", dsn, task.ID); !strings.Contains(story, "task_submit_rejected") {
		t.Errorf("replay task %s does not show the rejection:\n%s", task.ID, story)
	}
}
