package postgres_test

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

const kpWorkerEnv = "WORKLOG_PG_KP_WORKER" // the DSN: this process is a worker of TestKindPolicyMaxRunningProcesses

// TestKindPolicyMaxRunningProcesses: four worker processes claim one kind with MaxRunning 3
// and one with MaxRunningPerSession 2 (leases long enough never to expire during the test);
// folding the log in order, the tasks of the first kind claimed and not yet settled are
// never more than 3, and those of the second never more than 2 of one session.
func TestKindPolicyMaxRunningProcesses(t *testing.T) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const tasks, limit, perSession = 40, 3, 2
	for range tasks {
		if _, err := q.Session("kp").Submit(ctx, work.TaskRequest{Kind: "lim"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range tasks {
		if _, err := q.Session([]string{"s1", "s2"}[i%2]).Submit(ctx, work.TaskRequest{Kind: "per"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.SetKindPolicy(ctx, "lim", work.KindPolicy{MaxRunning: limit}); err != nil {
		t.Fatal(err)
	}
	if err := q.SetKindPolicy(ctx, "per", work.KindPolicy{MaxRunningPerSession: perSession}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKindPolicyWorker$")
		cmd.Env = append(os.Environ(), kpWorkerEnv+"="+dsn)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := cmd.Wait(); err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	wg.Wait()
	held, most, settled := map[string]bool{}, 0, 0
	kindOf, sessionOf := map[string]string{}, map[string]string{}
	perHeld, perMost := map[string]int{}, 0 // of kind per, by session
	err = q.ReadLog(ctx, 1, func(ev events.Event) error {
		switch e := ev.(type) {
		case *events.TaskSubmitted:
			kindOf[e.TaskID], sessionOf[e.TaskID] = e.Kind, e.SessionID
		case *events.TaskClaimed:
			if kindOf[e.TaskID] == "per" {
				perHeld[sessionOf[e.TaskID]]++
				perMost = max(perMost, perHeld[sessionOf[e.TaskID]])
				break
			}
			held[e.TaskID] = true
			most = max(most, len(held))
		case *events.TaskSettled:
			settled++
			if kindOf[e.TaskID] == "per" {
				perHeld[sessionOf[e.TaskID]]--
				break
			}
			delete(held, e.TaskID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if most > limit {
		t.Errorf("the log shows %d tasks of the kind held at once, MaxRunning is %d", most, limit)
	}
	if perMost > perSession {
		t.Errorf("the log shows %d tasks of one session held at once, MaxRunningPerSession is %d", perMost, perSession)
	}
	if most < 2 || perMost < 2 || settled != 2*tasks {
		t.Errorf("at most %d (per session: %d) held at once, %d of %d settled: the workers did not run concurrently to the end",
			most, perMost, settled, 2*tasks)
	}
}

// TestKindPolicyWorker is a worker process of TestKindPolicyMaxRunningProcesses: it claims
// and settles tasks of the kind until none is left.
func TestKindPolicyWorker(t *testing.T) {
	dsn := os.Getenv(kpWorkerEnv)
	if dsn == "" {
		t.Skip("a worker process of TestKindPolicyMaxRunningProcesses")
	}
	ctx := context.Background()
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := q.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Total.Pending == 0 && st.Total.Running == 0 {
			return
		}
		ds, err := q.ClaimKinds(ctx, []string{"lim", "per"}, time.Hour, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		time.Sleep(20 * time.Millisecond) // hold the slots a while
		for _, d := range ds {
			if _, err := q.Finish(ctx, d, work.Success(nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Error("tasks left at the deadline")
}
