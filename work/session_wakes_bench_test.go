package work_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// BenchmarkClaimSessionWakes: one op is a ClaimSessionWakesAt of one session's 10 wakes
// (limit 10; every op's clock is past the last op's leases, so the same 10 are delivered
// again), in a queue that also holds `others` pending wakes of 1,000 other sessions, all
// available before the chosen session's: a claim that filtered the queue-wide index would
// read all of them first. On the in-memory queue and on a Pebble store (SyncNever, setup
// by 8 concurrent callers). The figure to compare is ns/op (and allocs/op) between
// others=0 and others=100000, which the per-session index should keep close: a claim reads
// the chosen session's range only. Figures are pending a quiet machine.
func BenchmarkClaimSessionWakes(b *testing.B) {
	for _, backend := range []string{"mem", "pebble"} {
		for _, others := range []int{0, 100_000} {
			b.Run(fmt.Sprintf("backend=%s/others=%d", backend, others), func(b *testing.B) {
				var q *work.Queue
				if backend == "mem" {
					q = work.NewInMemory()
				} else {
					var err error
					if q, err = work.Open(b.TempDir(), &work.Options{Sync: work.SyncNever}); err != nil {
						b.Fatal(err)
					}
				}
				defer q.Close()
				benchClaimSessionWakes(b, q, others)
			})
		}
	}
}

func benchClaimSessionWakes(b *testing.B, q *work.Queue, others int) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const callers = 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < others; i += callers {
				if _, err := q.Session(fmt.Sprintf("other-%04d", i%1000)).WakeAt(ctx, work.WakeRequest{}, t0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	mine := []string{"mine"}
	for range 10 {
		if _, err := q.Session(mine[0]).WakeAt(ctx, work.WakeRequest{}, t0.Add(time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	const leaseFor = time.Second
	now := t0.Add(time.Second)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		ds, err := q.ClaimSessionWakesAt(ctx, mine, now, leaseFor, 10)
		if err != nil {
			b.Fatal(err)
		}
		if len(ds) != 10 {
			b.Fatalf("claimed %d wakes, want the session's 10", len(ds))
		}
		now = now.Add(leaseFor)
	}
}
