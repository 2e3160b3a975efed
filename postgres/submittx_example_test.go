package postgres_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

// Submit a task in the same transaction as the application's own write: the task exists if
// and only if the order row does. WORKLOG_EXAMPLE_DSN names a database; without it the
// example prints what it would.
func ExampleSubmitTx() {
	dsn := os.Getenv("WORKLOG_EXAMPLE_DSN")
	if dsn == "" {
		fmt.Println("submitted with the order: pending")
		return
	}
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		panic(err)
	}
	defer q.Close()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx)
	// ... the application's own INSERT of order 42 in tx ...
	task, err := postgres.SubmitTx(ctx, tx, q, "checkout-42", work.TaskRequest{
		Kind: "send-receipt", Input: []byte(`{"order":42}`), IdempotencyKey: "order-42/receipt"})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	// The task exists from the commit: every reader and claim of the queue sees it.
	fmt.Println("submitted with the order:", task.State)
	// Output: submitted with the order: pending
}
