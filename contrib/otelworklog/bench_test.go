package otelworklog_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/worklog/worklog/contrib/otelworklog"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// BenchmarkRunnerW2 is the W2 workload (submit, then work through a runner with 16 slots on
// a durable store) with the instrumentation off and on (spans to an in-memory recorder that
// keeps nothing, metrics to a manual reader, traceparent in every task). The target: on is
// at most 10% slower than off. Compare the two with benchstat over interleaved runs (-count
// runs each mode's rounds back to back, so loop instead):
//
//	go test -c -o w2.test
//	for i in 1 2 3 4 5 6; do ./w2.test -test.run '^$' -test.bench RunnerW2 \
//		-test.benchtime 20000x -test.benchmem; done | tee w2.txt
//	benchstat -col /otel w2.txt
//
// Besides the time, it reports counts the machine's load changes little: tasks/walsync (the
// results a runner round carried: one round is one WAL sync), cpu-µs/task, and allocations.
//
// otel=hooks is the runner's hooks and metrics without the trace context in the tasks'
// headers (a plain Submit): the difference from otel=on is the cost of storing a header with
// every task, the rest of otel=on's is the spans' and metrics'.
func BenchmarkRunnerW2(b *testing.B) {
	b.Run("otel=off", func(b *testing.B) { benchW2(b, false, false, false) })
	b.Run("otel=on", func(b *testing.B) { benchW2(b, true, true, false) })
	b.Run("otel=hooks", func(b *testing.B) { benchW2(b, true, false, false) })
}

// BenchmarkRunnerW2Flow is W2 without instrumentation on a queue with no kind policy and no
// schedule (flow=off) and on one with both present but neither binding (flow=on): a policy
// on the workload's kind whose MaxRunning (1,000) the runner's 16 slots never reach, and a
// schedule of another kind whose next tick is a day away. The difference is what a queue pays
// per claim and settlement for having them (design §4.6, §4.7: the policy's lease index entry
// moved by every claim and settlement, the policy read by each claim's decide code and fold).
// Interleave the two as BenchmarkRunnerW2's comment says, with -test.bench RunnerW2Flow and
// benchstat -col /flow.
func BenchmarkRunnerW2Flow(b *testing.B) {
	b.Run("flow=off", func(b *testing.B) { benchW2(b, false, false, false) })
	b.Run("flow=on", func(b *testing.B) { benchW2(b, false, false, true) })
}

// dropProcessor keeps no span: the cost measured is making them, not storing them.
type dropProcessor struct{}

func (dropProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropProcessor) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropProcessor) Shutdown(context.Context) error                  { return nil }
func (dropProcessor) ForceFlush(context.Context) error                { return nil }

func benchW2(b *testing.B, on, inject, flow bool) {
	fs := &syncCountFS{FS: vfs.Default}
	q, err := work.Open(b.TempDir(), &work.Options{FS: fs})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	if flow {
		if err := q.SetKindPolicy(context.Background(), "w2", work.KindPolicy{MaxRunning: 1000}); err != nil {
			b.Fatal(err)
		}
		err := q.Session("cron").SetSchedule(context.Background(), work.Schedule{
			Name: "nightly", Cron: "@every 24h", Task: work.TaskRequest{Kind: "w2.nightly"}})
		if err != nil {
			b.Fatal(err)
		}
	}
	var inst *otelworklog.Instrumentation
	if on {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(dropProcessor{}))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		inst, err = otelworklog.New(&otelworklog.Options{TracerProvider: tp, MeterProvider: mp, Slots: 16})
		if err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	sess := q.Session("bench")
	for i := 0; i < b.N; i++ {
		r := work.TaskRequest{Kind: "w2", Input: json.RawMessage(`{"n":1}`)}
		if inject {
			_, err = inst.Submit(ctx, sess, r)
		} else {
			_, err = sess.Submit(ctx, r)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	done := make(chan struct{}, b.N)
	cfg := runner.Config{
		Handlers: map[string]runner.Handler{"w2": func(context.Context, work.Task) (json.RawMessage, error) {
			done <- struct{}{}
			return json.RawMessage(`1`), nil
		}},
		Concurrency: 16, Prefetch: 16, LeaseFor: time.Minute, Logger: quiet,
	}
	if on {
		cfg.Hooks = inst.Hooks()
	}
	b.ResetTimer()
	syncs0, cpu0 := fs.walSyncs.Load(), cpuTime()
	r, err := runner.New(q, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		<-done
	}
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Stop(stop); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/task")
	if n := fs.walSyncs.Load() - syncs0; n > 0 {
		b.ReportMetric(float64(b.N)/float64(n), "tasks/walsync")
	}
}

// cpuTime is the CPU time (user and system) the process has used: per task, a cost that the
// machine's load changes much less than the wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// syncCountFS is vfs.Default with a count of the syncs of WAL files (*.log): the runner's
// rounds, one SettleAndClaim each, are one WAL sync each, so tasks/walsync is how many
// results a round carried, which does not depend on the machine's load.
type syncCountFS struct {
	vfs.FS
	walSyncs atomic.Int64
}

func (fs *syncCountFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &syncCountFile{File: f, fs: fs}, nil
}

func (fs *syncCountFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *syncCountFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

func (fs *syncCountFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

type syncCountFile struct {
	vfs.File
	fs *syncCountFS
}

func (f *syncCountFile) Sync() error {
	f.fs.walSyncs.Add(1)
	return f.File.Sync()
}

func (f *syncCountFile) SyncData() error {
	f.fs.walSyncs.Add(1)
	return f.File.SyncData()
}
