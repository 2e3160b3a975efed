package otelworklog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/worklog/worklog/contrib/otelworklog"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// setup is an instrumentation over an in-memory span recorder and a manual metric reader.
type setup struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	inst   *otelworklog.Instrumentation
}

func newSetup(t *testing.T, slots int) *setup {
	t.Helper()
	s := &setup{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	var err error
	s.inst, err = otelworklog.New(&otelworklog.Options{TracerProvider: s.tp, MeterProvider: mp, Slots: slots})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// endHooks wraps the instrumentation's hooks and reports each TaskEnd after it ran.
type endHooks struct {
	runner.Hooks
	done chan runner.Result
}

func (h endHooks) TaskEnd(ctx context.Context, d work.TaskDelivery, r runner.TaskResult) {
	h.Hooks.TaskEnd(ctx, d, r)
	h.done <- r.Result
}

// runTasks runs n tasks of q through a runner with the instrumentation's hooks.
func runTasks(t *testing.T, q *work.Queue, s *setup, n int, handlers map[string]runner.Handler, edits ...func(*runner.Config)) []runner.Result {
	t.Helper()
	h := endHooks{s.inst.Hooks(), make(chan runner.Result, n)}
	cfg := runner.Config{Handlers: handlers, Concurrency: 2, LeaseFor: time.Minute,
		MaxAttempts: 1, Logger: quiet, Hooks: h}
	for _, edit := range edits {
		edit(&cfg)
	}
	r, err := runner.New(q, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	var got []runner.Result
	for range n {
		select {
		case res := <-h.done:
			got = append(got, res)
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of %d tasks ended", len(got), n)
		}
	}
	return got
}

func attrMap(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if s.Name() == name {
			return s
		}
	}
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	t.Fatalf("no span %q among %v", name, names)
	return nil
}

// TestProcessSpanLinksToSubmitterAcrossRestart: the submitter's span context travels in the
// task's headers through a durable store closed and opened again (as a process restart
// would), and the process span links to it, without being its child.
func TestProcessSpanLinksToSubmitterAcrossRestart(t *testing.T) {
	s := newSetup(t, 2)
	dir := t.TempDir()
	q, err := work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, request := s.tp.Tracer("app").Start(context.Background(), "POST /thumbnails")
	task, err := s.inst.Submit(ctx, q.Session("sess-1"), work.TaskRequest{Kind: "thumbnail", Input: json.RawMessage(`{}`),
		Headers: map[string]string{"tenant": "acme"}})
	request.End()
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	q, err = work.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	stored, ok, err := q.Session("sess-1").Task(context.Background(), task.ID)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if stored.Headers["traceparent"] == "" || stored.Headers["tenant"] != "acme" {
		t.Fatalf("stored headers %v: want traceparent injected beside tenant", stored.Headers)
	}
	var handlerSpan trace.SpanContext
	runTasks(t, q, s, 1, map[string]runner.Handler{"thumbnail": func(ctx context.Context, _ work.Task) (json.RawMessage, error) {
		handlerSpan = trace.SpanContextFromContext(ctx)
		return json.RawMessage(`"ok"`), nil
	}})

	spans := s.spans.Ended()
	send := spanNamed(t, spans, "send thumbnail")
	if send.SpanKind() != trace.SpanKindProducer || send.Parent().SpanID() != request.SpanContext().SpanID() {
		t.Errorf("send span: kind %v parent %v; want PRODUCER, child of the request span", send.SpanKind(), send.Parent().SpanID())
	}
	want := map[string]string{"messaging.system": "worklog", "messaging.operation.type": "send",
		"messaging.destination.name": "thumbnail", "messaging.message.id": task.ID, "worklog.session.id": "sess-1"}
	for k, v := range want {
		if got := attrMap(send.Attributes())[k]; got != v {
			t.Errorf("send span %s = %q, want %q", k, got, v)
		}
	}

	proc := spanNamed(t, spans, "process thumbnail")
	if proc.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span kind %v, want CONSUMER", proc.SpanKind())
	}
	if proc.Parent().IsValid() {
		t.Errorf("process span has parent %v: a run hours later must link to the submitter, not continue its trace", proc.Parent())
	}
	if l := proc.Links(); len(l) != 1 || l[0].SpanContext.TraceID() != send.SpanContext().TraceID() ||
		l[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
		t.Fatalf("process span links %+v, want one link to the send span %v", proc.Links(), send.SpanContext())
	}
	if handlerSpan.SpanID() != proc.SpanContext().SpanID() {
		t.Errorf("the handler's context holds span %v, want the process span %v", handlerSpan.SpanID(), proc.SpanContext().SpanID())
	}
	want = map[string]string{"messaging.system": "worklog", "messaging.operation.type": "process",
		"messaging.destination.name": "thumbnail", "messaging.message.id": task.ID, "worklog.session.id": "sess-1",
		"worklog.task.attempt": "1", "worklog.outcome": "succeeded"}
	for k, v := range want {
		if got := attrMap(proc.Attributes())[k]; got != v {
			t.Errorf("process span %s = %q, want %q", k, got, v)
		}
	}
	if ev := proc.Events(); len(ev) == 0 || ev[len(ev)-1].Name != "settle" {
		t.Errorf("process span events %v: want a settle event", ev)
	}
}

// TestFailureSpanAndErrorType: a failed task's span has error status, error.type and the
// outcome; a submit refused by the queue records its error on the send span.
func TestFailureSpanAndErrorType(t *testing.T) {
	s := newSetup(t, 0)
	q := work.NewInMemory()
	defer q.Close()
	sess := q.Session("s")
	if _, err := s.inst.Submit(context.Background(), sess, work.TaskRequest{Kind: "charge", IdempotencyKey: "k"}); err != nil {
		t.Fatal(err)
	}
	_, err := s.inst.Submit(context.Background(), sess, work.TaskRequest{Kind: "other", IdempotencyKey: "k"})
	if !errors.Is(err, work.ErrIdempotencyConflict) {
		t.Fatalf("conflicting submit: %v", err)
	}
	runTasks(t, q, s, 1, map[string]runner.Handler{"charge": func(context.Context, work.Task) (json.RawMessage, error) {
		return nil, runner.Permanent(errors.New("card declined"))
	}})
	spans := s.spans.Ended()
	refused := spanNamed(t, spans, "send other")
	if got := attrMap(refused.Attributes())["error.type"]; got != "idempotency_conflict" {
		t.Errorf("refused send span error.type = %q", got)
	}
	proc := spanNamed(t, spans, "process charge")
	a := attrMap(proc.Attributes())
	if a["worklog.outcome"] != "failed" || a["error.type"] != "permanent" || proc.Status().Code.String() != "Error" {
		t.Errorf("failed process span: outcome %q error.type %q status %v", a["worklog.outcome"], a["error.type"], proc.Status())
	}
}

// declinedError is an application's own error type.
type declinedError struct{ code string }

func (e *declinedError) Error() string { return "declined: " + e.code }

// Issue 45.4: a process span's error.type is a stable name of bounded cardinality, per
// OpenTelemetry's conventions: "timeout" for an attempt past its time limit, "permanent" for
// a Permanent error of no type of its own, "panic", the application's own type when the error
// (wrapped or marked Permanent) has one, "_OTHER" for a plain error. Before, a Permanent
// error's was "*runner.permanentError" and a plain one's "*errors.errorString".
func TestErrorTypeNames(t *testing.T) {
	s := newSetup(t, 0)
	q := work.NewInMemory()
	defer q.Close()
	want := map[string]string{
		"perm":    "permanent",
		"user":    "*otelworklog_test.declinedError",
		"wrapped": "*otelworklog_test.declinedError",
		"panic":   "panic",
		"slow":    "timeout",
		"plain":   "_OTHER",
	}
	for kind := range want {
		if _, err := q.Session("s").Submit(context.Background(), work.TaskRequest{Kind: kind}); err != nil {
			t.Fatal(err)
		}
	}
	runTasks(t, q, s, len(want), map[string]runner.Handler{
		"perm": func(context.Context, work.Task) (json.RawMessage, error) {
			return nil, runner.Permanent(errors.New("card declined"))
		},
		"user": func(context.Context, work.Task) (json.RawMessage, error) {
			return nil, runner.Permanent(&declinedError{"51"})
		},
		"wrapped": func(context.Context, work.Task) (json.RawMessage, error) {
			return nil, fmt.Errorf("charging: %w", &declinedError{"05"})
		},
		"panic": func(context.Context, work.Task) (json.RawMessage, error) { panic("boom") },
		"slow": func(ctx context.Context, _ work.Task) (json.RawMessage, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		"plain": func(context.Context, work.Task) (json.RawMessage, error) { return nil, errors.New("no") },
	}, func(c *runner.Config) {
		c.Concurrency = len(want)
		c.KindTimeouts = map[string]time.Duration{"slow": 50 * time.Millisecond}
	})
	spans := s.spans.Ended()
	for kind, w := range want {
		if got := attrMap(spanNamed(t, spans, "process "+kind).Attributes())["error.type"]; got != w {
			t.Errorf("process %s: error.type %q, want %q", kind, got, w)
		}
	}
}

// idKeys are attributes that name one task, session or attempt: spans only, never metrics,
// whose attribute sets must stay of bounded cardinality.
var idKeys = []string{"messaging.message.id", "worklog.session.id", "worklog.task.attempt", "worklog.worker"}

// TestMetricsNamesUnitsAndNoIDs: every instrument exists with its unit, the runner's and the
// queue's figures are right, and no metric data point carries an id.
func TestMetricsNamesUnitsAndNoIDs(t *testing.T) {
	s := newSetup(t, 2)
	q := work.NewInMemory()
	defer q.Close()
	unregister, err := s.inst.ObserveQueue(q)
	if err != nil {
		t.Fatal(err)
	}
	defer unregister()
	sess := q.Session("sess-metrics")
	for _, kind := range []string{"ok", "ok", "bad"} {
		if _, err := s.inst.Submit(context.Background(), sess, work.TaskRequest{Kind: kind}); err != nil {
			t.Fatal(err)
		}
	}
	// One more task, due in an hour: pending, not due, not run.
	if _, err := s.inst.Submit(context.Background(), sess, work.TaskRequest{Kind: "later", RunAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	runTasks(t, q, s, 3, map[string]runner.Handler{
		"ok": func(context.Context, work.Task) (json.RawMessage, error) { return json.RawMessage(`1`), nil },
		"bad": func(context.Context, work.Task) (json.RawMessage, error) {
			return nil, runner.Permanent(errors.New("x"))
		},
	})
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	units := map[string]string{}
	points := map[string][]attribute.Set{}
	sums := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			units[m.Name] = m.Unit
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], p.Attributes)
					sums[m.Name] += float64(p.Count)
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], p.Attributes)
					sums[m.Name] += float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], p.Attributes)
					sums[m.Name] += float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], p.Attributes)
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	for name, unit := range map[string]string{
		"messaging.process.duration": "s", "messaging.client.consumed.messages": "{message}",
		"messaging.client.sent.messages": "{message}", "worklog.runner.slots.used": "{slot}",
		"worklog.runner.slots.available": "{slot}", "worklog.tasks": "{task}", "worklog.queue.due": "{task}",
		"worklog.queue.oldest_due_age": "s",
	} {
		if got, ok := units[name]; !ok || got != unit {
			t.Errorf("metric %s: unit %q (present %v), want %q", name, got, ok, unit)
		}
	}
	for name, want := range map[string]float64{
		"messaging.process.duration": 3, "messaging.client.consumed.messages": 3,
		"messaging.client.sent.messages": 4, "worklog.runner.slots.used": 0,
		"worklog.tasks": 4, // 2 succeeded + 1 failed + 1 pending
	} {
		if sums[name] != want {
			t.Errorf("metric %s totals %v, want %v", name, sums[name], want)
		}
	}
	for name, sets := range points {
		for _, set := range sets {
			for _, k := range idKeys {
				if set.HasValue(attribute.Key(k)) {
					t.Errorf("metric %s carries id attribute %s (%v): ids go on spans only", name, k, set.Encoded(attribute.DefaultEncoder()))
				}
			}
		}
	}
}

// TestLogHandlerAddsTraceIDs: a record logged with a span's context carries its ids; one
// without carries none.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	var b strings.Builder
	var mu sync.Mutex
	log := slog.New(otelworklog.LogHandler(slog.NewTextHandler(&lockedWriter{&mu, &b}, nil)))
	s := newSetup(t, 0)
	ctx, span := s.tp.Tracer("t").Start(context.Background(), "x")
	log.InfoContext(ctx, "inside", "task_id", "t1")
	span.End()
	log.Info("outside")
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "trace_id="+span.SpanContext().TraceID().String()) ||
		!strings.Contains(lines[0], "span_id="+span.SpanContext().SpanID().String()) || strings.Contains(lines[1], "trace_id") {
		t.Fatalf("log output:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestSubmitManySpan: one PRODUCER span for the batch, its context in every task's headers
// (each run links to it), the refused item an event on the span.
func TestSubmitManySpan(t *testing.T) {
	s := newSetup(t, 0)
	q := work.NewInMemory()
	defer q.Close()
	sess := q.Session("batch")
	if _, err := sess.Submit(context.Background(), work.TaskRequest{Kind: "mail", IdempotencyKey: "taken"}); err != nil {
		t.Fatal(err)
	}
	res, err := s.inst.SubmitMany(context.Background(), sess, []work.TaskRequest{
		{Kind: "mail", IdempotencyKey: "a"}, {Kind: "mail", IdempotencyKey: "b"},
		{Kind: "mail", IdempotencyKey: "taken", Input: json.RawMessage(`{"other":1}`)},
	})
	if err != nil || len(res) != 3 || res[0].Err != nil || res[1].Err != nil || !errors.Is(res[2].Err, work.ErrIdempotencyConflict) {
		t.Fatalf("SubmitMany: %v %+v", err, res)
	}
	runTasks(t, q, s, 3, map[string]runner.Handler{"mail": func(context.Context, work.Task) (json.RawMessage, error) {
		return json.RawMessage(`1`), nil
	}})
	spans := s.spans.Ended()
	send := spanNamed(t, spans, "send mail")
	if a := attrMap(send.Attributes()); a["messaging.batch.message_count"] != "3" || send.SpanKind() != trace.SpanKindProducer {
		t.Errorf("batch span: kind %v attrs %v", send.SpanKind(), a)
	}
	if ev := send.Events(); len(ev) != 1 || ev[0].Name != "item refused" {
		t.Errorf("batch span events %v: want one refused item", ev)
	}
	linked := 0
	for _, sp := range spans {
		if sp.Name() == "process mail" && len(sp.Links()) == 1 && sp.Links()[0].SpanContext.SpanID() == send.SpanContext().SpanID() {
			linked++
		}
	}
	if linked != 2 {
		t.Errorf("%d process spans link to the batch's send span, want 2 (the task submitted before the batch has no link)", linked)
	}
}
