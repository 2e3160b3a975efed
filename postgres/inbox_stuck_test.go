package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// The inbox's take-in loop (work/inbox.go) asks InboxPending whether SubmitTx left rows, with
// a context that ends only at Close. On a server that stopped answering with its sockets
// open (every process stopped: SIGSTOP, as a frozen VM or a network that drops every packet
// looks to a client) the check waited forever, and no SubmitTx was taken in again, even once
// the server answered. The check must now end within its bound (readStuckWait, shortened
// here, before the engine is opened: it takes the bound then) with an error, which makes the
// loop ask again, and answer once the server does.
func TestInboxCheckBoundedOnAFrozenServer(t *testing.T) {
	setFor(t, &readStuckWait, time.Second)
	dsn := pgtest.Schema(t)
	fr := pgtest.NewFreezer(t, dsn)
	watchdog := time.AfterFunc(30*time.Second, fr.Thaw) // before the fix: the check hung until here
	defer watchdog.Stop()
	e, q := openEngine(t, dsn, nil)
	ctx := context.Background()
	if _, err := q.Session("s").Submit(ctx, work.TaskRequest{Kind: "before"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.InboxPending(ctx); err != nil {
		t.Fatal(err)
	}
	fr.Freeze()
	took, err := within(t, "the inbox's check on a frozen server", 5*time.Second, func() error {
		_, err := e.InboxPending(ctx)
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the check on a frozen server returned %v after %v; want the end of its bound", err, took)
	}
	fr.Thaw()
	e.stuckWait.Store(int64(15 * time.Second)) // the product's: a new connection is made and prepared
	if _, err := within(t, "the inbox's check after the thaw", 20*time.Second, func() error {
		_, err := e.InboxPending(ctx)
		return err
	}); err != nil {
		t.Fatalf("the check after the server answered again: %v", err)
	}
}
