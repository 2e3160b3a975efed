package postgres

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/work"
)

const (
	batchMemBackendEnv = "WORKLOG_BATCHMEM_BACKEND" // memory, pebble or postgres
	batchMemTargetEnv  = "WORKLOG_BATCHMEM_TARGET"  // the Pebble directory, or the PostgreSQL DSN
	batchMemShapeEnv   = "WORKLOG_BATCHMEM_SHAPE"   // "<requests>x<input bytes>"
	// batchMemProfileEnv names a directory: each child writes its heap and CPU profiles there.
	batchMemProfileEnv = "WORKLOG_BATCHMEM_PROFILES"
)

// batchShapes are the batches TestSubmitManyMemory measures: each is a maximal batch
// (work.MaxSubmitManyBytes in all), of the most requests and of few large ones.
var batchShapes = []struct{ n, size int }{
	{work.MaxSubmitMany, work.MaxSubmitManyBytes/work.MaxSubmitMany - batchRequestOverhead},
	{work.MaxSubmitManyBytes / (64 << 10), 64<<10 - batchRequestOverhead},
	{work.MaxSubmitManyBytes / (1 << 20), 1<<20 - batchRequestOverhead},
}

// batchRequestOverhead is what a request of batchRequest counts beyond its input (its kind
// and its key: work.MaxSubmitManyBytes).
const batchRequestOverhead = 1 + 8

// TestSubmitManyMemory is the memory bound of issue 43 item 3: a maximal SubmitMany (the
// whole of work.MaxSubmitManyBytes, in requests of each shape of batchShapes) must succeed on
// every backend with the process's peak RSS growing by at most 4x the batch's bytes. Each
// batch runs in a child process (this test binary again: peak RSS is a property of a
// process, and the parent's heap must not count), compared with a child that submits a
// batch of one tiny request to the same kind of store.
func TestSubmitManyMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child processes that submit batches of 64 MiB")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory makes RSS meaningless")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads the peak RSS from /proc")
	}
	for _, backend := range []string{"memory", "pebble", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			target := func() string {
				switch backend {
				case "pebble":
					return t.TempDir()
				case "postgres":
					return pgtest.Schema(t)
				}
				return ""
			}
			base, _ := batchMemChild(t, backend, target(), 1, 16)
			for _, sh := range batchShapes {
				peak, took := batchMemChild(t, backend, target(), sh.n, sh.size)
				bytes := int64(sh.n * (sh.size + batchRequestOverhead))
				grew := peak - base
				t.Logf("%d x %d B: peak RSS %d MiB, baseline %d MiB: grew %.2fx the batch's %d MiB; SubmitMany took %v",
					sh.n, sh.size, peak>>20, base>>20, float64(grew)/float64(bytes), bytes>>20, took)
				if float64(grew) > 4*float64(bytes) {
					t.Errorf("%d x %d B: peak RSS grew by %d MiB for a batch of %d MiB (%.2fx); the bound is 4x",
						sh.n, sh.size, grew>>20, bytes>>20, float64(grew)/float64(bytes))
				}
			}
		})
	}
}

// batchMemChild runs TestSubmitManyMemoryHelperProcess and returns its peak RSS in bytes
// and how long its SubmitMany took.
func batchMemChild(t *testing.T, backend, target string, n, size int) (int64, time.Duration) {
	t.Helper()
	args := []string{"-test.run=^TestSubmitManyMemoryHelperProcess$", "-test.count=1", "-test.v"}
	if dir := os.Getenv(batchMemProfileEnv); dir != "" {
		name := fmt.Sprintf("%s/%s-%dx%d", dir, backend, n, size)
		args = append(args, "-test.memprofile="+name+".mem", "-test.memprofilerate=65536", "-test.cpuprofile="+name+".cpu")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), batchMemBackendEnv+"="+backend, batchMemTargetEnv+"="+target,
		batchMemShapeEnv+"="+fmt.Sprintf("%dx%d", n, size))
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestSubmitManyMemoryHelperProcess")) {
		t.Fatalf("child (%s, %d x %d): %v\n%s", backend, n, size, err, out)
	}
	// The child's own high-water mark (VmHWM), not the parent's rusage of it: Linux starts a
	// child's ru_maxrss at the RSS of the process it was forked from (the mm it shared until
	// exec), which here is this test binary after every test before it.
	m := regexp.MustCompile(`peak-rss (\d+) took (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("child (%s, %d x %d) reported no peak RSS:\n%s", backend, n, size, out)
	}
	peak, _ := strconv.ParseInt(string(m[1]), 10, 64)
	took, _ := strconv.ParseInt(string(m[2]), 10, 64)
	return peak, time.Duration(took)
}

// TestSubmitManyMemoryHelperProcess is not a test: it is the child of TestSubmitManyMemory.
// It opens the store, submits one batch of random inputs (random: so that no compression
// hides a copy), checks every result, and prints its peak RSS.
func TestSubmitManyMemoryHelperProcess(t *testing.T) {
	backend := os.Getenv(batchMemBackendEnv)
	if backend == "" {
		t.Skip("child process of TestSubmitManyMemory")
	}
	var n, size int
	if _, err := fmt.Sscanf(os.Getenv(batchMemShapeEnv), "%dx%d", &n, &size); err != nil {
		t.Fatal(err)
	}
	target := os.Getenv(batchMemTargetEnv)
	ctx := context.Background()
	var q *work.Queue
	var err error
	switch backend {
	case "memory":
		q = work.NewInMemory()
	case "pebble":
		q, err = work.Open(target, &work.Options{Sync: work.SyncNever})
	case "postgres":
		q, err = Open(ctx, target, nil)
	default:
		t.Fatalf("backend %q", backend)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	rs := batchRequests(n, size)
	start := time.Now()
	res, err := q.Session("s").SubmitMany(ctx, rs)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Task.ID == "" || len(r.Task.Input) != size {
			t.Fatalf("result %d: %v, %d bytes of input", i, r.Err, len(r.Task.Input))
		}
	}
	fmt.Printf("peak-rss %d took %d\n", peakRSS(t), took)
}

// batchRequests is n requests of kind "k", each with a key of 8 bytes and a random JSON
// string input of size bytes.
func batchRequests(n, size int) []work.TaskRequest {
	rng := rand.New(rand.NewPCG(1, 2))
	rs := make([]work.TaskRequest, n)
	for i := range rs {
		in := make([]byte, size)
		in[0], in[size-1] = '"', '"'
		for j := 1; j < size-1; j++ {
			in[j] = 'a' + byte(rng.IntN(26))
		}
		rs[i] = work.TaskRequest{Kind: "k", Input: in, IdempotencyKey: fmt.Sprintf("%08d", i)}
	}
	return rs
}

// peakRSS is the process's peak resident set in bytes (VmHWM).
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmHWM in /proc/self/status")
	}
	kib, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kib << 10
}

// BenchmarkSubmitBesideMaxBatch (issue 43 item 3: a large batch must not hold small submits
// behind it for seconds): one op is one maximal SubmitMany (work.MaxSubmitManyBytes, in
// requests of the shape named) while another goroutine submits one small task after another
// on the same queue, from just before the batch to its end. batch-ms is the batch's latency,
// small-max-ms and small-p50-ms the small submits' latencies (the worst, and the median),
// small/op how many ran beside it. A small submit queued behind the batch waits for the
// batch's write (one writer, group commit): small-max-ms is bounded by about batch-ms.
func BenchmarkSubmitBesideMaxBatch(b *testing.B) {
	for _, backend := range []string{"pebble", "postgres"} {
		for _, sh := range batchShapes[:2] {
			b.Run(fmt.Sprintf("backend=%s/shape=%dx%d", backend, sh.n, sh.size), func(b *testing.B) {
				ctx := context.Background()
				var q *work.Queue
				switch backend {
				case "pebble":
					var err error
					if q, err = work.Open(b.TempDir(), nil); err != nil { // SyncAlways: the default
						b.Fatal(err)
					}
					defer q.Close()
				case "postgres":
					var err error
					if q, err = Open(ctx, pgtest.Schema(b), nil); err != nil {
						b.Fatal(err)
					}
					defer q.Close()
				}
				rs := batchRequests(sh.n, sh.size)
				var lat []time.Duration
				var batchTotal time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					// Fresh keys each op: the batch makes new tasks every time.
					for j := range rs {
						rs[j].IdempotencyKey = fmt.Sprintf("%02d%06d", i%100, j)
					}
					done := make(chan struct{})
					small := make(chan []time.Duration)
					go func() {
						var ls []time.Duration
						s := q.Session(fmt.Sprintf("small-%d", i))
						for {
							select {
							case <-done:
								small <- ls
								return
							default:
							}
							t0 := time.Now()
							if _, err := s.Submit(ctx, work.TaskRequest{Kind: "small", Input: []byte(`{"n":1}`)}); err != nil {
								b.Error(err)
							}
							ls = append(ls, time.Since(t0))
						}
					}()
					time.Sleep(20 * time.Millisecond) // the small submits are under way
					t0 := time.Now()
					res, err := q.Session(fmt.Sprintf("batch-%d", i)).SubmitMany(ctx, rs)
					batchTotal += time.Since(t0)
					close(done)
					lat = append(lat, <-small...)
					if err != nil || res[len(res)-1].Err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				slices.Sort(lat)
				ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
				b.ReportMetric(ms(batchTotal)/float64(b.N), "batch-ms")
				if len(lat) > 0 {
					b.ReportMetric(ms(lat[len(lat)-1]), "small-max-ms")
					b.ReportMetric(ms(lat[len(lat)/2]), "small-p50-ms")
				}
				b.ReportMetric(float64(len(lat))/float64(b.N), "small/op")
			})
		}
	}
}
