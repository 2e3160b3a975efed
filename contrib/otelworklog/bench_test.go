package otelworklog_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/worklog/worklog/contrib/otelworklog"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// BenchmarkRunnerW2 is the W2 workload (submit, then work through a runner with 16 slots on
// a durable store) with the instrumentation off and on (spans to an in-memory recorder that
// keeps nothing, metrics to a manual reader, traceparent in every task). The target: on is
// at most 10% slower than off. Compare the two with benchstat over interleaved runs:
//
//	go test -run '^$' -bench RunnerW2 -count 6 | tee w2.txt; benchstat -col /otel w2.txt
//
// otel=hooks is the runner's hooks and metrics without the trace context in the tasks'
// headers (a plain Submit): the difference from otel=on is the cost of storing a header with
// every task, the rest of otel=on's is the spans' and metrics'.
func BenchmarkRunnerW2(b *testing.B) {
	b.Run("otel=off", func(b *testing.B) { benchW2(b, false, false) })
	b.Run("otel=on", func(b *testing.B) { benchW2(b, true, true) })
	b.Run("otel=hooks", func(b *testing.B) { benchW2(b, true, false) })
}

// dropProcessor keeps no span: the cost measured is making them, not storing them.
type dropProcessor struct{}

func (dropProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropProcessor) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropProcessor) Shutdown(context.Context) error                  { return nil }
func (dropProcessor) ForceFlush(context.Context) error                { return nil }

func benchW2(b *testing.B, on, inject bool) {
	q, err := work.Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
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
}
