package work_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// TestCrashScheduleTicks: a child process claims in a loop across a schedule's ticks and is
// killed with SIGKILL at a random moment, round after round; each round's child reopens the
// store. At the end every tick from the schedule's set to the last claim's time is exactly
// one task (none repeated by a restart, none lost), every claim a child acknowledged is in
// the store, and Verify passes. The ticks are decided from the schedule's cursor, projection
// state folded from the events, in the claim's own command.
func TestCrashScheduleTicks(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	dir := t.TempDir()
	ctx := context.Background()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := work.Schedule{Name: "s", Cron: "@every 1s", Catchup: work.CatchupAll, Task: work.TaskRequest{Kind: "tick"}}
	if err := q.Session("sched").SetScheduleAt(ctx, sc, schedCrashEpoch); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(crashSeed(t), 23))
	claimed := map[string]bool{}
	const rounds = 5
	for round := range rounds {
		for _, k := range runScheduleChild(t, dir, round, time.Duration(300+rng.IntN(1200))*time.Millisecond) {
			claimed[k] = true
		}
	}
	q, err = work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	// A last claim after every round: the ticks since the last child's claim are submitted.
	end := schedRoundStart(rounds)
	for {
		ds, err := q.ClaimDueAt(ctx, end, time.Hour, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			break
		}
	}
	ticks := map[int64]int{}
	if err := q.ReadLog(ctx, 1, func(ev events.Event) error {
		if e, ok := ev.(*events.TaskSubmitted); ok && e.Schedule == "s" {
			ticks[e.Tick]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := int(end.Sub(schedCrashEpoch) / time.Second)
	for k := 1; k <= want; k++ {
		tick := schedCrashEpoch.Add(time.Duration(k) * time.Second)
		if n := ticks[tick.UnixNano()]; n != 1 {
			t.Errorf("tick %s became %d tasks, want 1", tick.Format(time.RFC3339), n)
		}
		delete(ticks, tick.UnixNano())
	}
	for tick, n := range ticks {
		t.Errorf("tick %s (%d tasks) is not a tick of the schedule up to %s", time.Unix(0, tick).UTC().Format(time.RFC3339Nano), n, end)
	}
	for k := range claimed {
		if _, err := q.Session("sched").TaskByKey(ctx, k); err != nil {
			t.Errorf("the acknowledged claim of %s is lost: %v", k, err)
		}
	}
	if err := q.Verify(ctx); err != nil {
		t.Errorf("Verify: %v", err)
	}
	t.Logf("%d ticks, each one task; %d claims acknowledged by the children", want, len(claimed))
}

var schedCrashEpoch = time.Date(2031, time.January, 1, 0, 0, 0, 0, time.UTC)

// schedRoundStart is round r's first claim time: rounds are 1,000 s apart (a child makes far
// fewer than 10,000 claims of 100 ms each before it is killed), so each round's first claim
// catches up on the ticks of the gap (CatchupAll, at most MaxTicksPerClaim at once).
func schedRoundStart(r int) time.Time {
	return schedCrashEpoch.Add(time.Duration(r+1) * 1000 * time.Second)
}

const schedChildEnv, schedRoundEnv = "WORKLOG_SCHED_CRASH_DIR", "WORKLOG_SCHED_CRASH_ROUND"

// TestScheduleCrashHelperProcess is the child: it claims and finishes in a loop, its clock
// 100 ms further each claim, printing "claimed <key>" once each claim returned.
func TestScheduleCrashHelperProcess(t *testing.T) {
	dir := os.Getenv(schedChildEnv)
	if dir == "" {
		t.Skip("child process of TestCrashScheduleTicks")
	}
	round, _ := strconv.Atoi(os.Getenv(schedRoundEnv))
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	time.AfterFunc(time.Minute, func() { os.Exit(0) })
	q, err := work.Open(dir, nil)
	if err != nil {
		fmt.Println("error open:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	ctx := context.Background()
	now := schedRoundStart(round)
	for i := 0; ; i++ {
		now = now.Add(100 * time.Millisecond)
		ds, err := q.ClaimDueAt(ctx, now, time.Hour, 20)
		if err != nil {
			fmt.Println("error claim:", err)
			os.Exit(2)
		}
		for _, d := range ds {
			fmt.Println("claimed " + d.Task.IdempotencyKey)
		}
		for _, d := range ds {
			if _, err := q.FinishAt(ctx, d, work.Outcome{State: work.TaskSucceeded}, now); err != nil {
				fmt.Println("error finish:", err)
				os.Exit(2)
			}
		}
	}
}

// runScheduleChild runs one round's child, kills it after delay and returns the keys of the
// claims it acknowledged.
func runScheduleChild(t *testing.T, dir string, round int, delay time.Duration) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestScheduleCrashHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), schedChildEnv+"="+dir, schedRoundEnv+"="+strconv.Itoa(round))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return // a line cut by the kill was not fully reported
			}
			lines <- strings.TrimSuffix(line, "\n")
		}
	}()
	var keys []string
	ready := false
	timeout := time.After(time.Minute)
	var kill <-chan time.Time
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				cmd.Wait()
				ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
				if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("round %d: child ended before it was killed: %v", round, cmd.ProcessState)
				}
				return keys
			}
			switch {
			case line == "ready" && !ready:
				ready = true
				kill = time.After(delay)
			case strings.HasPrefix(line, "error"):
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: child: %s", round, line)
			case strings.HasPrefix(line, "claimed "):
				keys = append(keys, strings.TrimPrefix(line, "claimed "))
			}
		case <-kill:
			kill = nil
			cmd.Process.Signal(syscall.SIGKILL)
		case <-timeout:
			cmd.Process.Kill()
			t.Fatalf("round %d: child stuck", round)
		}
	}
}
