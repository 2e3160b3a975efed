package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// Each worker process of a queue opens it with SharedWriter: they elect one whose writer runs
// every process's runner rounds, instead of taking turns on the log head. Run the same
// program in several processes; nothing else changes. WORKLOG_EXAMPLE_DSN names a database;
// without it the example prints what it would.
func ExampleOptions_sharedWriter() {
	dsn := os.Getenv("WORKLOG_EXAMPLE_DSN")
	if dsn == "" {
		fmt.Println("worker stopped")
		return
	}
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, &postgres.Options{
		SharedWriter: true,
		// Processes on several hosts: an address of this host the others can dial.
		// SharedWriterAddr: "10.0.0.7:7433",
	})
	if err != nil {
		panic(err)
	}
	defer q.Close()
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{
			"send-receipt": func(ctx context.Context, t work.Task) (json.RawMessage, error) {
				return json.RawMessage(`{"sent":true}`), nil
			},
		},
		Concurrency: 16,
		LeaseFor:    time.Minute,
	})
	if err != nil {
		panic(err)
	}
	if err := r.Start(); err != nil {
		panic(err)
	}
	time.Sleep(time.Second) // ... until the process is told to stop ...
	if err := r.Stop(ctx); err != nil {
		panic(err)
	}
	fmt.Println("worker stopped")
	// Output: worker stopped
}
