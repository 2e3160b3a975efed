// Command bench runs the same queue workload on worklog and on the queues Go users would pick
// instead (River on SQLite and PostgreSQL, goqite on SQLite), plus bare Pebble synced writes as
// the engine's ceiling, and prints a table of medians and spreads.
//
// Each system runs in its own child process (this binary, re-executed with -child) on a fresh
// store in a temporary directory; runs are interleaved (every system once per run, the order
// rotated from run to run), so a slow spell of a shared disk is spread over all systems.
//
//	cd bench && go run .                  # every system but PostgreSQL, 3 runs
//	cd bench && ./run.sh                  # the same plus River on a throwaway PostgreSQL
//	go run . -quick                       # smoke run: 2,000 tasks per phase, 1 run
//	go run . -systems worklog,pebble -runs 5
//
// See docs/performance.md for the workloads, the durability of every row and results.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/worklog/worklog/work"
)

var systems = []system{
	{name: "worklog", durability: "fsync per call (Open default, SyncAlways)", open: openWorklog(work.SyncAlways)},
	{name: "worklog-nosync", durability: "no fsync (SyncNever)", open: openWorklog(work.SyncNever)},
	{name: "pebble", durability: "fsync per write (pebble.Sync)", open: openPebble},
	{name: "river-sqlite-full", durability: "SQLite WAL, synchronous=FULL (fsync per commit)", open: openRiverSQLite("FULL")},
	{name: "river-sqlite-normal", durability: "SQLite WAL, synchronous=NORMAL (no fsync per commit)", open: openRiverSQLite("NORMAL")},
	{name: "worklog-pg", durability: "PostgreSQL 15, fsync=on, synchronous_commit=on (postgres.Open)", open: openWorklogPG, needsPG: true},
	{name: "river-pg", durability: "PostgreSQL 15, fsync=on, synchronous_commit=on", open: openRiverPG, needsPG: true},
	{name: "goqite-sqlite-full", durability: "SQLite WAL, synchronous=FULL (fsync per commit)", open: openGoqite("FULL")},
	{name: "goqite-sqlite-normal", durability: "SQLite WAL, synchronous=NORMAL (no fsync per commit)", open: openGoqite("NORMAL")},
}

func systemByName(name string) (system, bool) {
	for _, s := range systems {
		if s.name == name {
			return s, true
		}
	}
	return system{}, false
}

func main() {
	var (
		child      = flag.String("child", "", "internal: run one system in this process and print a JSON line")
		dir        = flag.String("dir", "", "internal (with -child): the fresh store directory; else: where temporary directories go (default $TMPDIR)")
		run        = flag.Int("run", 0, "internal: run number")
		runs       = flag.Int("runs", 3, "runs per system, interleaved")
		n          = flag.Int("n", 20000, "tasks per W1 phase (W1 enqueues n from 1 goroutine, then n more from -workers goroutines)")
		workers    = flag.Int("workers", 16, "goroutines for the concurrent phases and workers for W2")
		quick      = flag.Bool("quick", false, "smoke run: -n 2000 -runs 1")
		only       = flag.String("systems", "", "comma-separated systems to run (default all; see -list)")
		list       = flag.Bool("list", false, "list the systems and exit")
		pgDSN      = flag.String("pg", os.Getenv("BENCH_PG_DSN"), "PostgreSQL DSN of a server to create throwaway databases on (run.sh starts one); empty skips river-pg")
		out        = flag.String("out", "", "also append every child's JSON line to this file")
		cpuprofile = flag.String("cpuprofile", "", "write a CPU profile of the timed phases to FILE.<system>.<run> (children)")
		pool       = flag.String("worklog-pool", "runner", "worklog's W2 pool: runner (the runner package, as River's rows use River's client; Prefetch = workers), runner-noprefetch (Prefetch 0), dispatch (a hand-written dispatcher claims for every idle worker, like River's producer) or each (every worker claims its own task)")
		report     = flag.String("report", "", "print the table from a file of JSON lines written by -out, and exit")
	)
	flag.Parse()
	if *quick {
		*n, *runs = 2000, 1
	}
	if *child != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		r := runChild(ctx, childConfig{System: *child, Dir: *dir, Run: *run, N: *n, Workers: *workers, PGDSN: *pgDSN, CPUProfile: *cpuprofile, WorklogPool: *pool})
		json.NewEncoder(os.Stdout).Encode(r)
		if r.Error != "" {
			os.Exit(1)
		}
		return
	}
	if *pool != "runner" && *pool != "runner-noprefetch" && *pool != "dispatch" && *pool != "each" {
		fmt.Fprintln(os.Stderr, "-worklog-pool must be runner, runner-noprefetch, dispatch or each")
		os.Exit(2)
	}
	if *report != "" {
		os.Exit(printReport(*report, *workers))
	}
	if *list {
		for _, s := range systems {
			fmt.Printf("%-22s %s\n", s.name, s.durability)
		}
		return
	}
	var chosen []system
	for _, s := range systems {
		if *only != "" && !slices.Contains(strings.Split(*only, ","), s.name) {
			continue
		}
		if s.needsPG && *pgDSN == "" {
			fmt.Fprintf(os.Stderr, "skipping %s: no PostgreSQL server (run ./run.sh, or pass -pg DSN)\n", s.name)
			continue
		}
		chosen = append(chosen, s)
	}
	if len(chosen) == 0 {
		fmt.Fprintln(os.Stderr, "no systems to run")
		os.Exit(2)
	}
	os.Exit(parent(chosen, *runs, *n, *workers, *dir, *pgDSN, *out, *cpuprofile, *pool))
}

func parent(chosen []system, runs, n, workers int, tmpBase, pgDSN, outFile, cpuprofile, pool string) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var outW io.Writer
	if outFile != "" {
		f, err := os.OpenFile(outFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer f.Close()
		outW = f
	}
	machine := describeMachine(tmpBase)
	fmt.Fprintf(os.Stderr, "%s\n%d tasks per W1 phase, %d goroutines/workers, %d run(s) of %d system(s)\n",
		machine, n, workers, runs, len(chosen))
	began := time.Now()
	var results []result
	failed := 0
	for r := 1; r <= runs; r++ {
		for i := range chosen {
			sys := chosen[(i+r-1)%len(chosen)] // rotate the order from run to run
			res := runOne(self, sys, r, n, workers, tmpBase, pgDSN, cpuprofile, pool)
			if res.Error != "" {
				failed++
				fmt.Fprintf(os.Stderr, "  %s run %d FAILED: %s\n", sys.name, r, res.Error)
			} else {
				fmt.Fprintf(os.Stderr, "  %s run %d: %.1f s, check %d/%d completed, peak RSS %d MiB, CPU %.1f s (sampling the server %.2f s more), W2 through %s\n",
					sys.name, r, res.Seconds, res.Completed, res.Expected, res.MaxRSSKiB/1024, res.CPU, res.SamplerCPU, res.W2Pool)
			}
			results = append(results, res)
			if outW != nil {
				json.NewEncoder(outW).Encode(res)
			}
		}
	}
	fmt.Printf("\n%s\n", machine)
	fmt.Printf("%d tasks per W1 phase (%d in all), %d goroutines/workers, %d interleaved run(s), %s in all\n\n",
		n, 2*n, workers, runs, time.Since(began).Round(time.Second))
	printTable(os.Stdout, chosen, results, workers)
	fmt.Println()
	printRatios(os.Stdout, results, workers)
	if failed > 0 {
		fmt.Printf("\n%d child run(s) failed: see above\n", failed)
		return 1
	}
	return 0
}

func runOne(self string, sys system, run, n, workers int, tmpBase, pgDSN, cpuprofile, pool string) result {
	res := result{System: sys.name, Durability: sys.durability, Run: run}
	dir, err := os.MkdirTemp(tmpBase, "worklog-bench-"+sys.name+"-")
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer os.RemoveAll(dir)
	args := []string{"-child", sys.name, "-dir", dir, "-run", strconv.Itoa(run),
		"-n", strconv.Itoa(n), "-workers", strconv.Itoa(workers), "-worklog-pool", pool}
	if sys.needsPG {
		args = append(args, "-pg", pgDSN)
	}
	if cpuprofile != "" {
		args = append(args, "-cpuprofile", fmt.Sprintf("%s.%s.%d", cpuprofile, sys.name, run))
	}
	cmd := exec.Command(self, args...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	fmt.Fprintf(os.Stderr, "run %d: %s (%s)\n", run, sys.name, sys.durability)
	var probe float64
	if doSettle {
		var note string
		note, probe = settle(pgDSN)
		fmt.Fprintf(os.Stderr, "  %s\n", note)
	}
	runErr := cmd.Run()
	sc := bufio.NewScanner(&stdout)
	parsed := false
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &res); err == nil {
			parsed = true
		}
	}
	if !parsed {
		res.Error = fmt.Sprintf("child printed no result (%v)", runErr)
	} else if runErr != nil && res.Error == "" {
		res.Error = runErr.Error()
	}
	res.CPUProbe = probe
	if ps := cmd.ProcessState; ps != nil {
		res.CPU = (ps.UserTime() + ps.SystemTime()).Seconds() - res.SamplerCPU
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			res.MaxRSSKiB = ru.Maxrss // KiB on Linux
		}
	}
	return res
}

// printReport prints the table from a file of results written by -out.
func printReport(file string, workers int) int {
	b, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var results []result
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err == nil {
			results = append(results, r)
		}
	}
	var chosen []system
	for _, s := range systems {
		for _, r := range results {
			if r.System == s.name {
				chosen = append(chosen, s)
				break
			}
		}
	}
	printTable(os.Stdout, chosen, results, workers)
	fmt.Println()
	printRatios(os.Stdout, results, workers)
	return 0
}

// --- table ---

type stat struct{ med, min, max float64 }

func summarize(vals []float64) (stat, bool) {
	var v []float64
	for _, x := range vals {
		if x >= 0 {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return stat{}, false
	}
	sort.Float64s(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return stat{m, v[0], v[len(v)-1]}, true
}

func rate(x float64) string {
	switch {
	case x >= 100000:
		return fmt.Sprintf("%.0fk", x/1000)
	case x >= 10000:
		return fmt.Sprintf("%.1fk", x/1000)
	default:
		return fmt.Sprintf("%.0f", x)
	}
}

func cell(vals []float64, f func(float64) string) string {
	s, ok := summarize(vals)
	if !ok {
		return "n/a"
	}
	if f(s.min) == f(s.max) {
		return f(s.med)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.med), f(s.min), f(s.max))
}

func okResults(results []result, name string) []result {
	var out []result
	for _, r := range results {
		if r.System == name && r.Error == "" {
			out = append(out, r)
		}
	}
	return out
}

func column(rs []result, f func(result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

func printTable(w io.Writer, chosen []system, results []result, workers int) {
	fmt.Fprintf(w, "tasks/s and resources: median (min–max) over the runs that passed their check\n\n")
	fmt.Fprintf(w, "| system | durability | W1 enqueue, 1 goroutine | W1 enqueue, %d goroutines | W2 work, %d workers | W3 duplicate, 1 goroutine | W3 duplicate, %d goroutines | peak RSS MiB | CPU s | runs ok |\n",
		workers, workers, workers)
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|\n")
	mib := func(x float64) string { return fmt.Sprintf("%.0f", x) }
	sec := func(x float64) string { return fmt.Sprintf("%.1f", x) }
	for _, s := range chosen {
		rs := okResults(results, s.name)
		total := 0
		for _, r := range results {
			if r.System == s.name {
				total++
			}
		}
		rss := cell(column(rs, func(r result) float64 { return float64(r.MaxRSSKiB) / 1024 }), mib)
		cpu := cell(column(rs, func(r result) float64 { return r.CPU }), sec)
		if s.needsPG && len(rs) > 0 && rs[0].ServerCPU >= 0 {
			rss += " + server " + cell(column(rs, func(r result) float64 { return float64(r.ServerPSS) / 1024 }), mib)
			cpu += " + server " + cell(column(rs, func(r result) float64 { return r.ServerCPU }), sec)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d/%d |\n", s.name, s.durability,
			cell(column(rs, func(r result) float64 { return r.W1One }), rate),
			cell(column(rs, func(r result) float64 { return r.W1Many }), rate),
			cell(column(rs, func(r result) float64 { return r.W2 }), rate),
			cell(column(rs, func(r result) float64 { return r.W3One }), rate),
			cell(column(rs, func(r result) float64 { return r.W3Many }), rate),
			rss, cpu, len(rs), total)
	}
}

// ratio pairs the two systems' results run by run (they ran in the same interleaved round)
// and summarizes the per-run ratios.
func ratio(results []result, a, b string, f func(result) float64) (stat, bool) {
	byRun := map[int]float64{}
	for _, r := range okResults(results, b) {
		byRun[r.Run] = f(r)
	}
	var v []float64
	for _, r := range okResults(results, a) {
		if d, ok := byRun[r.Run]; ok && d > 0 && f(r) >= 0 {
			v = append(v, f(r)/d)
		}
	}
	return summarize(v)
}

func printRatios(w io.Writer, results []result, workers int) {
	w2 := func(r result) float64 { return r.W2 }
	w1m := func(r result) float64 { return r.W1Many }
	w1o := func(r result) float64 { return r.W1One }
	w3m := func(r result) float64 { return r.W3Many }
	w3o := func(r result) float64 { return r.W3One }
	type target struct {
		what, a, b string
		f          func(result) float64
		min        float64
	}
	targets := []target{
		{"W2 work: worklog / River on SQLite (FULL)", "worklog", "river-sqlite-full", w2, 10},
		{"W2 work: worklog / River on PostgreSQL", "worklog", "river-pg", w2, 4},
		{fmt.Sprintf("W1 enqueue, %d goroutines: worklog / bare Pebble synced writes", workers), "worklog", "pebble", w1m, 0.8},
		{"W2 work: worklog / goqite on SQLite (FULL)", "worklog", "goqite-sqlite-full", w2, 0},
		{fmt.Sprintf("W1 enqueue, %d goroutines: worklog / River on SQLite (FULL)", workers), "worklog", "river-sqlite-full", w1m, 0},
		{fmt.Sprintf("W1 enqueue, %d goroutines: worklog / River on PostgreSQL", workers), "worklog", "river-pg", w1m, 0},
		{"W1 enqueue, 1 goroutine: worklog / bare Pebble synced writes", "worklog", "pebble", w1o, 0.9},
		{fmt.Sprintf("W3 duplicate, %d goroutines: worklog / bare Pebble Get", workers), "worklog", "pebble", w3m, 0.5},
		{"W2 work: worklog no-sync / River on SQLite (NORMAL)", "worklog-nosync", "river-sqlite-normal", w2, 0},
		// The same server, the same run: worklog on PostgreSQL against River on PostgreSQL,
		// with issue 24's targets (§1).
		{"W2 work: worklog on PostgreSQL / River on PostgreSQL", "worklog-pg", "river-pg", w2, 1.5},
		{fmt.Sprintf("W3 duplicate, %d goroutines: worklog on PostgreSQL / River on PostgreSQL", workers), "worklog-pg", "river-pg", w3m, 10},
		{"W3 duplicate, 1 goroutine: worklog on PostgreSQL / River on PostgreSQL", "worklog-pg", "river-pg", w3o, 5},
		{fmt.Sprintf("W1 enqueue, %d goroutines: worklog on PostgreSQL / River on PostgreSQL", workers), "worklog-pg", "river-pg", w1m, 2},
		{"W1 enqueue, 1 goroutine: worklog on PostgreSQL / River on PostgreSQL", "worklog-pg", "river-pg", w1o, 1.2},
	}
	fmt.Fprintf(w, "ratios, paired run by run: median (min–max) of the per-run ratios\n\n")
	fmt.Fprintf(w, "| ratio | value | target |\n|---|---|---|\n")
	x := func(v float64) string { return fmt.Sprintf("%.2f×", v) }
	for _, t := range targets {
		s, ok := ratio(results, t.a, t.b, t.f)
		if !ok {
			continue
		}
		verdict := "–"
		if t.min > 0 {
			verdict = fmt.Sprintf("≥ %.1f×: met", t.min)
			if s.med < t.min {
				verdict = fmt.Sprintf("≥ %.1f×: MISSED", t.min)
			}
		}
		v := x(s.med)
		if x(s.min) != x(s.max) {
			v = fmt.Sprintf("%s (%s–%s)", x(s.med), x(s.min), x(s.max))
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", t.what, v, verdict)
	}
}

// describeMachine says what the numbers were measured on.
func describeMachine(tmpBase string) string {
	if tmpBase == "" {
		tmpBase = os.TempDir()
	}
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb := atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%s UTC; %d CPUs (%s), %s RAM, Linux %s, %s; stores in %s (%s)",
		time.Now().UTC().Format("2006-01-02 15:04"), runtime.NumCPU(), cpu, mem, kernel,
		runtime.Version(), tmpBase, mountOf(tmpBase))
}

// mountOf names the filesystem a path is on, from /proc/mounts.
func mountOf(path string) string {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "?"
	}
	best, desc := "", "?"
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		mp := f[1]
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best, desc = mp, fmt.Sprintf("%s %s on %s", f[2], f[3], f[0])
		}
	}
	return desc
}

// doSettle: settle before each child (settle.go); BENCH_NO_SETTLE=1 turns it off, to see
// what it changes.
var doSettle = os.Getenv("BENCH_NO_SETTLE") == ""
