package otelworklog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/worklog/worklog/contrib/otelworklog"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

func Example() {
	spans := tracetest.NewSpanRecorder() // in an application: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	q := work.NewInMemory()
	defer q.Close()
	inst, err := otelworklog.New(&otelworklog.Options{TracerProvider: tp, Slots: 4})
	if err != nil {
		panic(err)
	}

	// The producer: its span context goes into the task's headers.
	ctx, request := tp.Tracer("app").Start(context.Background(), "POST /signup")
	if _, err := inst.Submit(ctx, q.Session("user-42"), work.TaskRequest{Kind: "welcome-email"}); err != nil {
		panic(err)
	}
	request.End()

	// The consumer: a runner with the instrumentation's hooks.
	done := make(chan struct{})
	r, err := runner.New(q, runner.Config{
		Handlers: map[string]runner.Handler{"welcome-email": func(ctx context.Context, t work.Task) (json.RawMessage, error) {
			defer close(done)
			return json.RawMessage(`"sent"`), nil
		}},
		Concurrency: 4,
		LeaseFor:    time.Minute,
		Hooks:       inst.Hooks(),
		Logger:      slog.New(otelworklog.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	})
	if err != nil {
		panic(err)
	}
	if err := r.Start(); err != nil {
		panic(err)
	}
	<-done
	stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Stop(stop); err != nil {
		panic(err)
	}

	var lines []string
	for _, s := range spans.Ended() {
		lines = append(lines, fmt.Sprintf("%s (%s), links: %d", s.Name(), s.SpanKind(), len(s.Links())))
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// POST /signup (internal), links: 0
	// process welcome-email (consumer), links: 1
	// send welcome-email (producer), links: 0
}
