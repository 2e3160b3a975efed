package runner_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// crashHelperEnv names the store directory of the child process TestSIGKILL starts.
const crashHelperEnv = "WORKLOG_RUNNER_CRASH_DIR"

// crashHandlers are the handlers of TestSIGKILL, in the child and after the restart: "ok"
// succeeds, "perm" fails permanently, "flaky" fails its first attempt; each takes a few
// milliseconds so that the kill lands while some run. onStart is told each task id.
func crashHandlers(onStart func(id string)) map[string]runner.Handler {
	run := func(f func(t work.Task) (json.RawMessage, error)) runner.Handler {
		return func(ctx context.Context, t work.Task) (json.RawMessage, error) {
			onStart(t.ID)
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return f(t)
		}
	}
	return map[string]runner.Handler{
		"ok": run(func(t work.Task) (json.RawMessage, error) { return t.Input, nil }),
		"perm": run(func(work.Task) (json.RawMessage, error) {
			return nil, runner.Permanent(errors.New("refused"))
		}),
		"flaky": run(func(t work.Task) (json.RawMessage, error) {
			if t.Attempts == 1 {
				return nil, errors.New("first attempt fails")
			}
			return json.RawMessage(`"retried"`), nil
		}),
	}
}

func crashConfig(h map[string]runner.Handler, hooks runner.Hooks) runner.Config {
	// A short lease: the tasks the killed child held are claimable again soon after.
	return runner.Config{Handlers: h, Concurrency: 4, LeaseFor: 300 * time.Millisecond,
		Backoff: func(uint32, error) time.Duration { return 0 }, Logger: quiet, Hooks: hooks}
}

// TestCrashHelperProcess is the child of TestSIGKILL: a runner on the store in
// $WORKLOG_RUNNER_CRASH_DIR that prints "start <id>" as each handler starts, until killed.
func TestCrashHelperProcess(t *testing.T) {
	dir := os.Getenv(crashHelperEnv)
	if dir == "" {
		t.Skip("the child of TestSIGKILL")
	}
	q, err := work.Open(dir, nil)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	r, err := runner.New(q, crashConfig(crashHandlers(func(id string) { fmt.Println("start", id) }), nil))
	if err != nil {
		fmt.Println("runner:", err)
		os.Exit(2)
	}
	if err := r.Start(); err != nil {
		fmt.Println("start:", err)
		os.Exit(2)
	}
	select {} // until SIGKILL
}

// TestSIGKILL kills (SIGKILL) a process running a runner on a durable store while it works,
// restarts a runner on the store, and checks that every task was settled exactly once, with
// the outcome its kind calls for, and that the store verifies.
func TestSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	ctx := context.Background()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{} // task id -> kind
	s := q.Session("s")
	for i := range 60 {
		kind := []string{"ok", "ok", "ok", "perm", "flaky"}[i%5]
		task, err := s.Submit(ctx, work.TaskRequest{Kind: kind, Input: json.RawMessage(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		kinds[task.ID] = kind
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashHelperEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	started := 0
	for started < 20 && lines.Scan() {
		if strings.HasPrefix(lines.Text(), "start ") {
			started++
		} else {
			t.Logf("child: %s", lines.Text())
		}
	}
	if started < 20 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the child started %d handlers before its output ended", started)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	q, err = work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	settledBefore := 0
	for id := range kinds {
		if read(t, q, id).State.Terminal() {
			settledBefore++
		}
	}
	if settledBefore == len(kinds) {
		t.Fatal("the child settled every task before it was killed: the test proves nothing")
	}
	t.Logf("killed after %d handler starts, %d of %d tasks settled", started, settledBefore, len(kinds))

	hooks := newHooks()
	start(t, q, crashConfig(crashHandlers(func(string) {}), hooks))
	deadline := time.After(20 * time.Second)
	for {
		done := 0
		for id := range kinds {
			if read(t, q, id).State.Terminal() {
				done++
			}
		}
		if done == len(kinds) {
			break
		}
		select {
		case <-hooks.tasks:
		case <-deadline:
			t.Fatalf("%d of %d tasks settled after the restart", done, len(kinds))
		}
	}

	want := map[string]work.TaskState{"ok": work.TaskSucceeded, "perm": work.TaskFailed, "flaky": work.TaskSucceeded}
	for id, kind := range kinds {
		task := read(t, q, id)
		if task.State != want[kind] {
			t.Errorf("%s task %s: %s, want %s", kind, id, task.State, want[kind])
		}
		if kind == "flaky" && string(task.Outcome.Output) != `"retried"` {
			t.Errorf("flaky task %s: output %s", id, task.Outcome.Output)
		}
	}
	settles := map[string]int{}
	err = q.ReadLog(ctx, 0, func(ev events.Event) error {
		if ev.Type() == events.TypeTaskSettled {
			id, _ := ev.Subject()
			settles[id]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for id := range kinds {
		if settles[id] != 1 {
			t.Errorf("task %s settled %d times, want exactly once", id, settles[id])
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}
