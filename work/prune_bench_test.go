package work_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// BenchmarkRetention puts windows of tasks through a durable store, an hour of simulated
// time each (submit, claim, finish; a quarter wake on completion and are acknowledged; a
// tenth of the sessions ask for a wake too), and reports after each window the store's size
// on disk and the process's RSS. With retention=on, after each window everything that ended
// more than one window ago is pruned (Queue.Prune), as Options.Retention = 1h would; with
// retention=off nothing is. Run each alone, so the RSS is its own:
//
//	go test ./work -run '^$' -bench 'Retention/retention=on' -benchtime 1x -v
//	go test ./work -run '^$' -bench 'Retention/retention=off' -benchtime 1x -v
//
// WORKLOG_RETENTION_WINDOWS and WORKLOG_RETENTION_TASKS size it (default 10 windows of 20,000).
func BenchmarkRetention(b *testing.B) {
	windows, tasks := envInt("WORKLOG_RETENTION_WINDOWS", 10), envInt("WORKLOG_RETENTION_TASKS", 20_000)
	for _, on := range []bool{false, true} {
		name := "retention=off"
		if on {
			name = "retention=on"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				benchRetention(b, on, windows, tasks)
			}
		})
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func benchRetention(b *testing.B, on bool, windows, perWindow int) {
	ctx := context.Background()
	dir := b.TempDir()
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	input := json.RawMessage(`{"url":"https://example.com/some/page","attempt":1,"tags":["a","b","c"]}`)
	var pruned work.PruneResult
	var pruneTime time.Duration
	for w := range windows {
		base := start.Add(time.Duration(w) * time.Hour)
		now := func(i int) time.Time {
			return base.Add(time.Duration(i) * 100 * time.Millisecond / time.Duration(perWindow/1000+1))
		}
		for i := range perWindow {
			s := q.Session(fmt.Sprintf("s%d", i%100))
			r := work.TaskRequest{Kind: "crawl", Input: input, IdempotencyKey: fmt.Sprintf("w%d-%d", w, i)}
			if i%4 == 0 {
				r.Wake = work.WakeOnCompletion
			}
			if _, err := s.SubmitAt(ctx, r, now(i)); err != nil {
				b.Fatal(err)
			}
			if i%10 == 0 {
				if _, err := s.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"n":1}`)}, now(i)); err != nil {
					b.Fatal(err)
				}
			}
		}
		end := base.Add(30 * time.Minute)
		for {
			ds, err := q.ClaimDueAt(ctx, end, time.Minute, 256)
			if err != nil {
				b.Fatal(err)
			}
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				if _, err := q.FinishAt(ctx, d, work.Success(json.RawMessage(`{"ok":true,"bytes":1234}`)), end); err != nil {
					b.Fatal(err)
				}
			}
		}
		for {
			wds, err := q.ClaimWakesAt(ctx, end, time.Minute, 256)
			if err != nil {
				b.Fatal(err)
			}
			if len(wds) == 0 {
				break
			}
			for _, wd := range wds {
				if err := q.AckWakeAt(ctx, wd, end); err != nil {
					b.Fatal(err)
				}
			}
		}
		if on {
			t0 := time.Now()
			res, err := q.Prune(ctx, base) // what ended more than a window ago
			if err != nil {
				b.Fatal(err)
			}
			pruneTime += time.Since(t0)
			pruned.Tasks += res.Tasks
			pruned.Wakes += res.Wakes
			pruned.Events += res.Events
		}
		disk := dirBytes(b, dir)
		rss := vmRSS()
		b.Logf("window %2d: %7d tasks so far, disk %6.1f MB, RSS %6.1f MB", w+1, (w+1)*perWindow, float64(disk)/1e6, float64(rss)/1e6)
		if w == windows-1 {
			b.ReportMetric(float64(disk)/1e6, "disk-MB")
			b.ReportMetric(float64(rss)/1e6, "rss-MB")
		}
	}
	if on {
		b.Logf("pruned %d tasks, %d wakes, %d events in %v", pruned.Tasks, pruned.Wakes, pruned.Events, pruneTime)
	}
}

func dirBytes(b *testing.B, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

func vmRSS() int64 {
	buf, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(buf)
	if m == nil {
		return 0
	}
	kib, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kib << 10
}
