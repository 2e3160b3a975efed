package storegen

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/worklog/worklog/work"
)

// TasksFromEnv is the store size a benchmark asks for: $WORKLOG_BENCH_TASKS, or def. The
// figures of docs/performance.md use 300000 (930k events) and 1000000.
func TasksFromEnv(tb testing.TB, def int) int {
	s := os.Getenv("WORKLOG_BENCH_TASKS")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		tb.Fatalf("WORKLOG_BENCH_TASKS=%q: want a whole number of tasks, at least 1", s)
	}
	return n
}

// Dir returns the directory of a closed Pebble store of n generated tasks. Building a big
// one takes minutes, so with $WORKLOG_STORE_CACHE set it is kept at
// $WORKLOG_STORE_CACHE/tasks-N and reused by later runs; without it, it is built in
// tb.TempDir(). Benchmarks that must not change the store copy it or open it read-only.
func Dir(tb testing.TB, n int) string {
	tb.Helper()
	var dir string
	if root := os.Getenv("WORKLOG_STORE_CACHE"); root != "" {
		dir = filepath.Join(root, "tasks-"+strconv.Itoa(n))
		if _, err := os.Stat(dir + ".complete"); err == nil {
			return dir
		}
		if err := os.RemoveAll(dir); err != nil { // a build that did not finish
			tb.Fatal(err)
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			tb.Fatal(err)
		}
	} else {
		dir = filepath.Join(tb.TempDir(), "store")
	}
	start := time.Now()
	q, err := work.Open(dir, &work.Options{Sync: work.SyncNever})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := Build(context.Background(), q, n, Options{}); err != nil {
		q.Close()
		tb.Fatal(err)
	}
	if err := q.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(dir+".complete", nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("storegen: built %d tasks in %v at %s", n, time.Since(start).Round(time.Millisecond), dir)
	return dir
}
