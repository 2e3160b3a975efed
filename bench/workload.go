package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// errNotApplicable marks a workload a system has no equivalent for (goqite has no idempotency
// keys; bare Pebble is not a queue).
var errNotApplicable = errors.New("not applicable")

// queue is what every system under test provides. Every method is safe for concurrent use.
type queue interface {
	// Enqueue stores one task durably (at the system's stated durability) and returns its id.
	Enqueue(ctx context.Context, key string, input []byte) (string, error)
	// Work claims and completes total tasks with a pool of workers that do nothing, and returns
	// once the last completion is durable.
	Work(ctx context.Context, total, workers int) error
	// Keys reports whether the system has idempotency keys (W3).
	Keys() bool
	// Duplicate enqueues the same task again under the same idempotency key and returns the id
	// of the task the system answered with.
	Duplicate(ctx context.Context, key string, input []byte) (string, error)
	// Close releases the store.
	Close() error
	// Completed reopens the closed store and counts the completed tasks in it.
	Completed(ctx context.Context) (int, error)
}

// system describes one row of the table: a queue at one durability.
type system struct {
	name       string
	durability string
	open       func(ctx context.Context, dir string, cfg childConfig) (queue, error)
	needsPG    bool
}

// result is one child's report, written as one JSON line on stdout.
type result struct {
	System     string  `json:"system"`
	Durability string  `json:"durability"`
	Run        int     `json:"run"`
	N          int     `json:"n"`
	Workers    int     `json:"workers"`
	W1One      float64 `json:"w1_1"`  // tasks/s, 1 goroutine; -1 not applicable
	W1Many     float64 `json:"w1_16"` // tasks/s, Workers goroutines
	W2         float64 `json:"w2"`
	W3One      float64 `json:"w3_1"`
	W3Many     float64 `json:"w3_16"`
	Seconds    float64 `json:"seconds"` // wall time of the four timed phases together
	Completed  int     `json:"completed"`
	Expected   int     `json:"expected"`
	VmHWMKiB   int64   `json:"vmhwm_kib"`    // peak RSS of the child, from /proc/self/status
	WorkCPU    float64 `json:"work_cpu_s"`   // child user+sys during the timed phases, less SamplerCPU
	ServerCPU  float64 `json:"server_cpu_s"` // PostgreSQL server processes, user+sys; -1 none
	ServerPSS  int64   `json:"server_pss_kib"`
	// SamplerCPU is what measuring the server (ServerCPU, ServerPSS) cost the child, on a
	// thread of its own: taken out of WorkCPU and CPU, which are the system's client alone.
	SamplerCPU float64 `json:"sampler_cpu_s"`
	W2Pool     string  `json:"w2_pool,omitempty"` // how W2 ran (w2How)
	// What W2 cost besides its time (phaseCounters): the client's and, on PostgreSQL, the
	// server's CPU seconds, the WAL bytes per task, the full-page images and checkpoints
	// begun during it, and the hypervisor's steal, every CPU together.
	W2ClientCPU   float64 `json:"w2_client_cpu_s,omitempty"`
	W2ServerCPU   float64 `json:"w2_server_cpu_s,omitempty"`
	W2WALPerTask  float64 `json:"w2_wal_bytes_per_task,omitempty"`
	W2FPI         int64   `json:"w2_fpi,omitempty"`
	W2Checkpoints int64   `json:"w2_checkpoints,omitempty"`
	W2Steal       float64 `json:"w2_steal_s,omitempty"`
	Error         string  `json:"error,omitempty"`
	// CPUProbe is one core's SHA-256 speed in MB/s, taken by the parent just before the
	// child started (settle.go's cpuProbe): 0 when not taken. Compare it across the rows of
	// one run; a row whose probe is lower ran on a slower machine.
	CPUProbe float64 `json:"cpu_probe_mbps,omitempty"`

	// Filled by the parent from the child's rusage.
	MaxRSSKiB int64   `json:"maxrss_kib"`
	CPU       float64 `json:"cpu_s"`
}

// input returns the ~200-byte JSON input of task i; every system gets the same bytes.
func input(i int) []byte {
	s := fmt.Sprintf(`{"task":%d,"tenant":"tenant-%04d","action":"render_thumbnail","source":"s3://media-bucket/uploads/2026/11/30/image-%08d.png","sizes":[64,128,256,512],"format":"webp","quality":82,"requested_by":"user-%06d"}`,
		i, i%1000, i, i%100000)
	return []byte(s)
}

func key(i int) string { return fmt.Sprintf("bench-key-%08d", i) }

// closedLoop runs fn for indexes [from, to) from g goroutines, each taking the next index as
// soon as its previous call returned, and returns the calls per second.
func closedLoop(ctx context.Context, from, to, g int, fn func(ctx context.Context, i int) error) (float64, error) {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("task %d: %w", i, err); cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(to-from) / el.Seconds(), nil
}

// childConfig is what the parent passes to a child.
type childConfig struct {
	System      string
	Dir         string
	Run         int
	N           int
	Workers     int
	PGDSN       string
	CPUProfile  string
	WorklogPool string
}

// runChild runs the four workloads against one system on a fresh store in cfg.Dir and returns
// its report. Progress goes to stderr.
func runChild(ctx context.Context, cfg childConfig) result {
	sys, ok := systemByName(cfg.System)
	r := result{System: cfg.System, Run: cfg.Run, N: cfg.N, Workers: cfg.Workers, Expected: 2 * cfg.N,
		W1One: -1, W1Many: -1, W2: -1, W3One: -1, W3Many: -1, ServerCPU: -1}
	if !ok {
		r.Error = "unknown system " + cfg.System
		return r
	}
	r.Durability = sys.durability
	r.W2Pool = w2How(cfg.System, cfg.WorklogPool)
	if err := runPhases(ctx, sys, cfg, &r); err != nil {
		r.Error = err.Error()
	}
	r.VmHWMKiB = vmHWM()
	return r
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "  "+format+"\n", args...)
}

func runPhases(ctx context.Context, sys system, cfg childConfig, r *result) error {
	n, g := cfg.N, cfg.Workers
	var srv *pgServerStats
	if sys.needsPG {
		var err error
		if srv, err = newPGServerStats(ctx, cfg.PGDSN); err != nil {
			logf("%s: no server statistics: %v", sys.name, err)
		}
	}
	q, err := sys.open(ctx, cfg.Dir, cfg)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			q.Close()
		}
	}()
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if srv != nil {
		srv.start()
	}
	cpu0 := selfCPU()
	t0 := time.Now()

	ids := make([]string, 2*n)
	enq := func(ctx context.Context, i int) error {
		id, err := q.Enqueue(ctx, key(i), input(i))
		ids[i] = id
		return err
	}
	// W1: n tasks from 1 goroutine, then n more from g goroutines.
	if r.W1One, err = closedLoop(ctx, 0, n, 1, enq); err != nil {
		return fmt.Errorf("W1 (1 goroutine): %w", err)
	}
	logf("%s run %d: W1 1 goroutine   %8.0f tasks/s", sys.name, cfg.Run, r.W1One)
	if r.W1Many, err = closedLoop(ctx, n, 2*n, g, enq); err != nil {
		return fmt.Errorf("W1 (%d goroutines): %w", g, err)
	}
	logf("%s run %d: W1 %d goroutines %8.0f tasks/s", sys.name, cfg.Run, g, r.W1Many)

	// W2: every task claimed and completed by g workers.
	before := readPhaseCounters(ctx, cfg.PGDSN, srv)
	start := time.Now()
	err = q.Work(ctx, 2*n, g)
	switch {
	case errors.Is(err, errNotApplicable):
	case err != nil:
		return fmt.Errorf("W2: %w", err)
	default:
		r.W2 = float64(2*n) / time.Since(start).Seconds()
		r.w2Phase(before, readPhaseCounters(ctx, cfg.PGDSN, srv), 2*n)
		logf("%s run %d: W2 %d workers    %8.0f tasks/s (CPU client %.1f s, server %.1f s; WAL %.0f B a task, %d full-page images, %d checkpoints; steal %.2f s)",
			sys.name, cfg.Run, g, r.W2, r.W2ClientCPU, r.W2ServerCPU, r.W2WALPerTask, r.W2FPI, r.W2Checkpoints, r.W2Steal)
	}

	// W3: the same keys again; each must come back as the existing task.
	dup := func(ctx context.Context, i int) error {
		id, err := q.Duplicate(ctx, key(i), input(i))
		if err != nil {
			return err
		}
		if id != ids[i] {
			return fmt.Errorf("duplicate enqueue returned task %q, want the existing %q", id, ids[i])
		}
		return nil
	}
	if q.Keys() {
		if r.W3One, err = closedLoop(ctx, 0, n, 1, dup); err != nil {
			return fmt.Errorf("W3 (1 goroutine): %w", err)
		}
		logf("%s run %d: W3 1 goroutine   %8.0f tasks/s", sys.name, cfg.Run, r.W3One)
		if r.W3Many, err = closedLoop(ctx, n, 2*n, g, dup); err != nil {
			return fmt.Errorf("W3 (%d goroutines): %w", g, err)
		}
		logf("%s run %d: W3 %d goroutines %8.0f tasks/s", sys.name, cfg.Run, g, r.W3Many)
	}
	r.Seconds = time.Since(t0).Seconds()
	r.WorkCPU = selfCPU() - cpu0
	if cfg.CPUProfile != "" {
		pprof.StopCPUProfile()
	}
	if srv != nil {
		r.ServerCPU, r.ServerPSS = srv.stop()
		r.SamplerCPU = srv.samplerCPU
		r.WorkCPU -= r.SamplerCPU
	}

	// The check: close, reopen, count what is completed.
	closed = true
	if err := q.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	if r.Completed, err = q.Completed(ctx); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if r.Completed != r.Expected {
		return fmt.Errorf("check: %d tasks completed in the store, want %d", r.Completed, r.Expected)
	}
	return nil
}

// w2How says how a system's W2 runs: worklog's rows (Pebble and PostgreSQL alike) through the
// pool -worklog-pool chose (by default the runner package, 16 slots), River's through River's
// own client (its producer and executors, MaxWorkers = workers), goqite's through bench's
// pool of workers (Receive and Delete in a loop); bare Pebble has no W2.
func w2How(system, pool string) string {
	switch {
	case strings.HasPrefix(system, "worklog"):
		return "worklog " + pool
	case strings.HasPrefix(system, "river"):
		return "River client"
	case strings.HasPrefix(system, "goqite"):
		return "bench pool"
	}
	return ""
}

// selfCPU is this process's user+sys CPU seconds so far.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return tv(ru.Utime) + tv(ru.Stime)
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// vmHWM is the peak resident set size of this process in KiB.
func vmHWM() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb
		}
	}
	return 0
}

// poolResult is a W2 pool's outcome once its workers have stopped: the first error a worker
// sent, else an error unless exactly total tasks were completed.
func poolResult(errs <-chan error, completed int64, total int) error {
	select {
	case err := <-errs:
		return err
	default:
	}
	if completed != int64(total) {
		return fmt.Errorf("completed %d tasks, want %d", completed, total)
	}
	return nil
}
