package postgres

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

const procWorkerEnv = "WORKLOG_PG_PROC_WORKER" // the DSN: this process is a worker of BenchmarkProcesses

// BenchmarkProcesses (issue 24 §2): W2 through the runner from 1, 2 and 4 processes on one
// database. b.N tasks are submitted first; then each process — a real one, this test binary
// run as TestProcessesWorker — starts a runner with 16 slots (Prefetch 16, as bench/'s W2)
// on its own postgres.Open of the database, all at one signal; the clock stops when the
// last task is recorded succeeded (the counts table polled every 10 ms). Reported:
//
//   - tasks/s: b.N over that time, all processes together (the target: 4 processes not below 1);
//   - groups/s: the writers' committed groups per second, all processes together;
//   - tasks/group: b.N over the groups (a task is claimed in one group and settled in another,
//     the runner's SettleAndClaim carrying both for many tasks);
//   - µs-held/group: the mean time a group holds the log head's row lock (headstats.go: from
//     the answer of BEGIN and the lock to the answer of COMMIT), and µs-wait/group, the time
//     before it (the pool, a round trip, the queue on the lock behind the other processes);
//   - head-busy: the sum of the holds over the time, the fraction of it the head was held
//     (1 is saturated: every writer of every process waits on the one row);
//   - ceiling-tasks/s: tasks/group ÷ held/group, the throughput if groups ran back to back
//     at this hold and this size: what the log head allows, however many processes;
//   - reads/group: the task and wake records and keys a group read from the server under the
//     lock (each a round trip), which the writer's cache did not answer;
//   - cache-kept: of the groups that found another process's commits since their writer's
//     last, the fraction whose cache was caught up with those events (catchup.go) rather than
//     started over; dropped/catch-up, the entries a catch-up dropped;
//   - fast/group: the groups committed in one round trip (fast.go) per committed group (a
//     fast group that wrote nothing is counted in fast, not in groups); fast-stale/group, the
//     fast batches whose check found another process's commit (a round trip lost);
//   - worker-cpu-ms/ktask: the worker processes' CPU time (user and system, /proc) over the
//     timed run per 1,000 tasks; other-cpu-ms/ktask, the rest of the machine's busy time in
//     it (/proc/stat): the server's processes, the parent's polling and anything else that
//     ran, so it is a result only on an otherwise idle machine.
//
// The server is pgtest's (fsync off: a commit costs no disk flush, so the hold is the round
// trips and the work inside them); bench/ runs River against a server with fsync on.
//
//	go test ./postgres -run '^$' -bench Processes -benchtime 20000x -count 3 -timeout 30m
func BenchmarkProcesses(b *testing.B) {
	for _, procs := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) { benchProcesses(b, procs, false) })
	}
}

// BenchmarkProcessesSharedWriter is BenchmarkProcesses with every worker opened with
// Options.SharedWriter: one elected worker's writer runs every worker's rounds
// (sharedwriter.go). Reported besides: forwarded/ktask, the rounds the other workers sent it
// per 1,000 tasks.
func BenchmarkProcessesSharedWriter(b *testing.B) {
	for _, procs := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) { benchProcesses(b, procs, true) })
	}
}

// procSlotsEnv sets the slots of each worker's runner (16 when unset): one process with 64
// slots is the ceiling of one writer for the commands of 4 processes of 16 (design §9
// "Many processes", option 2), without the hops that would hand them over.
const procSlotsEnv = "WORKLOG_PROCESSES_SLOTS"

func procSlots() int {
	if n, err := strconv.Atoi(os.Getenv(procSlotsEnv)); err == nil && n > 0 {
		return n
	}
	return 16
}

// procSharedEnv, set by BenchmarkProcessesSharedWriter, opens a worker with
// Options.SharedWriter.
const procSharedEnv = "WORKLOG_PROCESSES_SHARED"

// procProfileEnv names a directory where each worker process of BenchmarkProcesses writes
// its CPU profile (worker-I-of-N.prof), when set.
const procProfileEnv = "WORKLOG_PROCESSES_PROFILE_DIR"

// workerHead is what a worker process reports when it stops: its writer's headStats.
type workerHead struct {
	Groups, HeldNanos, WaitNanos int64
	Reads                        int64 // records and keys read under the lock
	Kept, Restarted, Dropped     int64 // the cache at begins after another process wrote
	Fast, FastStale              int64 // groups in one round trip; fast batches whose head check failed
	Forwarded                    int64 // rounds sent to the elected worker (SharedWriter)
}

func benchProcesses(b *testing.B, procs int, shared bool) {
	dsn := pgtest.Schema(b)
	ctx := context.Background()
	q, err := Open(ctx, dsn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	submitW2(b, q, b.N)
	type worker struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Scanner
	}
	ws := make([]worker, procs)
	for i := range ws {
		args := []string{"-test.run=^TestProcessesWorker$"}
		if dir := os.Getenv(procProfileEnv); dir != "" { // each worker's CPU profile, for pprof
			args = append(args, fmt.Sprintf("-test.cpuprofile=%s/worker-%d-of-%d.prof", dir, i+1, procs))
		}
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), procWorkerEnv+"="+dsn)
		if shared {
			cmd.Env = append(cmd.Env, procSharedEnv+"=1")
		}
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer cmd.Process.Kill() // on a failure: Wait below reaps it otherwise
		ws[i] = worker{cmd, stdin, bufio.NewScanner(stdout)}
	}
	line := func(w worker, prefix string) string {
		for w.out.Scan() {
			if t, ok := strings.CutPrefix(w.out.Text(), prefix); ok {
				return t
			}
		}
		b.Fatalf("worker %d ended before %q: %v", w.cmd.Process.Pid, prefix, w.out.Err())
		return ""
	}
	for _, w := range ws {
		line(w, "ready")
	}
	pids := make([]int, len(ws))
	for i, w := range ws {
		pids[i] = w.cmd.Process.Pid
	}
	cpu0, workers0 := machineTicks(), procTicks(pids)
	b.ResetTimer()
	start := time.Now()
	for _, w := range ws {
		if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
			b.Fatal(err)
		}
	}
	// The counts alone, read from the table: Stats also walks the due index up to now with
	// every due task's record (its DueNow), and polled every 10 ms that walk of the backlog
	// took 1.9 s of the server's CPU in a 3 s run of 20,000 tasks (pg_stat_statements,
	// 2026-12-05): the measure took a third of a core from what it measured.
	waitSucceeded(b, []*engine{engineOf(b, q)}, b.N, start.Add(10*time.Minute))
	elapsed := time.Since(start)
	b.StopTimer()
	cpu, workers := machineTicks()-cpu0, procTicks(pids)-workers0
	var sum workerHead
	for _, w := range ws {
		w.stdin.Close() // the worker stops its runner and reports
		var h workerHead
		if err := json.Unmarshal([]byte(line(w, "head ")), &h); err != nil {
			b.Fatal(err)
		}
		if err := w.cmd.Wait(); err != nil {
			b.Fatalf("worker: %v", err)
		}
		sum.Groups += h.Groups
		sum.HeldNanos += h.HeldNanos
		sum.WaitNanos += h.WaitNanos
		sum.Reads += h.Reads
		sum.Kept += h.Kept
		sum.Restarted += h.Restarted
		sum.Dropped += h.Dropped
		sum.Fast += h.Fast
		sum.FastStale += h.FastStale
		sum.Forwarded += h.Forwarded
	}
	if sum.Groups == 0 {
		b.Fatal("no group committed by the workers")
	}
	secs := elapsed.Seconds()
	held := float64(sum.HeldNanos) / float64(sum.Groups) / 1e3 // µs
	perGroup := float64(b.N) / float64(sum.Groups)
	b.ReportMetric(float64(b.N)/secs, "tasks/s")
	b.ReportMetric(float64(sum.Groups)/secs, "groups/s")
	b.ReportMetric(perGroup, "tasks/group")
	b.ReportMetric(held, "µs-held/group")
	b.ReportMetric(float64(sum.WaitNanos)/float64(sum.Groups)/1e3, "µs-wait/group")
	b.ReportMetric(float64(sum.HeldNanos)/1e9/secs, "head-busy")
	b.ReportMetric(perGroup/held*1e6, "ceiling-tasks/s")
	if shared {
		b.ReportMetric(float64(sum.Forwarded)/float64(b.N)*1e3, "forwarded/ktask")
	}
	b.ReportMetric(float64(sum.Reads)/float64(sum.Groups), "reads/group")
	b.ReportMetric(float64(sum.Fast)/float64(sum.Groups), "fast/group")
	b.ReportMetric(float64(sum.FastStale)/float64(sum.Groups), "fast-stale/group")
	if cpu > 0 && ticksPerSecond > 0 {
		perKTask := func(ticks int64) float64 { return float64(ticks) / ticksPerSecond * 1e3 / (float64(b.N) / 1e3) }
		b.ReportMetric(perKTask(workers), "worker-cpu-ms/ktask")
		b.ReportMetric(perKTask(cpu-workers), "other-cpu-ms/ktask")
	}
	if behind := sum.Kept + sum.Restarted; behind > 0 {
		b.ReportMetric(float64(sum.Kept)/float64(behind), "cache-kept")
		if sum.Kept > 0 {
			b.ReportMetric(float64(sum.Dropped)/float64(sum.Kept), "dropped/catch-up")
		}
	}
}

// submitW2 submits n tasks of kind w2 to q's session bench, work.MaxSubmitMany at a time.
func submitW2(tb testing.TB, q *work.Queue, n int) {
	s := q.Session("bench")
	for i := 0; i < n; i += work.MaxSubmitMany {
		rs := make([]work.TaskRequest, min(work.MaxSubmitMany, n-i))
		for j := range rs {
			rs[j] = work.TaskRequest{Kind: "w2", Input: json.RawMessage(`{"n":1}`)}
		}
		if _, err := s.SubmitMany(context.Background(), rs); err != nil {
			tb.Fatal(err)
		}
	}
}

// newW2Runner is bench/'s W2 runner on q: slots slots, Prefetch as many, a handler of w2
// that does nothing.
func newW2Runner(tb testing.TB, q *work.Queue, slots int) *runner.Runner {
	r, err := runner.New(q, runner.Config{
		Handlers:    map[string]runner.Handler{"w2": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }},
		Concurrency: slots,
		Prefetch:    slots,
		LeaseFor:    10 * time.Minute,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// engineOf is the engine of q, a queue postgres.Open returned.
func engineOf(tb testing.TB, q *work.Queue) *engine {
	v, ok := queues.Load(q)
	if !ok {
		tb.Fatal("no engine for the queue")
	}
	return v.(*engine)
}

// waitSucceeded returns once the queues of es together record want tasks succeeded, polling
// their counts every 10 ms; it fails b on a failed or canceled task, or at deadline.
func waitSucceeded(b *testing.B, es []*engine, want int, deadline time.Time) {
	ctx := context.Background()
	for {
		var done, lost int64
		for _, e := range es {
			err := readCounts(ctx, e.pool, e.st, func(_ string, st events.TaskState, n int64) bool {
				switch st {
				case events.StateSucceeded:
					done += n
				case events.StateFailed, events.StateCanceled:
					lost += n
				}
				return true
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		if done == int64(want) {
			return
		}
		if lost > 0 || time.Now().After(deadline) {
			b.Fatalf("tasks: %d succeeded, %d failed or canceled, of %d", done, lost, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ticksPerSecond is the kernel's USER_HZ, the unit of /proc's CPU times (100 on Linux's
// every architecture but alpha); 0 where there is no /proc, and the CPU metrics are left out.
var ticksPerSecond = func() float64 {
	if _, err := os.Stat("/proc/stat"); err != nil {
		return 0
	}
	return 100
}()

// machineTicks is the CPU time the machine spent out of idle (user, nice, system, irq,
// softirq), from /proc/stat; 0 where it cannot be read.
func machineTicks() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq ...
	var sum int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		if i < len(f) {
			n, _ := strconv.ParseInt(f[i], 10, 64)
			sum += n
		}
	}
	return sum
}

// procTicks is the CPU time (user and system) of the processes pids, from /proc.
func procTicks(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's name, which is in parentheses and may hold spaces:
		// utime and stime are the 14th and 15th of the line, the 12th and 13th after it.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		for _, i := range []int{11, 12} {
			if i < len(f) {
				n, _ := strconv.ParseInt(f[i], 10, 64)
				sum += n
			}
		}
	}
	return sum
}

// TestProcessesWorker is a worker process of BenchmarkProcesses: it opens the queue, says
// "ready", starts a runner with 16 slots (procSlots) at the line "go" on its input, stops it when its
// input ends, and prints its writer's headStats as "head {json}".
func TestProcessesWorker(t *testing.T) {
	dsn := os.Getenv(procWorkerEnv)
	if dsn == "" {
		t.Skip("a worker process of BenchmarkProcesses")
	}
	ctx := context.Background()
	shared := os.Getenv(procSharedEnv) != ""
	q, err := Open(ctx, dsn, &Options{SharedWriter: shared})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	e := engineOf(t, q)
	if shared { // elected, or connected to the elected process
		for i := 0; i < 100 && !e.sw.leading.Load() && e.sw.cur.Load() == nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() || in.Text() != "go" {
		t.Fatalf("no go: %v", in.Err())
	}
	r := newW2Runner(t, q, procSlots())
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	for in.Scan() { // until the input ends
	}
	stop, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.Stop(stop); err != nil {
		t.Fatal(err)
	}
	var forwarded int64
	if shared {
		forwarded = e.sw.forwarded.Load()
	}
	h, _ := json.Marshal(workerHead{
		Groups: e.head.groups.Load(), HeldNanos: e.head.held.Load(), WaitNanos: e.head.wait.Load(),
		Reads: e.head.reads.Load(), Kept: e.head.kept.Load(), Restarted: e.head.restarted.Load(), Dropped: e.head.dropped.Load(),
		Fast: e.head.fast.Load(), FastStale: e.head.fastStale.Load(), Forwarded: forwarded,
	})
	fmt.Printf("head %s\n", h)
}
