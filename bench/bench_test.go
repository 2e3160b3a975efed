package main

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestSmoke runs every workload and the check on each embedded system with a few tasks, in
// this process. River on PostgreSQL runs too when BENCH_PG_DSN names a server.
func TestSmoke(t *testing.T) {
	for _, s := range systems {
		t.Run(s.name, func(t *testing.T) {
			dsn := os.Getenv("BENCH_PG_DSN")
			if s.needsPG && dsn == "" {
				t.Skip("no BENCH_PG_DSN")
			}
			r := runChild(context.Background(), childConfig{
				System: s.name, Dir: t.TempDir(), Run: 1,
				N: 100, Workers: 4, PGDSN: dsn, WorklogPool: "runner",
			})
			if r.Error != "" {
				t.Fatal(r.Error)
			}
			if r.Completed != r.Expected || r.W1One <= 0 || r.W1Many <= 0 {
				t.Fatalf("result %+v", r)
			}
		})
	}
}

// benchmarkWorklogW2 times W2 alone on a store of 2·n submitted tasks, for
// go test -bench . -cpuprofile cpu.out (profiles every phase but the submissions).
func benchmarkWorklogW2(b *testing.B, sys, pool string) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("BENCH_W2_N")); err == nil && v > 0 {
		n = v // W2 runs over 2·n tasks
	}
	s, _ := systemByName(sys)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if s.needsPG && os.Getenv("BENCH_PG_DSN") == "" {
			b.Skip("no BENCH_PG_DSN (run.sh sets it)")
		}
		q, err := s.open(ctx, b.TempDir(), childConfig{Workers: 16, WorklogPool: pool, PGDSN: os.Getenv("BENCH_PG_DSN")})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := closedLoop(ctx, 0, 2*n, 16, func(ctx context.Context, i int) error {
			_, err := q.Enqueue(ctx, key(i), input(i))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		// BENCH_W2_BEFORE: a shell command run just before the timed phase, e.g. to reset
		// pg_stat_statements so that it counts W2's statements alone.
		if f := os.Getenv("BENCH_W2_BEFORE"); f != "" {
			if out, err := exec.Command("sh", "-c", f).CombinedOutput(); err != nil {
				b.Fatal(err, string(out))
			}
		}
		b.StartTimer()
		start := time.Now()
		if err := q.Work(ctx, 2*n, 16); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(2*n)/time.Since(start).Seconds(), "tasks/s")
		b.StopTimer()
		q.Close()
	}
}

func BenchmarkWorklogW2Runner(b *testing.B) { benchmarkWorklogW2(b, "worklog", "runner") }

// BenchmarkWorklogPGW2Runner is W2 on PostgreSQL alone, for a profile of the client:
//
//	BENCH_PG_DSN=... go test -run '^$' -bench WorklogPGW2Runner -benchtime 5x -cpuprofile cpu.out
func BenchmarkWorklogPGW2Runner(b *testing.B) { benchmarkWorklogW2(b, "worklog-pg", "runner") }
func BenchmarkWorklogW2RunnerNoPrefetch(b *testing.B) {
	benchmarkWorklogW2(b, "worklog", "runner-noprefetch")
}
func BenchmarkWorklogW2Dispatch(b *testing.B) { benchmarkWorklogW2(b, "worklog", "dispatch") }
func BenchmarkWorklogW2Each(b *testing.B)     { benchmarkWorklogW2(b, "worklog", "each") }
func BenchmarkWorklogNoSyncW2Dispatch(b *testing.B) {
	benchmarkWorklogW2(b, "worklog-nosync", "dispatch")
}
func BenchmarkWorklogNoSyncW2Each(b *testing.B) { benchmarkWorklogW2(b, "worklog-nosync", "each") }

// TestChildren: the children files list what a scan of every process finds.
func TestChildren(t *testing.T) {
	var cmds []*exec.Cmd
	for range 3 {
		c := exec.Command("sleep", "30")
		if err := c.Start(); err != nil {
			t.Skip(err)
		}
		cmds = append(cmds, c)
	}
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}()
	got, want := children(os.Getpid()), scanChildren(os.Getpid())
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(got) < 3 {
		t.Fatalf("children %v, a scan of /proc %v; want the same, the 3 sleeps among them", got, want)
	}
	for _, c := range cmds {
		if !slices.Contains(got, c.Process.Pid) {
			t.Errorf("children %v lack %d", got, c.Process.Pid)
		}
	}
}
