package postgres_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// waitElected waits until q is elected (leader) or holds a connection to the elected
// process (follower), whichever want says.
func waitElected(t *testing.T, q *work.Queue, leader bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		leading, connected, _, _ := postgres.SharedWriterState(q)
		if leader && leading || !leader && connected {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	leading, connected, _, _ := postgres.SharedWriterState(q)
	t.Fatalf("shared writer not ready after 30 s: leading %v, connected %v (want leader %v)", leading, connected, leader)
}

func openShared(t *testing.T, dsn string) *work.Queue {
	t.Helper()
	q, err := postgres.Open(context.Background(), dsn, &postgres.Options{SharedWriter: true})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestSharedWriterRunsAnotherProcessesRounds: the queue that is not elected sends its rounds
// (SettleAndClaim) to the elected one, whose writer runs them; the answers are the ones a
// local round gives, errors typed and detailed, the claims under the sender's worker name and
// with working lease tokens.
func TestSharedWriterRunsAnotherProcessesRounds(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	leader := openShared(t, dsn)
	defer leader.Close()
	waitElected(t, leader, true)
	follower := openShared(t, dsn)
	defer follower.Close()
	waitElected(t, follower, false)

	s := follower.Session("sw")
	var ids []string
	for i := range 20 {
		task, err := s.Submit(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	wctx := work.WithWorker(ctx, "worker on the follower")
	_, _, fwd0, _ := postgres.SharedWriterState(follower)
	_, _, _, srv0 := postgres.SharedWriterState(leader)
	_, ds, err := follower.SettleAndClaim(wctx, nil, []string{"k"}, time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, _, fwd1, _ := postgres.SharedWriterState(follower)
	_, _, _, srv1 := postgres.SharedWriterState(leader)
	if fwd1 != fwd0+1 || srv1 != srv0+1 {
		t.Fatalf("the round was not run by the elected process: forwarded %d -> %d, served %d -> %d", fwd0, fwd1, srv0, srv1)
	}
	if len(ds) != 10 {
		t.Fatalf("claimed %d, want 10", len(ds))
	}
	for i, d := range ds {
		if d.Task.ID != ids[i] || d.Attempt != 1 || d.Worker != "worker on the follower" || d.LeaseToken() == "" ||
			string(d.Task.Input) != fmt.Sprintf(`{"i":%d}`, i) || d.Task.State != work.TaskRunning {
			t.Fatalf("delivery %d: %+v (worker %q)", i, d.Task, d.Worker)
		}
	}

	// Settles through the elected process: good ones, a stale one (a token this attempt does
	// not hold: ds[1] claimed again is not possible while leased, so a forged delivery of
	// ds[1]'s task from another attempt), an invalid output.
	stale := ds[1]
	stale.Attempt = 7
	settles := []work.Settle{
		{Delivery: ds[0], Outcome: &work.Outcome{State: work.TaskSucceeded, Output: json.RawMessage(`{"ok":true}`)}},
		{Delivery: stale, Outcome: &work.Outcome{State: work.TaskSucceeded}},
		{Delivery: ds[2], Outcome: &work.Outcome{State: work.TaskSucceeded, Output: json.RawMessage(`{not json`)}},
		{Delivery: ds[3], Release: &work.ReleaseRequest{Reason: "later"}},
	}
	for _, d := range ds[4:] {
		o := work.Failure("boom")
		settles = append(settles, work.Settle{Delivery: d, Outcome: &o})
	}
	res, more, err := follower.SettleAndClaim(wctx, settles, []string{"k"}, time.Minute, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(settles) || len(more) != 3 {
		t.Fatalf("%d results for %d settles, %d claims", len(res), len(settles), len(more))
	}
	if res[0].Err != nil || res[0].Task.State != work.TaskSucceeded || string(res[0].Task.Outcome.Output) != `{"ok":true}` {
		t.Fatalf("settle 0: %+v %v", res[0].Task, res[0].Err)
	}
	var we *work.Error
	if !errors.Is(res[1].Err, work.ErrStaleDelivery) || !errors.As(res[1].Err, &we) || we.ID != ds[1].Task.ID {
		t.Fatalf("settle 1: %v, want ErrStaleDelivery naming %s", res[1].Err, ds[1].Task.ID)
	}
	if !errors.Is(res[2].Err, work.ErrInvalidRequest) || !errors.As(res[2].Err, &we) || we.Field != "output" {
		t.Fatalf("settle 2: %v, want ErrInvalidRequest of output", res[2].Err)
	}
	if res[3].Err != nil || res[3].Task.State != work.TaskPending {
		t.Fatalf("settle 3 (release): %+v %v", res[3].Task, res[3].Err)
	}
	for i := 4; i < len(res); i++ {
		if res[i].Err != nil || res[i].Task.State != work.TaskFailed {
			t.Fatalf("settle %d: %+v %v", i, res[i].Task, res[i].Err)
		}
	}
	// The round's own error: an invalid lease.
	if _, _, err := follower.SettleAndClaim(wctx, nil, []string{"k"}, -time.Second, 1); !errors.Is(err, work.ErrInvalidRequest) {
		t.Fatalf("a negative lease: %v", err)
	}
	// The rest through the elected process's own calls, then the follower's, to the end.
	for _, q := range []*work.Queue{leader, follower} {
		for {
			_, ds, err := q.SettleAndClaim(ctx, nil, []string{"k"}, time.Minute, 5)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				if _, err := q.Finish(ctx, d, work.Success(nil)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, d := range append(more, ds[1], ds[2]) {
		if _, err := follower.Finish(ctx, d, work.Success(nil)); err != nil && !errors.Is(err, work.ErrStaleDelivery) {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		task, ok, err := s.Task(ctx, id)
		if err != nil || !ok || task.FinishedAt.IsZero() {
			t.Fatalf("task %s: %+v %v %v", id, task, ok, err)
		}
	}
	if err := follower.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	// A closed queue runs nothing, here or there.
	follower.Close()
	if _, _, err := follower.SettleAndClaim(ctx, nil, nil, time.Minute, 1); !errors.Is(err, work.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

const (
	swRoleEnv = "WORKLOG_PG_SW_LEADER"
	swDSNEnv  = "WORKLOG_PG_SW_DSN"
	swLease   = 2 * time.Second
)

// TestSharedWriterElectedProcessKilled: a process elected to run the others' rounds is
// killed with SIGKILL while this one's runner sends it rounds; this process goes on, runs
// its rounds itself, is elected, and every task ends succeeded.
func TestSharedWriterElectedProcessKilled(t *testing.T) {
	t.Parallel() // see TestMain
	dsn := pgtest.Schema(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSharedWriterLeaderProcess$", "-test.v")
	cmd.Env = append(os.Environ(), swRoleEnv+"=1", swDSNEnv+"="+dsn)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	for lines.Scan() && lines.Text() != "elected" {
	}
	go io.Copy(io.Discard, out)

	q := openShared(t, dsn)
	defer q.Close()
	waitElected(t, q, false)
	runThroughLoss(t, q, func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	})
}

// TestSharedWriterElectedQueueCloses: the elected queue closes while another queue's runner
// sends it rounds; the other goes on and is elected, and every task ends succeeded once.
func TestSharedWriterElectedQueueCloses(t *testing.T) {
	t.Parallel() // see TestMain
	dsn := pgtest.Schema(t)
	leader := openShared(t, dsn)
	defer leader.Close()
	waitElected(t, leader, true)
	q := openShared(t, dsn)
	defer q.Close()
	waitElected(t, q, false)
	runThroughLoss(t, q, func() {
		if err := leader.Close(); err != nil {
			t.Error(err)
		}
	})
}

// runThroughLoss runs 3,000 tasks with a runner on q, which sends its rounds to an elected
// process, and calls lose a quarter of the way: q must be elected in its turn and every task
// end succeeded (run at least once: a round lost with its answer leaves its claims leased
// for swLease), the log agreeing.
func runThroughLoss(t *testing.T, q *work.Queue, lose func()) {
	ctx := context.Background()
	const tasks = 3000
	s := q.Session("sw")
	reqs := make([]work.TaskRequest, 0, work.MaxSubmitMany)
	for i := range tasks {
		reqs = append(reqs, work.TaskRequest{Kind: "k", IdempotencyKey: fmt.Sprint(i)})
		if len(reqs) == cap(reqs) || i == tasks-1 {
			if _, err := s.SubmitMany(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			reqs = reqs[:0]
		}
	}
	var ran atomic.Int64
	var failed lineCount // the runner's log: its rounds that failed (their outcome unknown)
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) {
			time.Sleep(5 * time.Millisecond) // a run of about a second: the kill lands in it
			ran.Add(1)
			return nil, nil
		}},
		Concurrency: 16,
		LeaseFor:    swLease,
		Logger:      slog.New(slog.NewTextHandler(&failed, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	for ran.Load() < tasks/4 {
		time.Sleep(5 * time.Millisecond)
	}
	_, _, fwd, _ := postgres.SharedWriterState(q)
	if fwd == 0 {
		t.Fatal("no round went to the elected process before it was lost")
	}
	lost := time.Now()
	lose()
	waitElected(t, q, true)
	t.Logf("elected %v after the loss; %d rounds had gone to the elected process; %d of %d tasks run then; %d lines of the runner's log",
		time.Since(lost).Round(time.Millisecond), fwd, ran.Load(), tasks, failed.n.Load())
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := q.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Total.Succeeded+st.Total.Failed+st.Total.Canceled == tasks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every task settled 60 s after the loss: %+v", st.Total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range tasks {
		task, err := s.TaskByKey(ctx, fmt.Sprint(i))
		if err != nil || task.State != work.TaskSucceeded {
			t.Fatalf("task %d: %+v %v", i, task, err)
		}
	}
	if n := ran.Load(); n < tasks {
		t.Fatalf("the handler ran %d times for %d tasks", n, tasks)
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

// lineCount counts what is written to it (a slog handler's lines).
type lineCount struct{ n atomic.Int64 }

func (c *lineCount) Write(p []byte) (int, error) {
	c.n.Add(1)
	return len(p), nil
}

// TestSharedWriterLeaderProcess is the elected process of TestSharedWriterElectedProcessKilled:
// it prints "elected" once it is, and serves until it is killed.
func TestSharedWriterLeaderProcess(t *testing.T) {
	if os.Getenv(swRoleEnv) == "" {
		t.Skip("the elected process of TestSharedWriterElectedProcessKilled")
	}
	q := openShared(t, os.Getenv(swDSNEnv))
	defer q.Close()
	waitElected(t, q, true)
	fmt.Println("elected")
	time.Sleep(5 * time.Minute)
}
