package postgres

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/pgtest"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// BenchmarkPartitions is the measurement behind docs/scale.md: a queue split into N
// partitions, each its own schema (its own log, log head and writer) on one server, with one
// runner of 16 slots (Prefetch 16, as bench/'s W2) per partition, all in this process. b.N
// tasks are submitted first, spread evenly; then every runner starts at once, and the clock
// stops when every partition's tasks are recorded succeeded (the counts tables polled every
// 10 ms). Reported: tasks/s over all partitions; groups/s and µs-held/group as
// BenchmarkProcesses reports them, summed over the partitions' writers; cpu-ms/ktask, this
// process's CPU time (user and system) per 1,000 tasks, and other-cpu-ms/ktask, the rest of
// the machine's busy time (the server, and anything else running: a result only on an idle
// machine).
//
// pgtest's server runs with fsync off; WORKLOG_TEST_PG_DSN names another (fsync on, as
// bench/'s) for the figure that counts:
//
//	go test ./postgres -run '^$' -bench Partitions -benchtime 20000x -count 3 -timeout 30m
func BenchmarkPartitions(b *testing.B) {
	for _, parts := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("parts=%d", parts), func(b *testing.B) { benchPartitions(b, parts) })
	}
}

func benchPartitions(b *testing.B, parts int) {
	ctx := context.Background()
	es := make([]*engine, parts)
	qs := make([]*work.Queue, parts)
	for i := range parts {
		q, err := Open(ctx, pgtest.Schema(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer q.Close()
		es[i], qs[i] = engineOf(b, q), q
		n := b.N / parts
		if i < b.N%parts {
			n++
		}
		submitW2(b, q, n)
	}
	rs := make([]*runner.Runner, parts)
	for i, q := range qs {
		rs[i] = newW2Runner(b, q, 16)
	}
	var groups0, held0 int64
	for _, e := range es {
		groups0 += e.head.groups.Load()
		held0 += e.head.held.Load()
	}
	self := []int{os.Getpid()}
	cpu0, own0 := machineTicks(), procTicks(self)
	b.ResetTimer()
	start := time.Now()
	for _, r := range rs {
		if err := r.Start(); err != nil {
			b.Fatal(err)
		}
	}
	waitSucceeded(b, es, b.N, start.Add(10*time.Minute))
	elapsed := time.Since(start)
	b.StopTimer()
	cpu, own := machineTicks()-cpu0, procTicks(self)-own0
	stop, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, r := range rs {
		if err := r.Stop(stop); err != nil {
			b.Fatal(err)
		}
	}
	var groups, held int64
	for _, e := range es {
		groups += e.head.groups.Load()
		held += e.head.held.Load()
	}
	groups, held = groups-groups0, held-held0
	secs := elapsed.Seconds()
	b.ReportMetric(float64(b.N)/secs, "tasks/s")
	if groups > 0 {
		b.ReportMetric(float64(groups)/secs, "groups/s")
		b.ReportMetric(float64(held)/float64(groups)/1e3, "µs-held/group")
	}
	if cpu > 0 && ticksPerSecond > 0 {
		perKTask := func(ticks int64) float64 { return float64(ticks) / ticksPerSecond * 1e3 / (float64(b.N) / 1e3) }
		b.ReportMetric(perKTask(own), "cpu-ms/ktask")
		b.ReportMetric(perKTask(cpu-own), "other-cpu-ms/ktask")
	}
}
