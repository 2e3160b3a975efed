package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// Latency of the runner on a durable store (work.Open's defaults: every call fsynced), with
// an idle runner waiting for work (issue 13 §4). Benchmarks, not timed tests: each reports
// its figures with b.ReportMetric.
//
//	go test -run '^$' -bench 'Runner' -benchtime 2000x .

// idleRunner opens a durable store in a temporary directory and starts a runner of kind
// "lat" with 16 slots whose handler sends its start time on the returned channel.
func idleRunner(b *testing.B) (*work.Queue, <-chan time.Time) {
	b.Helper()
	q, err := work.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	started := make(chan time.Time, 1024)
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{"lat": func(context.Context, work.Task) (json.RawMessage, error) {
			started <- time.Now()
			return nil, nil
		}},
		Concurrency: 16,
		LeaseFor:    time.Minute,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		r.Stop(context.Background())
		q.Close()
	})
	time.Sleep(50 * time.Millisecond) // the runner found nothing and waits
	return q, started
}

// reportPercentiles reports p50, p99 and the maximum of ds in milliseconds.
func reportPercentiles(b *testing.B, prefix string, ds []time.Duration) {
	slices.Sort(ds)
	at := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))]) / 1e6
	}
	b.ReportMetric(at(0.50), prefix+"p50-ms")
	b.ReportMetric(at(0.99), prefix+"p99-ms")
	b.ReportMetric(float64(ds[len(ds)-1])/1e6, prefix+"max-ms")
}

// BenchmarkRunnerStartLatency: one task at a time, from the moment Submit is called (so its
// fsync is included, and the claim's) to the moment its handler starts, on an idle runner.
func BenchmarkRunnerStartLatency(b *testing.B) {
	q, started := idleRunner(b)
	s := q.Session("lat")
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	fromReturn := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "lat"}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		st := <-started
		lat = append(lat, st.Sub(t0))
		fromReturn = append(fromReturn, max(st.Sub(t1), 0))
		time.Sleep(time.Millisecond) // the runner records the result and waits again: idle
	}
	b.StopTimer()
	reportPercentiles(b, "submit-start-", lat)
	reportPercentiles(b, "return-start-", fromReturn)
}

// BenchmarkRunnerScheduledDelay: a task scheduled 20 ms ahead, one at a time; the delay from
// its scheduled time to its handler's start (the runner's timer, then the claim's fsync).
func BenchmarkRunnerScheduledDelay(b *testing.B) {
	q, started := idleRunner(b)
	s := q.Session("lat")
	ctx := context.Background()
	delay := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		runAt := time.Now().Add(20 * time.Millisecond)
		if _, err := s.Submit(ctx, work.TaskRequest{Kind: "lat", RunAt: runAt}); err != nil {
			b.Fatal(err)
		}
		st := <-started
		if st.Before(runAt) {
			b.Fatalf("a task started %v before its time", runAt.Sub(st))
		}
		delay = append(delay, st.Sub(runAt))
	}
	b.StopTimer()
	reportPercentiles(b, "late-", delay)
}

// BenchmarkRunnerIdleCPU: the CPU this process uses (user+sys, the store's background work
// included) while a runner waits on an empty durable store, as a share of one core.
func BenchmarkRunnerIdleCPU(b *testing.B) {
	idleRunner(b)
	b.ResetTimer()
	cpu0, t0 := selfCPU(), time.Now()
	for range b.N {
		time.Sleep(100 * time.Millisecond)
	}
	cpu, el := selfCPU()-cpu0, time.Since(t0).Seconds()
	b.StopTimer()
	b.ReportMetric(100*cpu/el, "cpu-%-of-core")
}
