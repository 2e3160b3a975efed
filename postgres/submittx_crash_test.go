package postgres_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/postgres"
	"github.com/worklog/worklog/work"
)

const (
	stxRoleEnv  = "WORKLOG_PG_STX_ROLE" // "app" or "queue": this process is a child of TestSubmitTxSIGKILL
	stxDSNEnv   = "WORKLOG_PG_STX_DSN"
	stxRoundEnv = "WORKLOG_PG_STX_ROUND"
)

// TestSubmitTxSIGKILL kills both sides of SubmitTx with SIGKILL at random moments, round
// after round: an application process that commits (two in three) or rolls back SubmitTx
// transactions as fast as it can (and whose own queue takes rows in), and a queue process
// that takes rows in while its writer is kept busy with plain submits. Then a fresh queue
// takes in what is left, and: every submission whose COMMIT returned is a task; no rolled-back
// one is; every task's key was submitted with the intent to commit (one killed mid-COMMIT may
// be either); one task per key; no row left in the inbox or moved aside; Verify clean.
func TestSubmitTxSIGKILL(t *testing.T) {
	pgtest.Need(t)
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	// The schema and its inbox tables exist before any child runs.
	q0, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := q0.Close(); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)
	rounds := 10
	if testing.Short() {
		rounds = 3
	}
	var mu sync.Mutex
	attempted, committed, rolledBack := map[string]bool{}, map[string]bool{}, map[string]bool{}
	start := func(role string, round int, started chan<- struct{}) (*exec.Cmd, <-chan struct{}) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSubmitTxSIGKILLChild$")
		cmd.Env = append(os.Environ(), stxRoleEnv+"="+role, stxDSNEnv+"="+dsn, fmt.Sprintf("%s=%d", stxRoundEnv, round))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			once := sync.OnceFunc(func() {
				if started != nil {
					close(started)
				}
			})
			defer once()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				what, key, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "STX "), " ")
				if !ok || !strings.HasPrefix(sc.Text(), "STX ") {
					continue
				}
				once()
				mu.Lock()
				switch what {
				case "A":
					attempted[key] = true
				case "C":
					committed[key] = true
				case "R":
					rolledBack[key] = true
				}
				mu.Unlock()
			}
			_ = cmd.Wait()
		}()
		return cmd, done
	}
	for round := range rounds {
		started := make(chan struct{})
		app, appDone := start("app", round, started)
		queue, queueDone := start("queue", round, nil)
		select {
		case <-started:
		case <-time.After(2 * time.Minute):
			t.Fatal("the application process submitted nothing within 2 minutes")
		}
		// Kill each side at its own random moment, the queue sometimes first.
		first, second := app, queue
		if rng.IntN(2) == 0 {
			first, second = queue, app
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		_ = first.Process.Signal(syscall.SIGKILL)
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		_ = second.Process.Signal(syscall.SIGKILL)
		<-appDone
		<-queueDone
	}

	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for deadline := time.Now().Add(ingestWait); inboxRows(t, c, "submit_inbox") > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the inbox still holds %d rows after %v", inboxRows(t, c, "submit_inbox"), ingestWait)
		}
	}
	if n := inboxRows(t, c, "submit_inbox_rejects"); n != 0 {
		t.Errorf("%d rows moved to submit_inbox_rejects, want none", n)
	}
	s := q.Session("stx")
	for key := range committed {
		if _, err := s.TaskByKey(ctx, key); err != nil {
			t.Errorf("submission %s was committed (its COMMIT returned) but is no task: %v", key, err)
		}
	}
	for key := range rolledBack {
		if task, err := s.TaskByKey(ctx, key); !errors.Is(err, work.ErrTaskNotFound) {
			t.Errorf("submission %s was rolled back but is task %s (err %v)", key, task.ID, err)
		}
	}
	var all []work.Task
	for after := ""; ; {
		page, err := s.Tasks(ctx, work.TaskFilter{After: after, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 500 {
			break
		}
		after = page[len(page)-1].ID
	}
	keys := map[string]string{}
	for _, task := range all {
		if !attempted[task.IdempotencyKey] {
			t.Errorf("task %s has key %q, which no submission meant to commit", task.ID, task.IdempotencyKey)
		}
		if other, dup := keys[task.IdempotencyKey]; dup {
			t.Errorf("key %q names two tasks, %s and %s", task.IdempotencyKey, other, task.ID)
		}
		keys[task.IdempotencyKey] = task.ID
	}
	verifyClean(t, q)
	inFlight := len(attempted) - len(committed)
	t.Logf("%d rounds: %d committed, %d rolled back, %d killed between COMMIT and its answer; %d tasks",
		rounds, len(committed), len(rolledBack), inFlight, len(all))
	if len(committed) == 0 || len(rolledBack) == 0 {
		t.Fatalf("the rounds committed %d and rolled back %d submissions: the test tried nothing", len(committed), len(rolledBack))
	}
}

// TestSubmitTxSIGKILLChild is a process of TestSubmitTxSIGKILL; it does nothing in a plain
// run. It runs until it is killed.
func TestSubmitTxSIGKILLChild(t *testing.T) {
	role := os.Getenv(stxRoleEnv)
	if role == "" {
		t.Skip("a child process of TestSubmitTxSIGKILL")
	}
	ctx := context.Background()
	dsn := os.Getenv(stxDSNEnv)
	q, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute) // killed long before, unless the parent died
	if role == "queue" {
		// Take rows in (in the background) while the writer is kept busy.
		for i := 0; time.Now().Before(deadline); i++ {
			if _, err := q.Session("busy").Submit(ctx, work.TaskRequest{Kind: "busy"}); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	round := os.Getenv(stxRoundEnv)
	for i := 0; time.Now().Before(deadline); i++ {
		key := fmt.Sprintf("r%s-%d", round, i)
		commit := i%3 != 0
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := postgres.SubmitTx(ctx, tx, q, "stx", work.TaskRequest{Kind: "stx", IdempotencyKey: key}); err != nil {
			t.Fatal(err)
		}
		if !commit {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			fmt.Printf("STX R %s\n", key)
			continue
		}
		fmt.Printf("STX A %s\n", key)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("STX C %s\n", key)
	}
}
