package postgres_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

const (
	mpRoleEnv   = "WORKLOG_PG_MP_WORKER" // "normal" or "late": this process is a worker
	mpDSNEnv    = "WORKLOG_PG_MP_DSN"
	mpSharedEnv = "WORKLOG_PG_MP_SHARED" // set: the worker opens the queue with SharedWriter
	mpLease     = 300 * time.Millisecond
)

// TestMultiProcess runs worker processes on one queue: some finish at once, the late ones
// sleep past their lease on their first deliveries, so that another process re-claims those
// tasks and the late finish must be fenced. No (task, attempt) is delivered twice, every
// task is settled exactly once (by the delivery of its last attempt), and the log agrees.
func TestMultiProcess(t *testing.T) { multiProcess(t, false) }

// TestMultiProcessSharedWriter is TestMultiProcess with every worker opened with
// Options.SharedWriter: the workers that are not elected send their claims and finishes to
// the one that is, whose writer fences the late finishes for them.
func TestMultiProcessSharedWriter(t *testing.T) { multiProcess(t, true) }

func multiProcess(t *testing.T, shared bool) {
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	q := openQueue(t, dsn)
	const tasks = 80
	ids := map[string]bool{}
	for i := 0; i < tasks; i++ {
		task, err := q.Session("mp").Submit(ctx, work.TaskRequest{Kind: "mp"})
		if err != nil {
			t.Fatal(err)
		}
		ids[task.ID] = true
	}

	// The late workers start first, and the normal ones only once each late worker has
	// claimed: under load the normal workers could otherwise drain every task before a late
	// one claims any, and nothing would be left to fence.
	roles := []string{"late", "late", "normal", "normal"}
	var mu sync.Mutex
	var lines []string
	var wg sync.WaitGroup
	start := func(i int, role string) <-chan struct{} {
		claimed := make(chan struct{})
		cmd := exec.Command(os.Args[0], "-test.run=^TestMultiProcessWorker$", "-test.v")
		cmd.Env = append(os.Environ(), mpRoleEnv+"="+role, mpDSNEnv+"="+dsn)
		if shared {
			cmd.Env = append(cmd.Env, mpSharedEnv+"=1")
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			once := sync.OnceFunc(func() { close(claimed) })
			defer once() // a worker that ends without claiming must not hold the others back
			sc := bufio.NewScanner(out)
			var said []string // the worker's other output (its test's log), kept for a failure
			for sc.Scan() {
				if l, ok := strings.CutPrefix(sc.Text(), "MP "); ok {
					mu.Lock()
					lines = append(lines, fmt.Sprintf("%d %s", i, l))
					mu.Unlock()
					if strings.HasPrefix(l, "claim ") {
						once()
					}
				} else if len(said) < 200 {
					said = append(said, sc.Text())
				}
			}
			if err := cmd.Wait(); err != nil {
				t.Errorf("worker %d (%s): %v; its output besides its MP lines:\n%s", i, role, err, strings.Join(said, "\n"))
			}
		}()
		return claimed
	}
	var lateClaimed []<-chan struct{}
	for i, role := range roles {
		if role == "normal" {
			for _, c := range lateClaimed {
				select {
				case <-c:
				case <-time.After(2 * time.Minute):
					t.Fatal("a late worker claimed nothing within 2 minutes")
				}
			}
			lateClaimed = nil
		}
		c := start(i, role)
		if role == "late" {
			lateClaimed = append(lateClaimed, c)
		}
	}
	wg.Wait()

	type key struct {
		task    string
		attempt int
	}
	claimedBy := map[key]string{}
	forwarded := 0
	maxAttempt := map[string]int{}
	okFinish := map[string][]int{}
	var stale []key
	for _, l := range lines {
		var who, what, task string
		var attempt int
		var result string
		f := strings.Fields(l)
		who, what = f[0], f[1]
		if what == "forwarded" {
			n := 0
			fmt.Sscan(f[2], &n)
			forwarded += n
			continue
		}
		task = f[2]
		fmt.Sscan(f[3], &attempt)
		if len(f) > 4 {
			result = f[4]
		}
		k := key{task, attempt}
		switch what {
		case "claim":
			if prev, dup := claimedBy[k]; dup {
				t.Errorf("task %s attempt %d delivered twice: to workers %s and %s", task, attempt, prev, who)
			}
			claimedBy[k] = who
			maxAttempt[task] = max(maxAttempt[task], attempt)
		case "finish":
			switch result {
			case "ok":
				okFinish[task] = append(okFinish[task], attempt)
			case "stale":
				stale = append(stale, k)
			default:
				t.Errorf("worker %s: finish of %s attempt %d: %s", who, task, attempt, result)
			}
		}
	}
	for id := range ids {
		got := okFinish[id]
		if len(got) != 1 {
			t.Errorf("task %s settled %d times by its workers (attempts %v), want once", id, len(got), got)
			continue
		}
		if got[0] != maxAttempt[id] {
			t.Errorf("task %s settled by attempt %d, but attempt %d was delivered", id, got[0], maxAttempt[id])
		}
	}
	if len(stale) == 0 {
		t.Error("no late finish was fenced: the late workers' leases never expired before a re-claim")
	}
	for _, k := range stale {
		if maxAttempt[k.task] <= k.attempt {
			t.Errorf("task %s attempt %d fenced, but no later attempt was delivered", k.task, k.attempt)
		}
	}
	settled := map[string]int{}
	if err := q.ReadLog(ctx, 0, func(ev events.Event) error {
		if s, ok := ev.(*events.TaskSettled); ok {
			settled[s.TaskID]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		if settled[id] != 1 {
			t.Errorf("task %s: %d task_settled events in the log, want 1", id, settled[id])
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if shared && forwarded == 0 {
		t.Error("no worker sent a call to the elected one")
	}
	t.Logf("%d deliveries, %d late finishes fenced, across %d processes; %d calls sent to the elected one", len(claimedBy), len(stale), len(roles), forwarded)
}

// TestMultiProcessWorker is the worker process of TestMultiProcess; it does nothing in a
// plain run. It claims and finishes until nothing has been claimable for two leases' time.
func TestMultiProcessWorker(t *testing.T) {
	role := os.Getenv(mpRoleEnv)
	if role == "" {
		t.Skip("a worker process of TestMultiProcess")
	}
	ctx := context.Background()
	shared := os.Getenv(mpSharedEnv) != ""
	q, err := postgres.Open(ctx, os.Getenv(mpDSNEnv), &postgres.Options{SharedWriter: shared})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if shared {
		defer func() {
			_, _, n, _ := postgres.SharedWriterState(q)
			fmt.Printf("MP forwarded %d\n", n)
		}()
	}
	late := 0
	if role == "late" {
		late = 3 // the first deliveries are finished once another process has claimed them again
	}
	idleSince := time.Now()
	deadline := time.Now().Add(60 * time.Second)
	for time.Since(idleSince) < 5*mpLease && time.Now().Before(deadline) {
		ds, err := q.ClaimDue(ctx, mpLease, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		for _, d := range ds {
			fmt.Printf("MP claim %s %d\n", d.Task.ID, d.Attempt)
		}
		if late > 0 {
			// Hold the deliveries past their lease until another process has claimed each task
			// again (a bounded wait, not a guess at how long that takes under load): their
			// finishes below must then be fenced.
			late--
			for _, d := range ds {
				for wait := time.Now().Add(60 * time.Second); time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
					cur, ok, err := q.Session("mp").Task(ctx, d.Task.ID)
					if err != nil || !ok {
						t.Fatalf("read %s: %v %v", d.Task.ID, ok, err)
					}
					if cur.Attempts > d.Attempt || cur.State != work.TaskRunning {
						break
					}
				}
			}
		}
		for _, d := range ds {
			_, err := q.Finish(ctx, d, work.Success(nil))
			result := "ok"
			switch {
			case errors.Is(err, work.ErrStaleDelivery):
				result = "stale"
			case err != nil:
				result = strings.ReplaceAll(err.Error(), " ", "_")
			}
			fmt.Printf("MP finish %s %d %s\n", d.Task.ID, d.Attempt, result)
		}
		idleSince = time.Now()
	}
}
