package work_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// Queue.Follow's two figures (issue 21 §5): how fast a follower delivers the history, and how
// long an event takes from the submit call to the follower's fn. Figures go into
// docs/performance.md only from a quiet machine.

// followHistoryEvents is the history BenchmarkFollowHistory follows: submits, one event each.
const followHistoryEvents = 100_000

// BenchmarkFollowHistory: one follower reads a history of 100,000 submit events, from seq 1
// to the head, on one core (GOMAXPROCS 1, target ≥ 200k events/s): each op is one pass,
// ended by fn's error at the last event, which is Follow's path through the history (no
// wait). Stores: the in-memory queue and Pebble (warm page cache).
func BenchmarkFollowHistory(b *testing.B) {
	for _, store := range []string{"memory", "pebble"} {
		b.Run("store="+store, func(b *testing.B) {
			var q *work.Queue
			if store == "memory" {
				q = work.NewInMemory()
			} else {
				var err error
				if q, err = work.Open(filepath.Join(b.TempDir(), "store"), &work.Options{Sync: work.SyncNever}); err != nil {
					b.Fatal(err)
				}
			}
			defer q.Close()
			if err := submitN(q, followHistoryEvents, 16); err != nil {
				b.Fatal(err)
			}
			benchFollowHistory(b, q)
		})
	}
}

func benchFollowHistory(b *testing.B, q *work.Queue) {
	ctx := context.Background()
	done := errors.New("at the head")
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	runtime.GC()
	total := 0
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		err := q.Follow(ctx, 1, func(ev events.Event) error {
			total++
			if ev.Head().Seq == followHistoryEvents {
				return done
			}
			return nil
		})
		if err != done {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "events/s")
}

// BenchmarkFollowLatency: a follower waits at the head of a queue; each op submits one task
// (one caller) and waits until the follower's fn has it. submit-to-follower is the time from
// the Submit call to fn (p50, p99; target for the console's live tail: commit → browser ≤
// 200 ms p99); return-to-follower from Submit's return to fn, which may be negative: Pebble's
// followers may see an event as soon as its fsync returned, before its caller is answered.
// Stores: in-memory, and Pebble with the default SyncAlways (an fsync per submit).
func BenchmarkFollowLatency(b *testing.B) {
	for _, store := range []string{"memory", "pebble"} {
		b.Run("store="+store, func(b *testing.B) {
			var q *work.Queue
			if store == "memory" {
				q = work.NewInMemory()
			} else {
				var err error
				if q, err = work.Open(filepath.Join(b.TempDir(), "store"), nil); err != nil {
					b.Fatal(err)
				}
			}
			defer q.Close()
			benchFollowLatency(b, q)
		})
	}
}

func benchFollowLatency(b *testing.B, q *work.Queue) {
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan time.Time, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- q.Follow(ctx, 1, func(events.Event) error { got <- time.Now(); return nil })
	}()
	s := q.Session("latency")
	called := make([]time.Duration, 0, b.N)
	returned := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := s.Submit(ctx, benchRequest); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		at := <-got
		called = append(called, at.Sub(t0))
		returned = append(returned, at.Sub(t1))
	}
	b.StopTimer()
	cancel()
	if err := <-ended; err != context.Canceled {
		b.Fatalf("the follower ended with %v", err)
	}
	slices.Sort(called)
	slices.Sort(returned)
	b.ReportMetric(float64(percentile(called, 0.50).Nanoseconds())/1e3, "submit-to-follower-p50-µs")
	b.ReportMetric(float64(percentile(called, 0.99).Nanoseconds())/1e3, "submit-to-follower-p99-µs")
	b.ReportMetric(float64(percentile(returned, 0.50).Nanoseconds())/1e3, "return-to-follower-p50-µs")
}
