package work_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// BenchmarkRetentionWindows is the "disk and memory follow live work" benchmark of issue 14:
// windows of tasks, one simulated hour each, go through a queue (submit by 4 callers; claim
// and finish by 4 workers; a quarter of the tasks wake their session on completion and the
// wake is claimed and acknowledged; a tenth of the submits come with a direct wake, also
// acknowledged). With retention=on, after each window everything that became prunable more
// than one window ago is pruned (Queue.Prune with the window's start as before: the core
// takes now, so simulated time prunes like Options.Retention = 1h would). With retention=off
// nothing is. After each window the child reports the store's size on disk (du of the
// directory), Pebble's own metrics, and the process's VmRSS and VmHWM; the in-memory variants
// report the Go heap after a GC.
//
// Each variant runs in a child process of its own (the test binary again), so its RSS and
// peak are its own. The size is WORKLOG_RETENTION_WINDOWS windows of WORKLOG_RETENTION_TASKS
// tasks (default 8 of 5,000, about a minute for all four variants); the figures of
// docs/performance.md are a million tasks:
//
//	WORKLOG_RETENTION_WINDOWS=20 WORKLOG_RETENTION_TASKS=50000 \
//	  go test ./work -run '^$' -bench RetentionWindows -benchtime 1x -timeout 2h -v
func BenchmarkRetentionWindows(b *testing.B) {
	windows, tasks := envInt("WORKLOG_RETENTION_WINDOWS", 8), envInt("WORKLOG_RETENTION_TASKS", 5_000)
	for _, v := range []struct {
		name        string
		memory, on  bool
		finalMetric string
	}{
		{"pebble/retention=off", false, false, "disk"},
		{"pebble/retention=on", false, true, "disk"},
		{"memory/retention=off", true, false, "heap"},
		{"memory/retention=on", true, true, "heap"},
	} {
		b.Run(v.name, func(b *testing.B) {
			if os.Getenv(childEnv) != "" {
				for range b.N {
					retentionChild(b, v.memory, v.on, windows, tasks)
				}
				return
			}
			for range b.N {
				rows := retentionParent(b)
				last, first := rows[len(rows)-1], rows[min(2, len(rows)-1)]
				b.ReportMetric(last.DiskMB, "disk-MB")
				b.ReportMetric(last.RSSMB, "rss-MB")
				b.ReportMetric(last.HWMMB, "hwm-MB")
				b.ReportMetric(last.HeapMB, "heap-MB")
				// Growth from the third window to the last: 1 is flat.
				if v.finalMetric == "disk" && first.DiskMB > 0 {
					b.ReportMetric(last.DiskMB/first.DiskMB, "disk-growth")
				} else if first.HeapMB > 0 {
					b.ReportMetric(last.HeapMB/first.HeapMB, "heap-growth")
				}
			}
		})
	}
}

// childEnv makes the benchmark run its variant in this process and print a row per window.
const childEnv = "WORKLOG_RETENTION_CHILD"

// windowRow is what the child reports after each window.
type windowRow struct {
	Window, Tasks                  int
	DiskMB, PebbleMB, RSSMB, HWMMB float64
	HeapMB                         float64 // Go heap in use after a GC
	SSTMB, WALMB, MemMB            float64 // Pebble: live sstables, WAL files, memtables
	L0Files, Tombstones            int64
	GarbageMB                      float64 // Pebble's estimate of what tombstones cover
	Compactions                    int64
	Keyspaces                      map[string]float64 `json:",omitempty"` // MB by prefix, sstables only
	PruneS, CompactS, WindowS      float64
	CompactDurS                    float64 // Pebble's compactions so far, all of them, in seconds
	Pruned                         work.PruneResult
}

// retentionParent runs the current sub-benchmark in a child process and returns its rows,
// logging them as a table.
func retentionParent(b *testing.B) []windowRow {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$", "-test.bench=^"+regexp.QuoteMeta(b.Name())+"$", "-test.benchtime=1x", "-test.timeout=0")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = io.MultiWriter(&stderr, os.Stderr) // the child's rows as they come: a long run shows its progress
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("child %s: %v\n%s\n%s", b.Name(), err, out, stderr.Bytes())
	}
	var rows []windowRow
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "RETENTION-WINDOW ")
		if !ok {
			continue
		}
		var r windowRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			b.Fatalf("child row %q: %v", line, err)
		}
		rows = append(rows, r)
		b.Logf("window %2d %8d tasks: du %6.1f MB (pebble %6.1f: sst %6.1f wal %5.1f mem %5.1f, L0 %2d, tomb %7d, garbage %5.1f, compactions %3d in %5.1fs) rss %6.1f hwm %6.1f heap %6.1f MB; window %5.1fs prune %5.2fs compact %5.2fs %v",
			r.Window, r.Tasks, r.DiskMB, r.PebbleMB, r.SSTMB, r.WALMB, r.MemMB, r.L0Files, r.Tombstones, r.GarbageMB, r.Compactions, r.CompactDurS,
			r.RSSMB, r.HWMMB, r.HeapMB, r.WindowS, r.PruneS, r.CompactS, fmtKeyspaces(r.Keyspaces))
	}
	if len(rows) == 0 {
		b.Fatalf("child %s printed no rows\n%s\n%s", b.Name(), out, stderr.Bytes())
	}
	return rows
}

func fmtKeyspaces(m map[string]float64) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, p := range "estwxklrpdaDcK" {
		if v, ok := m[string(p)]; ok && v >= 0.05 {
			parts = append(parts, fmt.Sprintf("%c=%.1f", p, v))
		}
	}
	return strings.Join(parts, " ")
}

// retentionChild runs one variant and prints a RETENTION-WINDOW row after each window.
func retentionChild(b *testing.B, memory, on bool, windows, perWindow int) {
	ctx := context.Background()
	dir := b.TempDir()
	var q *work.Queue
	if memory {
		q = work.NewInMemory()
	} else {
		var err error
		if q, err = work.Open(dir, &work.Options{Sync: work.SyncNever}); err != nil {
			b.Fatal(err)
		}
	}
	defer q.Close()
	if os.Getenv("WORKLOG_RETENTION_COMPACT") == "none" {
		defer work.SetCompactAfterPrune(false)()
	}
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var pruned work.PruneResult
	for w := range windows {
		t0 := time.Now()
		base := start.Add(time.Duration(w) * time.Hour)
		if err := retentionWindow(ctx, q, w, perWindow, base); err != nil {
			b.Fatal(err)
		}
		row := windowRow{Window: w + 1, Tasks: (w + 1) * perWindow}
		if on {
			t1 := time.Now()
			res, err := q.Prune(ctx, base) // what ended more than a window ago
			if err != nil {
				b.Fatal(err)
			}
			row.PruneS = time.Since(t1).Seconds()
			pruned.Tasks += res.Tasks
			pruned.Wakes += res.Wakes
			pruned.Events += res.Events
			row.Pruned = pruned
			if st := work.StoreOf(q); st != nil {
				t2 := time.Now()
				if err := compactForBench(ctx, q); err != nil {
					b.Fatal(err)
				}
				row.CompactS = time.Since(t2).Seconds()
			}
		}
		row.WindowS = time.Since(t0).Seconds()
		fillRow(b, &row, q, dir)
		line, _ := json.Marshal(row)
		fmt.Printf("RETENTION-WINDOW %s\n", line)
		fmt.Fprintf(os.Stderr, "%s window %d: %s\n", b.Name(), w+1, line)
	}
}

// compactForBench is the way of reclaiming pruned space under test, chosen by
// WORKLOG_RETENTION_COMPACT: "" (the default) is Queue.Prune's own, the log span it emptied
// compacted in the background; "none" turns that off and leaves everything to Pebble; "all"
// adds a compaction of the whole keyspace after each prune, here in the foreground.
func compactForBench(ctx context.Context, q *work.Queue) error {
	if os.Getenv("WORKLOG_RETENTION_COMPACT") == "all" {
		return work.StoreOf(q).Tools().CompactRange(ctx, []byte{0}, []byte{0xff})
	}
	return nil
}

func fillRow(b *testing.B, r *windowRow, q *work.Queue, dir string) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.HeapMB = float64(ms.HeapAlloc) / 1e6
	r.RSSMB, r.HWMMB = procStatus("VmRSS")/1e6, procStatus("VmHWM")/1e6
	st := work.StoreOf(q)
	if st == nil {
		return
	}
	r.DiskMB = float64(dirBytes(b, dir)) / 1e6
	m, err := st.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	r.PebbleMB = float64(m.DiskSpaceUsage()) / 1e6
	r.SSTMB = float64(m.Table.Local.LiveSize) / 1e6
	r.WALMB = float64(m.WAL.PhysicalSize+m.WAL.ObsoletePhysicalSize) / 1e6
	r.MemMB = float64(m.MemTable.Size) / 1e6
	r.L0Files = m.Levels[0].TablesCount
	r.Tombstones = int64(m.Keys.TombstoneCount)
	r.GarbageMB = float64(m.Table.Garbage.PointDeletionsBytesEstimate+m.Table.Garbage.RangeDeletionsBytesEstimate) / 1e6
	r.Compactions = m.Compact.Count
	r.CompactDurS = m.Compact.Duration.Seconds()
	ks, err := st.Tools().KeyspaceUsage()
	if err != nil {
		b.Fatal(err)
	}
	r.Keyspaces = map[string]float64{}
	for p, n := range ks {
		r.Keyspaces[string(p)] = float64(n) / 1e6
	}
}

// procStatus reads a "<name>: <n> kB" line of /proc/self/status, in bytes.
func procStatus(name string) float64 {
	buf, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(name + `:\s+(\d+) kB`).FindSubmatch(buf)
	if m == nil {
		return 0
	}
	kib, _ := strconv.ParseFloat(string(m[1]), 64)
	return kib * 1024
}

// retentionWindow puts one window of perWindow tasks through q: submitted over the window's
// first 30 simulated minutes, all finished and every wake acknowledged at its 30th minute.
func retentionWindow(ctx context.Context, q *work.Queue, w, perWindow int, base time.Time) error {
	const callers = 4
	input := json.RawMessage(`{"url":"https://example.com/some/page","attempt":1,"tags":["a","b","c"]}`)
	end := base.Add(30 * time.Minute)
	var next atomic.Int64
	err := parallel(callers, func() error {
		for {
			i := int(next.Add(1) - 1)
			if i >= perWindow {
				return nil
			}
			now := base.Add(time.Duration(i) * (30 * time.Minute) / time.Duration(perWindow))
			s := q.Session(fmt.Sprintf("s%d", i%100))
			r := work.TaskRequest{Kind: "crawl", Input: input, IdempotencyKey: fmt.Sprintf("w%d-%d", w, i)}
			if i%4 == 0 {
				r.Wake = work.WakeOnCompletion
			}
			if _, err := s.SubmitAt(ctx, r, now); err != nil {
				return err
			}
			if i%10 == 0 {
				if _, err := s.WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage(`{"n":1}`)}, now); err != nil {
					return err
				}
			}
		}
	})
	if err != nil {
		return err
	}
	err = parallel(callers, func() error {
		for {
			ds, err := q.ClaimDueAt(ctx, end, time.Minute, 64)
			if err != nil || len(ds) == 0 {
				return err
			}
			for _, d := range ds {
				if _, err := q.FinishAt(ctx, d, work.Success(json.RawMessage(`{"ok":true,"bytes":1234}`)), end); err != nil {
					return err
				}
			}
		}
	})
	if err != nil {
		return err
	}
	return parallel(callers, func() error {
		for {
			wds, err := q.ClaimWakesAt(ctx, end, time.Minute, 64)
			if err != nil || len(wds) == 0 {
				return err
			}
			for _, wd := range wds {
				if err := q.AckWakeAt(ctx, wd, end); err != nil {
					return err
				}
			}
		}
	})
}

// parallel runs fn in n goroutines and returns the first error.
func parallel(n int, fn func() error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
