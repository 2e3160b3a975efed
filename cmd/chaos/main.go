// Command chaos is worklog's Jepsen-style test: several client processes run a random
// workload (submits with and without keys, claims by kind with short leases, settles,
// releases, extends, cancels, retries, wakes and acknowledgments, kinds with MaxRunning,
// and handlers run by package runner) while a nemesis chosen from a seed kills, pauses and
// partitions them and restarts the server; every operation's invocation and completion is
// recorded, and at the end a checker holds the histories against what the API promises, and
// against the store's own log and Verify (docs/failure-model.md §7.10).
//
//	chaos --backend both --duration 1m --seed 7
//
// It prints one line, "N operations, M anomalies, seed S", and exits 0 only when M is 0;
// a failing run is replayed by its seed (the nemesis's schedule and the workload's choices
// come from it; the processes' timing does not). Histories, the server's and the clients'
// logs and an HTML view of each anomalous partition (porcupine's) stay in --out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

type config struct {
	duration time.Duration
	nemeses  []string
	backend  string
	seed     int64
	clients  int
	maxOps   int
	out      string
	skew     time.Duration // the largest clock skew given to a client's At twins
	margin   time.Duration // how far two holders' handler intervals may overlap
	keep     bool
}

var allNemeses = []string{"kill", "pause", "partition", "restart", "terminate", "skew"}

func main() {
	switch os.Getenv(envRole) {
	case "client":
		os.Exit(clientMain())
	case "owner":
		os.Exit(ownerMain())
	}
	var cfg config
	var nem string
	flag.DurationVar(&cfg.duration, "duration", 30*time.Second, "how long the nemesis runs (per backend; both backends run at once)")
	flag.StringVar(&nem, "nemesis", strings.Join(allNemeses, ","), "the faults to choose from: "+strings.Join(allNemeses, ",")+" (or none)")
	flag.StringVar(&cfg.backend, "backend", "both", "pebble, postgres or both")
	flag.Int64Var(&cfg.seed, "seed", 0, "the seed (0: from the time)")
	flag.IntVar(&cfg.clients, "clients", 4, "client processes (PostgreSQL) or goroutine groups of the owning process (Pebble), 3..5 recommended")
	flag.IntVar(&cfg.maxOps, "max-ops", 1_000_000, "at most this many operations per client incarnation")
	flag.StringVar(&cfg.out, "out", "", "directory for histories and reports (default: a temporary one, removed after a clean run)")
	flag.DurationVar(&cfg.skew, "skew", 200*time.Millisecond, "the largest clock skew of a client's At twins (nemesis skew)")
	flag.DurationVar(&cfg.margin, "margin", 250*time.Millisecond, "the overlap of two holders' handler intervals tolerated beyond the skew")
	flag.Parse()
	if nem != "none" && nem != "" {
		cfg.nemeses = strings.Split(nem, ",")
	}
	for _, n := range cfg.nemeses {
		if !contains(allNemeses, n) {
			fmt.Fprintf(os.Stderr, "chaos: unknown nemesis %q (want some of %s)\n", n, strings.Join(allNemeses, ","))
			os.Exit(2)
		}
	}
	if cfg.backend != "pebble" && cfg.backend != "postgres" && cfg.backend != "both" {
		fmt.Fprintf(os.Stderr, "chaos: --backend %q: want pebble, postgres or both\n", cfg.backend)
		os.Exit(2)
	}
	if cfg.clients < 1 || cfg.clients > 16 {
		fmt.Fprintln(os.Stderr, "chaos: --clients must be in 1..16")
		os.Exit(2)
	}
	if cfg.seed == 0 {
		cfg.seed = time.Now().UnixNano() % 1_000_000_007
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res := run(ctx, cfg, os.Stdout)
	fmt.Println(res.summary())
	if res.anomalies > 0 || res.err != nil {
		os.Exit(1)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

type result struct {
	ops, anomalies int
	seed           int64
	err            error
	skipped        []string
}

func (r result) summary() string {
	s := fmt.Sprintf("%d operations, %d anomalies, seed %d", r.ops, r.anomalies, r.seed)
	if r.err != nil {
		s += fmt.Sprintf(" (error: %v)", r.err)
	}
	return s
}

// run runs the backends cfg names (both at once) and checks them.
func run(ctx context.Context, cfg config, w *os.File) result {
	out := cfg.out
	temp := out == ""
	if temp {
		var err error
		if out, err = os.MkdirTemp("", "chaos-"); err != nil {
			return result{seed: cfg.seed, err: err}
		}
	}
	backends := []string{cfg.backend}
	if cfg.backend == "both" {
		backends = []string{"pebble", "postgres"}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	total := result{seed: cfg.seed}
	for _, b := range backends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := out + "/" + b
			os.MkdirAll(dir, 0o755)
			r := runBackend(ctx, cfg, b, dir)
			mu.Lock()
			defer mu.Unlock()
			if r.err != nil && total.err == nil {
				total.err = fmt.Errorf("%s: %w", b, r.err)
			}
			total.ops += r.ops
			total.anomalies += r.anomalies
			total.skipped = append(total.skipped, r.skipped...)
			fmt.Fprintf(w, "%s: %s\n", b, r.summary())
		}()
	}
	wg.Wait()
	if ctx.Err() != nil && total.err == nil {
		total.err = ctx.Err()
	}
	if temp && total.anomalies == 0 && total.err == nil && !cfg.keep {
		os.RemoveAll(out)
	} else {
		fmt.Fprintf(w, "histories and reports: %s\n", out)
	}
	return total
}
