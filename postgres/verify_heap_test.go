package postgres

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

// BenchmarkVerifyHeap (issue 24 §5, target: 100,000 tasks verified with at most 64 MiB of
// heap): Verify of a queue of WORKLOG_VERIFY_HEAP_TASKS tasks (default 100,000: a third
// settled, a third running, the rest pending; inputs of 100 bytes, in 5 sessions and 4
// kinds), by a read-only Store opened after the queue was filled and closed. The heap is
// sampled (runtime.ReadMemStats' HeapInuse every 5 ms) from a baseline taken after a GC;
// the peak rise is reported as MiB-peak-heap. It is a figure of memory, not of time, so the
// machine's load does not spoil it (HeapInuse includes garbage the collector has not yet
// taken, at GOGC=100). Filling takes minutes; the verify itself seconds.
//
//	go test ./postgres -run '^$' -bench VerifyHeap -benchtime 1x -timeout 30m -v
func BenchmarkVerifyHeap(b *testing.B) {
	n := envInt("WORKLOG_VERIFY_HEAP_TASKS", 100_000)
	dsn := pgtest.Schema(b)
	ctx := context.Background()
	t0 := time.Now()
	fillForVerify(b, dsn, n)
	b.Logf("filled %d tasks in %v", n, time.Since(t0).Round(time.Second))
	st, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	last, err := st.LastSeq(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var worst uint64
	start := time.Now()
	for range b.N {
		peak, problems, err := verifyPeakHeap(func() ([]string, error) { return st.Verify(ctx, VerifyOptions{}) })
		if err != nil || len(problems) > 0 {
			b.Fatalf("Verify: %v, %v", problems, err)
		}
		worst = max(worst, peak)
	}
	elapsed := time.Since(start)
	b.Logf("Verify of %d tasks (%d events): peak heap %.1f MiB above the baseline", n, last, float64(worst)/(1<<20))
	b.ReportMetric(float64(worst)/(1<<20), "MiB-peak-heap")
	// The events a second include the server's work (the client reads the log and the
	// projection tables through COPY): on a loaded machine both share its cores.
	b.ReportMetric(float64(last)*float64(b.N)/elapsed.Seconds(), "events/s")
}

// TestVerifyHeap (issue 24 §5): Verify of 100,000 tasks (WORKLOG_VERIFY_HEAP_TASKS) holds at
// most 32 MiB of live heap above the baseline: with GOGC=100's garbage, the 64 MiB of heap
// that BenchmarkVerifyHeap measures (HeapInuse). The check was on HeapInuse until a run under
// stress measured 65.1 MiB: the load does not change what Verify allocates, only when the
// collector runs, and a starved collector let more garbage pile up; the spread over runs is in
// docs/performance.md. With the fold held in a
// projection.Mem it was 236 MiB at 100,000 tasks and 73 MiB at 30,000; with the scratch
// store (verify_spill.go) it does not grow with the queue (~25–28 MiB at either size).
// Filling the queue takes minutes: skipped with -short. Skipped under the race detector:
// there the heap is not the product's (a whole-package race run measured 113 MiB, a run
// alone passed; not investigated further).
func TestVerifyHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 100,000 tasks")
	}
	if raceEnabled {
		t.Skip("the heap under the race detector is not the product's")
	}
	// The bound is on the live heap: half the target's 64 MiB, which GOGC=100 lets the heap
	// reach with its garbage (BenchmarkVerifyHeap reports HeapInuse, the target's measure).
	// Holding the whole fold, as Verify did before, is far above it either way.
	const bound = 32 << 20
	n := envInt("WORKLOG_VERIFY_HEAP_TASKS", 100_000)
	dsn := pgtest.Schema(t)
	ctx := context.Background()
	fillForVerify(t, dsn, n)
	st, err := OpenReadOnly(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	inuse, live, problems, err := verifyPeaks(func() ([]string, error) { return st.Verify(ctx, VerifyOptions{}) })
	if err != nil || len(problems) > 0 {
		t.Fatalf("Verify: %v, %v", problems, err)
	}
	t.Logf("Verify of %d tasks: peak heap %.1f MiB above the baseline, live heap %.1f MiB", n, float64(inuse)/(1<<20), float64(live)/(1<<20))
	if live > bound {
		t.Errorf("Verify of %d tasks peaked at %.1f MiB of live heap, above %d MiB", n, float64(live)/(1<<20), bound>>20)
	}
}

// verifyPeakHeap runs verify and returns how far HeapInuse rose above its value after a GC.
func verifyPeakHeap(verify func() ([]string, error)) (uint64, []string, error) {
	inuse, _, problems, err := verifyPeaks(verify)
	return inuse, problems, err
}

// verifyPeaks runs verify and returns how far HeapInuse and the live heap (the heap marked
// live by the last GC, runtime/metrics' /gc/heap/live:bytes) rose above their values after a
// GC. HeapInuse holds garbage too, as much as the collector let pile up: under load, with
// its workers starved of CPU, more (65.1 MiB in one of 20 whole-package runs under stress,
// 25–28 MiB otherwise). The live heap is what Verify holds, whenever the collector runs.
func verifyPeaks(verify func() ([]string, error)) (inuse, live uint64, problems []string, err error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	baseLive := sample[0].Value.Uint64()
	var peak, peakLive uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			metrics.Read(s)
			peakLive = max(peakLive, s[0].Value.Uint64())
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	problems, err = verify()
	close(stop)
	wg.Wait()
	return max(peak, base) - base, max(peakLive, baseLive) - baseLive, problems, err
}

// fillForVerify submits n tasks to the queue of dsn, claims two thirds and settles half of
// those. Each batch is submitted a millisecond after the one before, as a caller's clock
// would: at one instant for all, every id of a later batch (UUIDv7: the millisecond, then
// random bits) would fall below the greatest stored one, and the writer would read each
// (10,000 round trips in one group, 4–18 s at a load average of 10: at higher load, past the
// writer's 30 s WriteTimeout, design §7.6).
func fillForVerify(t testing.TB, dsn string, n int) {
	ctx := context.Background()
	_, q := openEngine(t, dsn, nil)
	defer q.Close()
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	input := []byte(`{"payload":"` + strings.Repeat("x", 86) + `"}`) // 100 bytes
	for i := 0; i < n; i += work.MaxSubmitMany {
		rs := make([]work.TaskRequest, min(work.MaxSubmitMany, n-i))
		for j := range rs {
			rs[j] = work.TaskRequest{Kind: fmt.Sprintf("k%d", (i+j)%4), Input: input}
		}
		if _, err := q.Session(fmt.Sprintf("s%d", (i/work.MaxSubmitMany)%5)).SubmitManyAt(ctx, rs, t0.Add(time.Duration(i/work.MaxSubmitMany)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	for claimed := 0; claimed < 2*n/3; {
		ds, err := q.ClaimDueAt(ctx, t0.Add(time.Minute), time.Hour, min(256, 2*n/3-claimed))
		if err != nil || len(ds) == 0 {
			t.Fatalf("claim: %d, %v", len(ds), err)
		}
		var wg sync.WaitGroup // the finishes of a claim at once: the writer groups them
		for k, d := range ds {
			if (claimed+k)%2 == 0 {
				wg.Go(func() {
					if _, err := q.FinishAt(ctx, d, work.Success([]byte(`"ok"`)), t0.Add(2*time.Minute)); err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		claimed += len(ds)
	}
}
