package runner_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// TestMain gives the PostgreSQL test a throwaway server (skipped, with one line, without
// PostgreSQL's binaries); the SIGKILL test's child reuses it through the environment.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, "runner")) }

// TestIdleRunnerWokenByAnotherProcess: on PostgreSQL, a runner idle in WaitTasks on one
// queue starts a task another queue (another process, as far as the engine knows) submits:
// the engine's Watcher delivers the other commit, and nothing polls.
func TestIdleRunnerWokenByAnotherProcess(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	a, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	started := make(chan string, 1)
	start(t, a, runner.Config{Handlers: map[string]runner.Handler{"k": func(_ context.Context, task work.Task) (json.RawMessage, error) {
		started <- task.ID
		return nil, nil
	}}, Concurrency: 1, LeaseFor: time.Minute})
	time.Sleep(50 * time.Millisecond) // the runner found nothing and waits
	task, err := b.Session("s").Submit(ctx, work.TaskRequest{Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-started:
		if id != task.ID {
			t.Fatalf("started %s, want %s", id, task.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a runner on another queue of the same database never started the task")
	}
}
