package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// TestRetryGetsMaxAttemptsMore (spec part 3, Session.Retry): a task that exhausted
// MaxAttempts and failed, retried by an operator, gets MaxAttempts more attempts (the
// runner counts only the attempts after Task.AttemptsAtRetry), and Backoff's attempt starts
// at 1 again; the log's attempt numbers go on (4, 5, 6).
func TestRetryGetsMaxAttemptsMore(t *testing.T) {
	q := openQueue(t)
	hooks := newHooks()
	var mu sync.Mutex
	var backoffs []uint32
	start(t, q, runner.Config{Handlers: map[string]runner.Handler{
		"fail": func(context.Context, work.Task) (json.RawMessage, error) { return nil, errors.New("boom") },
	}, Concurrency: 1, LeaseFor: time.Minute, MaxAttempts: 3, Hooks: hooks,
		Backoff: func(attempt uint32, err error) time.Duration {
			mu.Lock()
			backoffs = append(backoffs, attempt)
			mu.Unlock()
			return time.Millisecond
		}})
	task := submit(t, q, "fail", "1")
	run := func() (attempts []uint32, results []runner.Result) {
		for range 3 {
			e := hooks.next(t)
			attempts, results = append(attempts, e.d.Attempt), append(results, e.r.Result)
		}
		return attempts, results
	}
	attempts, results := run()
	if fmt.Sprint(attempts, results) != "[1 2 3] [retried retried failed]" {
		t.Fatalf("first run: attempts %v, results %v", attempts, results)
	}
	if got := read(t, q, task.ID); got.State != work.TaskFailed || got.Attempts != 3 {
		t.Fatalf("after the first run: %s attempts %d", got.State, got.Attempts)
	}
	retried, err := q.Session("s").Retry(context.Background(), task.ID, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if retried.AttemptsAtRetry != 3 {
		t.Fatalf("AttemptsAtRetry %d, want 3", retried.AttemptsAtRetry)
	}
	attempts, results = run()
	if fmt.Sprint(attempts, results) != "[4 5 6] [retried retried failed]" {
		t.Fatalf("after the retry: attempts %v, results %v; want three more attempts", attempts, results)
	}
	if got := read(t, q, task.ID); got.State != work.TaskFailed || got.Attempts != 6 {
		t.Errorf("after the second run: %s attempts %d", got.State, got.Attempts)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(backoffs) != "[1 2 1 2]" {
		t.Errorf("Backoff saw attempts %v, want [1 2 1 2]: it counts from the retry", backoffs)
	}
}
