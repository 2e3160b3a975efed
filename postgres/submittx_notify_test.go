package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// TestSubmitTxNotifiesOnlyListeners (issue 45 §3): a SubmitTx notifies the queue's channel
// only while a registered listener holds a listener key (inboxListened). A NOTIFY makes the
// commit take PostgreSQL's one notification lock, which serialised every committing SubmitTx.
func TestSubmitTxNotifiesOnlyListeners(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	v, _ := queues.Load(q)
	e := v.(*engine)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	app, lis := connect(), connect()
	if _, err := lis.Exec(ctx, "LISTEN "+pgx.Identifier{e.channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	commit := func(key string) {
		tx, err := app.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := SubmitTx(ctx, tx, q, "s", work.TaskRequest{Kind: "k", IdempotencyKey: key}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// next is lis's next notification but the writer's (empty payload).
	next := func() string {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for {
			n, err := lis.WaitForNotification(wctx)
			if err != nil {
				t.Fatal(err)
			}
			if n.Payload != "" {
				return n.Payload
			}
		}
	}
	listened := `SELECT ` + strings.ReplaceAll(inboxListened, "{k}", "$1")
	waitFor(t, time.Minute, "the queue's watcher to let its listener keys go (no waiter)", func() bool {
		var held bool
		if err := app.QueryRow(ctx, listened, e.listenKeys.listen).Scan(&held); err != nil {
			t.Fatal(err)
		}
		return !held
	})

	// lis listens without a listener key: SubmitTx does not notify it, but for a try that
	// fails while a writer group of this queue holds its slot's key (inboxListened's comment:
	// a NOTIFY no one needed, seen once in 15 runs at a load of 15). So of ten commits at most
	// two may notify; a SubmitTx that notifies always sends ten. Notifications arrive in
	// commit order, so the marker sent after the commits comes after theirs.
	const commits = 10
	for i := range commits {
		key := ""
		if i%2 == 1 {
			key = fmt.Sprintf("K-%d", i)
		}
		commit(key)
	}
	if _, err := app.Exec(ctx, `SELECT pg_notify($1, 'marker')`, e.channel); err != nil {
		t.Fatal(err)
	}
	unneeded := 0
	for got := next(); got != "marker"; got = next() {
		if unneeded++; unneeded > 2 {
			t.Fatalf("without a registered listener, %d of %d SubmitTx commits notified (last %q) before the marker", unneeded, commits, got)
		}
	}

	// Registered (as a follower: every listener key), lis hears each SubmitTx, keyed or not.
	if _, err := e.registerListener(ctx, lis, false); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", "K2"} {
		commit(key)
		if got := next(); got != inboxPayload {
			t.Fatalf("a registered listener got %q, want %q", got, inboxPayload)
		}
	}
	if ts := sessionTasksOf(t, q, "s"); len(ts) != commits+2 {
		t.Fatalf("session s has %d tasks, want %d", len(ts), commits+2)
	}
}

func sessionTasksOf(t *testing.T, q *work.Queue, session string) []work.Task {
	t.Helper()
	ts, err := q.Session(session).Tasks(context.Background(), work.TaskFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return ts
}
