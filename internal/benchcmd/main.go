// Command benchcmd helps worklog's benchmarks (work/bench_test.go, docs/performance.md).
//
//	benchcmd rss -dir STORE [-submit 10000] [-reads 100000]
//
// runs in its own process so that its resident memory is the store's and nothing else's. It
// opens the durable store in STORE with default options (SyncAlways, 64 MiB block cache,
// 32 MiB memtables), reads the whole event log once (keeping every 100th task id), submits
// -submit tasks from 64 callers, claims and finishes them with 16 workers (limit 16), reads
// -reads tasks by id at random, and prints one line of key=value pairs: VmRSS and VmHWM
// (peak) from /proc/self/status, the Go heap in use and the memory the Go runtime holds, in
// MB (2^20 bytes), then closes the store.
//
//	benchcmd ratios [-big 1M] < bench.txt
//
// reads `go test -bench` output of several rounds (one process each, as run.sh does) and
// prints the ratio table of docs/performance.md: each figure against its same-run baseline,
// as the median over rounds of the per-round ratio (and, beside it, the ratio of the
// medians), whether its target is met (judged on the paired median), then the median, min and
// max of every metric of every benchmark.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchcmd rss -dir STORE | benchcmd ratios < bench.txt")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "rss":
		err = rss(os.Args[2:])
	case "ratios":
		err = ratios(os.Args[2:], os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchcmd:", err)
		os.Exit(1)
	}
}

// --- rss ---

// input is the benchmarks' 200-byte JSON input (work/bench_test.go benchInput).
var input = func() json.RawMessage {
	s := `{"image":"s3://worklog-bench/uploads/2026/11/30/cover-000123.png","sizes":[64,128,256,512],"format":"webp","quality":82,"owner":"user_7f3a9c2e","note":"`
	s += strings.Repeat("x", 200-len(s)-2)
	return json.RawMessage(s + `"}`)
}()

var output = json.RawMessage(`{"thumb":"s3://worklog-bench/thumbs/cover-000123-64.webp","bytes":18211}`)

func rss(args []string) error {
	fs := flag.NewFlagSet("rss", flag.ExitOnError)
	dir := fs.String("dir", "", "store directory")
	submit := fs.Int("submit", 10000, "tasks to submit, claim and finish")
	reads := fs.Int("reads", 100000, "tasks to read by id")
	fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("rss: -dir is required")
	}
	ctx := context.Background()
	start := time.Now()
	q, err := work.Open(*dir, nil)
	if err != nil {
		return err
	}
	defer q.Close()

	type ref struct{ session, id string }
	var refs []ref
	var nEvents, nTasks int
	err = q.ReadLog(ctx, 1, func(ev events.Event) error {
		nEvents++
		if s, ok := ev.(*events.TaskSubmitted); ok {
			if nTasks%100 == 0 {
				refs = append(refs, ref{s.SessionID, s.TaskID})
			}
			nTasks++
		}
		return nil
	})
	if err != nil {
		return err
	}

	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	for w := range 64 {
		s := q.Session(fmt.Sprintf("session-%03d", w))
		wg.Go(func() {
			for next.Add(1) <= int64(*submit) {
				if _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "thumbnail", Input: input}, time.Now()); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for range 16 {
		wg.Go(func() {
			for {
				ds, err := q.ClaimDueAt(ctx, time.Now(), time.Hour, 16)
				if err != nil || len(ds) == 0 {
					if err != nil {
						fail(err)
					}
					return
				}
				for _, d := range ds {
					if _, err := q.FinishAt(ctx, d, work.Success(output), time.Now()); err != nil {
						fail(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range *reads {
		if len(refs) == 0 {
			break
		}
		x := refs[r.IntN(len(refs))]
		if _, ok, err := q.Session(x.session).Task(ctx, x.id); err != nil || !ok {
			return fmt.Errorf("reading task %s: found %v, %v", x.id, ok, err)
		}
	}

	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	const mb = 1 << 20
	fmt.Printf("events=%d tasks=%d rss_mb=%.1f hwm_mb=%.1f goheap_mb=%.1f gosys_mb=%.1f seconds=%.1f\n",
		nEvents, nTasks, procKB(status, "VmRSS")/1024, procKB(status, "VmHWM")/1024,
		float64(ms.HeapInuse)/mb, float64(ms.Sys)/mb, time.Since(start).Seconds())
	return nil
}

func procKB(status []byte, field string) float64 {
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				v, _ := strconv.ParseFloat(f[0], 64)
				return v
			}
		}
	}
	return -1
}

// --- ratios ---

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// samples maps benchmark name (without the GOMAXPROCS suffix) and unit to every value seen.
type samples map[string]map[string][]float64

func parseBench(r io.Reader) (samples, error) {
	s := samples{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			if s[m[1]] == nil {
				s[m[1]] = map[string][]float64{}
			}
			s[m[1]][f[i+1]] = append(s[m[1]][f[i+1]], v)
		}
	}
	return s, sc.Err()
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

type ratioRow struct {
	what     string
	num, den string // benchmark name, or "=value" for a constant
	unit     string
	denUnit  string // "" means unit
	target   string // ">=0.8", "<=1.5" or ""
}

func ratios(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("ratios", flag.ExitOnError)
	big := fs.String("big", "1M", "name of the big settled store in the benchmark names")
	fs.Parse(args)
	s, err := parseBench(in)
	if err != nil {
		return err
	}
	B := *big
	rows := []ratioRow{
		{what: "submit, 1 caller: worklog / bare Pebble", num: "Submit/callers=1/store=worklog", den: "Submit/callers=1/store=pebble", unit: "ops/s", target: ">=0.8"},
		{what: "submit, 64 callers: worklog / bare Pebble", num: "Submit/callers=64/store=worklog", den: "Submit/callers=64/store=pebble", unit: "ops/s", target: ">=1.0"},
		{what: "submit, 1 caller: worklog / bare Pebble writing a submit's keys", num: "Submit/callers=1/store=worklog", den: "Submit/callers=1/store=pebble-submitkeys", unit: "ops/s"},
		{what: "submit, 64 callers: worklog / bare Pebble writing a submit's keys", num: "Submit/callers=64/store=worklog", den: "Submit/callers=64/store=pebble-submitkeys", unit: "ops/s"},
		{what: "submit, 64 callers: bare Pebble writing a submit's keys / bare Pebble, one value", num: "Submit/callers=64/store=pebble-submitkeys", den: "Submit/callers=64/store=pebble", unit: "ops/s"},
		{what: "submit, 64 callers: WAL bytes per call, worklog / bare Pebble", num: "Submit/callers=64/store=worklog", den: "Submit/callers=64/store=pebble", unit: "wal-B/op"},
		{what: "submit, 64 callers: mean WAL sync time, worklog / bare Pebble", num: "Submit/callers=64/store=worklog", den: "Submit/callers=64/store=pebble", unit: "sync-µs"},
		{what: "submit, 64 callers: calls per WAL sync, worklog / bare Pebble", num: "Submit/callers=64/store=worklog", den: "Submit/callers=64/store=pebble", unit: "calls/walsync"},
		{what: "submit, 64 callers: CPU per call, worklog / bare Pebble", num: "Submit/callers=64/store=worklog", den: "Submit/callers=64/store=pebble", unit: "cpu-µs/op"},
		{what: "submit, 256 callers: worklog / bare Pebble", num: "Submit/callers=256/store=worklog", den: "Submit/callers=256/store=pebble", unit: "ops/s"},
		{what: "submit, 256 callers: worklog / raw write+fdatasync", num: "Submit/callers=256/store=worklog", den: "Submit/callers=256/store=rawgc", unit: "ops/s"},
		{what: "submit, 256 callers: bare Pebble / raw write+fdatasync", num: "Submit/callers=256/store=pebble", den: "Submit/callers=256/store=rawgc", unit: "ops/s"},
		{what: "claim+finish, 16 workers, limit 1: jobs/s / bare Pebble synced writes/s at 16", num: "ClaimFinish/workers=16/limit=1", den: "ClaimFinish/workers=16/pebble-synced-write", unit: "jobs/s", denUnit: "ops/s"},
		{what: "claim+finish, 16 workers, limit 16: jobs/s / bare Pebble synced writes/s at 16", num: "ClaimFinish/workers=16/limit=16", den: "ClaimFinish/workers=16/pebble-synced-write", unit: "jobs/s", denUnit: "ops/s"},
		{what: "claim latency (mean), SyncNever: " + B + " settled / 1k settled", num: "ClaimLatency/sync=never/settled=" + B, den: "ClaimLatency/sync=never/settled=1k", unit: "claim-µs", target: "<=1.5"},
		{what: "claim latency (p50), SyncNever: " + B + " / 1k", num: "ClaimLatency/sync=never/settled=" + B, den: "ClaimLatency/sync=never/settled=1k", unit: "claim-p50-µs", target: "<=1.5"},
		{what: "claim latency (mean), SyncAlways: " + B + " settled / 1k settled", num: "ClaimLatency/sync=always/settled=" + B, den: "ClaimLatency/sync=always/settled=1k", unit: "claim-µs", target: "<=1.5"},
		{what: "claim latency (p50), SyncAlways: " + B + " / 1k", num: "ClaimLatency/sync=always/settled=" + B, den: "ClaimLatency/sync=always/settled=1k", unit: "claim-p50-µs", target: "<=1.5"},
		{what: "rebuild, decode+apply (the log's bytes in memory, 1 core) / 1,000,000 events/s", num: "Rebuild/step=fold", den: "=1000000", unit: "events/s", target: ">=1.0"},
		{what: "rebuild, decode+apply per CPU-second / 1,000,000 events/s", num: "Rebuild/step=fold", den: "=1000000", unit: "events/cpu-s", target: ">=1.0"},
		{what: "rebuild with Pebble's read (read+decode+apply as the library folds, 1 core) / 1,000,000 events/s", num: "Rebuild/step=apply-sized", den: "=1000000", unit: "events/s", target: ">=1.0"},
		{what: "rebuild with Pebble's read, plain NewMem (unsized, indexes kept) / 1,000,000 events/s", num: "Rebuild/step=apply", den: "=1000000", unit: "events/s"},
		{what: "bare Pebble scan of the log alone (1 core) / 1,000,000 events/s", num: "Rebuild/step=scan", den: "=1000000", unit: "events/s"},
		{what: "rebuild: read+decode+apply / bare Pebble scan", num: "Rebuild/step=apply", den: "Rebuild/step=scan", unit: "events/s"},
		{what: "rebuild: read+decode / bare Pebble scan", num: "Rebuild/step=decode", den: "Rebuild/step=scan", unit: "events/s"},
		{what: "peak RSS (VmHWM), " + B + " settled / 200 MB", num: "RSS/settled=" + B, den: "=200", unit: "hwm-MB", target: "<=1.0"},
		{what: "RSS at the end (VmRSS), " + B + " settled / 200 MB", num: "RSS/settled=" + B, den: "=200", unit: "rss-MB", target: "<=1.0"},
		{what: "peak RSS, " + B + " settled / 1k settled", num: "RSS/settled=" + B, den: "RSS/settled=1k", unit: "hwm-MB"},
	}
	fmt.Fprintln(out, "| ratio | paired median (min–max over rounds) | ratio of medians | numerator: median (min–max, n) | denominator | target | met |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		nv := s["Benchmark"+r.num][r.unit]
		if len(nv) == 0 {
			continue
		}
		du := r.denUnit
		if du == "" {
			du = r.unit
		}
		var dv []float64
		var dtext string
		if c, isConst := strings.CutPrefix(r.den, "="); isConst {
			x, _ := strconv.ParseFloat(c, 64)
			for range nv {
				dv = append(dv, x)
			}
			dtext = c + " " + du
		} else {
			dv = s["Benchmark"+r.den][du]
			if len(dv) == 0 {
				continue
			}
			dtext = fmt.Sprintf("%s %s (%s–%s, %d) `%s`", num(median(dv)), du, num(slices.Min(dv)), num(slices.Max(dv)), len(dv), r.den)
		}
		// Paired: the i-th sample of each comes from the same round (one process each), so
		// their ratio cancels that round's disk and CPU weather.
		paired := "–"
		ratio := median(nv) / median(dv)
		if len(nv) == len(dv) {
			rs := make([]float64, len(nv))
			for i := range nv {
				rs[i] = nv[i] / dv[i]
			}
			ratio = median(rs)
			paired = fmt.Sprintf("**%.2f×** (%.2f–%.2f)", ratio, slices.Min(rs), slices.Max(rs))
		}
		met := ""
		switch {
		case strings.HasPrefix(r.target, ">="):
			t, _ := strconv.ParseFloat(r.target[2:], 64)
			met = yesNo(ratio >= t)
		case strings.HasPrefix(r.target, "<="):
			t, _ := strconv.ParseFloat(r.target[2:], 64)
			met = yesNo(ratio <= t)
		}
		fmt.Fprintf(out, "| %s | %s | %.2f× | %s %s (%s–%s, %d) `%s` | %s | %s | %s |\n",
			r.what, paired, median(nv)/median(dv), num(median(nv)), r.unit, num(slices.Min(nv)), num(slices.Max(nv)), len(nv), r.num, dtext, r.target, met)
	}

	fmt.Fprintln(out)
	fmt.Fprintln(out, "| benchmark | unit | median | min | max | n |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|")
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		units := make([]string, 0, len(s[n]))
		for u := range s[n] {
			units = append(units, u)
		}
		slices.Sort(units)
		for _, u := range units {
			v := s[n][u]
			fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %d |\n", strings.TrimPrefix(n, "Benchmark"), u,
				num(median(v)), num(slices.Min(v)), num(slices.Max(v)), len(v))
		}
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

// num prints 3 significant digits, with k and M for large values.
func num(v float64) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case a >= 10e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case a >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case a >= 10e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	case a >= 1e3:
		return fmt.Sprintf("%.2fk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
