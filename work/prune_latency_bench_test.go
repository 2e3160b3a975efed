package work_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// BenchmarkPruneLatency is "the writer keeps its pace" of issue 14: submit latency at a
// steady load (WORKLOG_PRUNE_RATE submits a second, default 400, open loop: a submit's
// latency counts from when it was due, so a stalled writer is not hidden by fewer submits),
// first alone, then while Queue.Prune removes a backlog of WORKLOG_PRUNE_BACKLOG settled tasks
// (default 20,000; the figures of docs/performance.md use 200,000), a quarter with an
// acknowledged completion wake. It reports p50 and p99 of both phases, their ratio (the
// issue's target: p99 during the prune within 2x of alone), and the prune's throughput in
// subjects (tasks and wakes) a second. WORKLOG_PRUNE_BUDGETS (e.g. 0,2ms,8ms) lists the
// paced group times to compare, 0 for fixed groups. The store syncs every commit (SyncAlways, the
// default). pace=off prunes in fixed groups of 256 subjects, pace=on in groups sized by time
// (prune_pace.go).
//
//	WORKLOG_PRUNE_BACKLOG=200000 go test ./work -run '^$' -bench PruneLatency -benchtime 1x -v
func BenchmarkPruneLatency(b *testing.B) {
	backlog, rate := envInt("WORKLOG_PRUNE_BACKLOG", 20_000), envInt("WORKLOG_PRUNE_RATE", 400)
	budgets := []time.Duration{0, work.DefaultPruneBudgetForBench}
	if v := os.Getenv("WORKLOG_PRUNE_BUDGETS"); v != "" { // e.g. 0,2ms,8ms: to choose the default
		budgets = nil
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(f)
			if err != nil {
				b.Fatalf("WORKLOG_PRUNE_BUDGETS: %v", err)
			}
			budgets = append(budgets, d)
		}
	}
	for _, budget := range budgets {
		name := "pace=off"
		if budget > 0 {
			name = "pace=" + budget.String()
		}
		b.Run(name, func(b *testing.B) {
			defer work.SetPruneBudget(budget)()
			if f, err := strconv.ParseFloat(os.Getenv("WORKLOG_PRUNE_PAUSE"), 64); err == nil {
				defer work.SetPrunePause(f)()
			}
			for range b.N {
				benchPruneLatency(b, backlog, rate)
			}
		})
	}
}

func benchPruneLatency(b *testing.B, backlog, rate int) {
	ctx := context.Background()
	dir := filepath.Join(b.TempDir(), "store")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	// The backlog, built without fsyncs (it is not what is measured), then reopened with
	// the default SyncAlways.
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		b.Fatal(err)
	}
	built := time.Now()
	for w := 0; w*50_000 < backlog; w++ {
		if err := retentionWindow(ctx, q, w, min(50_000, backlog-w*50_000), t0.Add(time.Duration(w)*time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
	if err := q.Close(); err != nil {
		b.Fatal(err)
	}
	b.Logf("backlog of %d settled tasks built in %.1fs", backlog, time.Since(built).Seconds())
	if q, err = work.Open(dir, nil); err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	horizon := t0.Add(time.Duration(backlog/50_000+1) * time.Hour)

	b.ResetTimer()
	// Alone: 2 s before the prune and 2 s after it, so that a slow spell of the shared disk
	// is less likely to fall on one phase only.
	alone := submitLoad(ctx, b, q, rate, horizon, func(stop <-chan struct{}) { time.Sleep(2 * time.Second) })
	var res work.PruneResult
	var pruneTook time.Duration
	during := submitLoad(ctx, b, q, rate, horizon, func(stop <-chan struct{}) {
		start := time.Now()
		var err error
		res, err = q.Prune(ctx, horizon)
		if err != nil {
			b.Error(err)
		}
		pruneTook = time.Since(start)
	})
	alone = append(alone, submitLoad(ctx, b, q, rate, horizon, func(stop <-chan struct{}) { time.Sleep(2 * time.Second) })...)
	slices.Sort(alone)
	b.StopTimer()
	if res.Tasks < backlog {
		b.Fatalf("pruned %d tasks of a backlog of %d", res.Tasks, backlog)
	}
	p50a, p99a := pct(alone, 50), pct(alone, 99)
	p50d, p99d := pct(during, 50), pct(during, 99)
	b.Logf("alone: %d submits, p50 %v p99 %v; during prune: %d submits, p50 %v p99 %v (p99 ratio %.2f); prune of %d tasks, %d wakes, %d events in %.1fs: %.0f subjects/s",
		len(alone), p50a, p99a, len(during), p50d, p99d, float64(p99d)/float64(p99a),
		res.Tasks, res.Wakes, res.Events, pruneTook.Seconds(), float64(res.Tasks+res.Wakes)/pruneTook.Seconds())
	b.ReportMetric(float64(p50a.Microseconds()), "alone-p50-µs")
	b.ReportMetric(float64(p99a.Microseconds()), "alone-p99-µs")
	b.ReportMetric(float64(p50d.Microseconds()), "prune-p50-µs")
	b.ReportMetric(float64(p99d.Microseconds()), "prune-p99-µs")
	b.ReportMetric(float64(p99d)/float64(p99a), "p99-ratio")
	b.ReportMetric(float64(res.Tasks+res.Wakes)/pruneTook.Seconds(), "subjects/s")
}

// submitLoad submits at rate a second, each submit in its own goroutine when it is due, for
// as long as phase runs, and returns the latencies, counted from when each submit was due.
func submitLoad(ctx context.Context, b *testing.B, q *work.Queue, rate int, now time.Time, phase func(stop <-chan struct{})) []time.Duration {
	stop := make(chan struct{})
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		interval := time.Second / time.Duration(rate)
		start := time.Now()
		for i := 0; ; i++ {
			due := start.Add(time.Duration(i) * interval)
			if d := time.Until(due); d > 0 {
				select {
				case <-stop:
					return
				case <-time.After(d):
				}
			}
			select {
			case <-stop:
				return
			default:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := q.Session(fmt.Sprintf("load%d", i%50))
				_, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "load", Input: json.RawMessage(`{"n":1}`)}, now)
				l := time.Since(due)
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				lat = append(lat, l)
				mu.Unlock()
			}()
		}
	}()
	phase(stop)
	close(stop)
	<-loadDone
	wg.Wait()
	slices.Sort(lat)
	return lat
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}
