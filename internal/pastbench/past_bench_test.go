package pastbench

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/storegen"
	"github.com/worklog/worklog/pebblelog"
	"github.com/worklog/worklog/work"
)

func store(b *testing.B) (dir string, last uint64) {
	b.Helper()
	dir = storegen.Dir(b, storegen.TasksFromEnv(b, 20_000))
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if last, err = st.LastSeq(context.Background()); err != nil {
		b.Fatal(err)
	}
	return dir, last
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report adds the figures that hold under load beside ns/op: events a second of wall time
// and the CPU-seconds each pass took (both cores' worth: their ratio is the parallelism).
func report(b *testing.B, events uint64, wall, cpu time.Duration) {
	n := float64(b.N)
	b.ReportMetric(float64(events)*n/wall.Seconds(), "events/s")
	b.ReportMetric(cpu.Seconds()/n, "cpu-s/op")
	b.ReportMetric(float64(events)*n/cpu.Seconds(), "events/cpu-s")
}

// BenchmarkVerify: pebblelog's Store.Verify of the whole store, opened read-only (target
// issue 49: at least 1,000,000 events/s on the 2-core machine). Run it with -cpu 1,2 to see
// the parallel speedup.
func BenchmarkVerify(b *testing.B) {
	dir, last := store(b)
	st, err := pebblelog.Open(dir, &pebblelog.Options{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	heap := peakHeap()
	b.ResetTimer()
	c0, t0 := cpuTime(b), time.Now()
	for range b.N {
		problems, err := st.Verify(ctx, pebblelog.VerifyOptions{})
		if err != nil || len(problems) > 0 {
			b.Fatalf("Verify: %v %v", err, problems)
		}
	}
	report(b, last, time.Since(t0), cpuTime(b)-c0)
	b.ReportMetric(float64(heap())/(1<<20), "MiB-peak-heap")
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		b.ReportMetric(float64(ru.Maxrss)/(1<<10), "MiB-peak-rss") // of the whole process, store open included
	}
}

// peakHeap samples the Go heap's live and not yet swept objects every 10 ms until the
// returned function is called, which returns the largest sample.
func peakHeap() func() uint64 {
	stop, done := make(chan struct{}), make(chan uint64)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-stop:
				done <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(stop); return <-done }
}

// BenchmarkFollowCatchUp: Queue.Follow from seq 0 to the head of the store, the catch-up a
// new follower (the console, `replay log --follow`) does first (target: at least 500,000
// events/s).
func BenchmarkFollowCatchUp(b *testing.B) {
	dir, last := store(b)
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	atHead := errors.New("at the head")
	b.ResetTimer()
	c0, t0 := cpuTime(b), time.Now()
	for range b.N {
		err := q.Follow(ctx, 0, func(ev events.Event) error {
			if ev.Head().Seq == last {
				return atHead
			}
			return nil
		})
		if err != atHead {
			b.Fatal(err)
		}
	}
	report(b, last, time.Since(t0), cpuTime(b)-c0)
}

// BenchmarkStateAtSeqFirstPage: the real `replay state DIR --at-seq N` process, N the middle
// of the log, as a user runs it (target: the first 100 tasks within 300 ms on the 930k-event
// store, the whole state streamed, at most 128 MiB of memory). It reports the time to the
// first page (header and 100 task lines), the time to the end of the output, and the
// process's peak RSS. mode=by-session streams the state session by session
// (internal/pastfold); mode=cache-warm folds the whole state from the snapshot cache, filled
// by a first run before the timer; mode=no-cache folds the log from seq 1.
func BenchmarkStateAtSeqFirstPage(b *testing.B) {
	dir, last := store(b)
	bin := filepath.Join(b.TempDir(), "replay")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/worklog/worklog/cmd/replay").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	at := strconv.FormatUint(last/2, 10)
	for _, mode := range []string{"by-session", "cache-warm", "no-cache"} {
		b.Run("mode="+mode, func(b *testing.B) {
			args := []string{"state", dir, "--at-seq", at}
			switch mode {
			case "by-session":
				args = append(args, "--by-session")
			case "no-cache":
				args = append(args, "--no-cache")
			default:
				args = append(args, "--cache-dir", b.TempDir())
				runState(b, bin, args) // fills the cache
			}
			b.ResetTimer()
			var first, all time.Duration
			var rss int64
			for range b.N {
				f, a, r := runState(b, bin, args)
				first, all, rss = first+f, all+a, max(rss, r)
			}
			n := float64(b.N)
			b.ReportMetric(first.Seconds()*1000/n, "ms-first-page")
			b.ReportMetric(all.Seconds()*1000/n, "ms-all")
			b.ReportMetric(float64(rss)/(1<<20), "MiB-peak-rss")
		})
	}
}

// runState runs replay with args and returns the time to the 100th task line, the time to
// the end, and the peak RSS.
func runState(b *testing.B, bin string, args []string) (first, all time.Duration, rss int64) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	tasks := 0
	for sc.Scan() {
		if tasks < 100 && strings.HasPrefix(sc.Text(), "task_") {
			if tasks++; tasks == 100 {
				first = time.Since(t0)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		b.Fatal(err)
	}
	all = time.Since(t0)
	if tasks < 100 {
		b.Fatalf("replay %s printed %d task lines, want at least 100", strings.Join(args, " "), tasks)
	}
	return first, all, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
}
