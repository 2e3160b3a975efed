package runner_test

import (
	"context"
	"encoding/json"
	"errors"
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

// TestStopReturnsWhenPostgresFreezes (issue 27.3): with the server frozen (SIGSTOP of the
// postmaster and every backend) while a result waits to be recorded, Stop with 300 ms
// returns within its context plus StopGrace (twice that if the call ignored its context),
// saying what it could not record; once the server resumes, the result reported recorded is
// there. Before the fix the settle ran under context.Background and Stop waited for the
// server (71 s in the report).
func TestStopReturnsWhenPostgresFreezes(t *testing.T) {
	dsn := pgtest.Schema(t)
	fr := pgtest.NewFreezer(t, dsn) // skips unless this binary started the server
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, _, quick, held, release := startHeld(t, q)
	fr.Freeze()
	close(release) // the held task's result goes to a round the frozen server never answers
	stopCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	took, err := stopWithin(t, r, stopCtx, 300*time.Millisecond+2*runner.StopGrace+20*time.Second)
	var se *runner.StopError
	if !errors.As(err, &se) || se.Unrecorded+btoi(se.Abandoned) == 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop after %v: %v, want a *StopError with the result unrecorded, wrapping the deadline", took, err)
	}
	t.Logf("Stop returned after %v with the server frozen: %v", took, err)
	fr.Thaw()
	closed := make(chan error, 1)
	go func() { closed <- q.Close() }()
	select {
	case <-closed:
	case <-time.After(60 * time.Second):
		t.Fatal("Close has not returned 60 s after the server resumed")
	}
	q2, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	if got := read(t, q2, quick.ID); got.State != work.TaskSucceeded {
		t.Errorf("the quick task, reported recorded, is %s", got.State)
	}
	if got := read(t, q2, held.ID); got.State != work.TaskSucceeded && got.State != work.TaskRunning {
		t.Errorf("the held task is %s, want succeeded or still claimed", got.State)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
