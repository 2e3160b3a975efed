package otelworklog

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/worklog/worklog/contrib/otelworklog"

// Attribute keys. The messaging.* ones are OpenTelemetry's messaging conventions.
const (
	keySystem        = attribute.Key("messaging.system")
	keyOperationType = attribute.Key("messaging.operation.type")
	keyOperationName = attribute.Key("messaging.operation.name")
	keyMessageID     = attribute.Key("messaging.message.id")
	keyDestination   = attribute.Key("messaging.destination.name")
	keyErrorType     = attribute.Key("error.type")
	keySession       = attribute.Key("worklog.session.id")
	keyAttempt       = attribute.Key("worklog.task.attempt")
	keyWorker        = attribute.Key("worklog.worker")
	keyOutcome       = attribute.Key("worklog.outcome")
	keyState         = attribute.Key("worklog.task.state")
	keyEventSeq      = attribute.Key("worklog.event.seq")
)

var systemWorklog = keySystem.String("worklog")

// Options configures New. The zero value (or nil) uses OpenTelemetry's global providers and
// W3C trace context.
type Options struct {
	// TracerProvider makes the spans; nil: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments; nil: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes and reads the trace context in a task's Headers; nil: W3C trace
	// context and baggage (propagation.TraceContext, propagation.Baggage). The global
	// propagator is not the default: unless an application sets it, it is a no-op, and
	// tasks would silently carry nothing.
	Propagator propagation.TextMapPropagator
	// Slots is the runner's Concurrency, for worklog.runner.slots.available; 0: that
	// gauge is not reported (slots used still are).
	Slots int
}

// Instrumentation holds the tracer, the instruments and the propagator. One value serves
// any number of sessions, runners and queues; its methods are safe for concurrent use.
type Instrumentation struct {
	tracer trace.Tracer
	meter  metric.Meter
	prop   propagation.TextMapPropagator
	slots  int64

	duration  metric.Float64Histogram
	consumed  metric.Int64Counter
	sent      metric.Int64Counter
	leaseLost metric.Int64Counter

	running atomic.Int64 // handlers running now: worklog.runner.slots.used and .available
	sets    sync.Map     // endKey → metric.MeasurementOption: a task end's attribute set, made once
}

// endKey names the attribute set of a task end's metrics (bounded: kinds × outcomes × error
// types), so that the set is sorted and hashed once, not at every task.
type endKey struct{ kind, outcome, errType string }

func (in *Instrumentation) endSet(k endKey) metric.MeasurementOption {
	if v, ok := in.sets.Load(k); ok {
		return v.(metric.MeasurementOption)
	}
	attrs := []attribute.KeyValue{systemWorklog, keyDestination.String(k.kind), keyOperationName.String("process"), keyOutcome.String(k.outcome)}
	if k.errType != "" {
		attrs = append(attrs, keyErrorType.String(k.errType))
	}
	v, _ := in.sets.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(attrs...)))
	return v.(metric.MeasurementOption)
}

// New makes the instruments. It fails only when the meter provider refuses an instrument.
func New(opts *Options) (*Instrumentation, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Slots < 0 {
		return nil, fmt.Errorf("otelworklog: Options.Slots: must be >= 0, got %d", o.Slots)
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.Propagator == nil {
		o.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	in := &Instrumentation{
		tracer: o.TracerProvider.Tracer(ScopeName),
		meter:  o.MeterProvider.Meter(ScopeName),
		prop:   o.Propagator,
		slots:  int64(o.Slots),
	}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	in.duration, err = in.meter.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a task's handler ran."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 300))
	add(err)
	in.consumed, err = in.meter.Int64Counter("messaging.client.consumed.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Tasks a runner finished handling."))
	add(err)
	in.sent, err = in.meter.Int64Counter("messaging.client.sent.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Tasks submitted through this instrumentation."))
	add(err)
	_, err = in.meter.Int64ObservableUpDownCounter("worklog.runner.slots.used", metric.WithUnit("{slot}"),
		metric.WithDescription("Task handlers running now."),
		metric.WithInt64Callback(func(_ context.Context, ob metric.Int64Observer) error {
			ob.Observe(in.running.Load(), metric.WithAttributes(systemWorklog))
			return nil
		}))
	add(err)
	in.leaseLost, err = in.meter.Int64Counter("worklog.runner.lease_lost", metric.WithUnit("{task}"),
		metric.WithDescription("Results not recorded because the lease had been lost: a stale worker, fenced."))
	add(err)
	if o.Slots > 0 {
		_, err = in.meter.Int64ObservableGauge("worklog.runner.slots.available", metric.WithUnit("{slot}"),
			metric.WithDescription("Runner slots free now."),
			metric.WithInt64Callback(func(_ context.Context, ob metric.Int64Observer) error {
				ob.Observe(max(in.slots-in.running.Load(), 0), metric.WithAttributes(systemWorklog))
				return nil
			}))
		add(err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otelworklog: making instruments: %w", err)
	}
	return in, nil
}

// headerCarrier adapts a task's Headers to the propagator.
type headerCarrier map[string]string

func (c headerCarrier) Get(k string) string { return c[k] }
func (c headerCarrier) Set(k, v string)     { c[k] = v }
func (c headerCarrier) Keys() []string {
	ks := make([]string, 0, len(c))
	for k := range c {
		ks = append(ks, k)
	}
	return ks
}

// Inject writes the trace context of ctx (its active span, and baggage with the default
// propagator) into r.Headers, making the map if needed. Headers already there stay unless
// the propagator writes the same keys. Nothing is written when ctx has no span.
func (in *Instrumentation) Inject(ctx context.Context, r *work.TaskRequest) {
	c := headerCarrier(r.Headers)
	if c == nil {
		c = headerCarrier{}
	}
	in.prop.Inject(ctx, c)
	if len(c) > 0 {
		r.Headers = c
	}
}

// Extract returns ctx with the trace context carried in t's headers (the submitter's).
func (in *Instrumentation) Extract(ctx context.Context, t work.Task) context.Context {
	if len(t.Headers) == 0 {
		return ctx
	}
	return in.prop.Extract(ctx, headerCarrier(t.Headers))
}

// Submit submits r in session s inside a "send <kind>" PRODUCER span, with the span's
// context injected into r's headers, and counts it in messaging.client.sent.messages. A
// resubmit that returns an existing task keeps that task's headers (headers are not part of
// the idempotency intent), so its runs link to the first submitter.
func (in *Instrumentation) Submit(ctx context.Context, s *work.Session, r work.TaskRequest) (work.Task, error) {
	ctx, span := in.tracer.Start(ctx, "send "+r.Kind, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(systemWorklog, keyOperationType.String("send"), keyOperationName.String("send"),
			keyDestination.String(r.Kind), keySession.String(s.ID())))
	defer span.End()
	r.Headers = cloneHeaders(r.Headers)
	in.Inject(ctx, &r)
	t, err := s.Submit(ctx, r)
	if err != nil {
		recordError(span, err)
		return t, err
	}
	span.SetAttributes(keyMessageID.String(t.ID))
	in.sent.Add(ctx, 1, metric.WithAttributes(systemWorklog, keyDestination.String(r.Kind), keyOperationName.String("send")))
	return t, nil
}

// SubmitMany submits rs in session s as one batch (Session.SubmitMany) inside one PRODUCER
// span — "send <kind>" when every request has that kind, else "send" — with
// messaging.batch.message_count, the span's context injected into every request's headers,
// and each task that was submitted counted in messaging.client.sent.messages. An item's own
// error (a conflict) is recorded as a span event; the batch's error fails the span.
func (in *Instrumentation) SubmitMany(ctx context.Context, s *work.Session, rs []work.TaskRequest) ([]work.SubmitResult, error) {
	name := "send"
	if len(rs) > 0 {
		name = "send " + rs[0].Kind
		for _, r := range rs[1:] {
			if r.Kind != rs[0].Kind {
				name = "send"
				break
			}
		}
	}
	attrs := []attribute.KeyValue{systemWorklog, keyOperationType.String("send"), keyOperationName.String("send"),
		keySession.String(s.ID()), attribute.Int("messaging.batch.message_count", len(rs))}
	if name != "send" {
		attrs = append(attrs, keyDestination.String(rs[0].Kind))
	}
	ctx, span := in.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer span.End()
	own := make([]work.TaskRequest, len(rs))
	for i, r := range rs {
		r.Headers = cloneHeaders(r.Headers)
		in.Inject(ctx, &r)
		own[i] = r
	}
	res, err := s.SubmitMany(ctx, own)
	if err != nil {
		recordError(span, err)
		return res, err
	}
	for i, r := range res {
		if r.Err != nil {
			span.AddEvent("item refused", trace.WithAttributes(attribute.Int("worklog.batch.index", i),
				keyErrorType.String(errorType(r.Err))))
			continue
		}
		in.sent.Add(ctx, 1, metric.WithAttributes(systemWorklog, keyDestination.String(own[i].Kind), keyOperationName.String("send")))
	}
	return res, nil
}

func cloneHeaders(h map[string]string) map[string]string {
	if h == nil {
		return nil
	}
	c := make(map[string]string, len(h)+2)
	for k, v := range h {
		c[k] = v
	}
	return c
}

func recordError(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(keyErrorType.String(errorType(err)))
}

// errorType is error.type, a stable name of bounded cardinality (OpenTelemetry's semantic
// conventions): the kind sentinel a worklog error matches ("timeout", "lease_expired",
// "stale_delivery", ...), "panic" for a handler's panic, else the Go type of the first error
// in the chain that is the application's own (a user type: "*billing.DeclinedError"), else
// "permanent" for an error marked runner.Permanent, else "_OTHER" (an errors.New or
// fmt.Errorf error has no type worth naming).
func errorType(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{runner.ErrTimeout, "timeout"},
		{runner.ErrLeaseExpired, "lease_expired"},
		{runner.ErrLeaseLost, "lease_lost"},
		{runner.ErrCancelRequested, "cancel_requested"},
		{runner.ErrStopping, "stopping"},
		{work.ErrInvalidRequest, "invalid_request"},
		{work.ErrIdempotencyConflict, "idempotency_conflict"},
		{work.ErrTaskNotFound, "task_not_found"},
		{work.ErrStaleDelivery, "stale_delivery"},
		{work.ErrInvalidTransition, "invalid_transition"},
		{work.ErrClosed, "closed"},
		{work.ErrBackend, "backend"},
		{context.Canceled, "context_canceled"},
		{context.DeadlineExceeded, "context_deadline_exceeded"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	var p *runner.PanicError
	if errors.As(err, &p) {
		return "panic"
	}
	for e := err; e != nil; e = unwrapFirst(e) {
		if t := reflect.TypeOf(e); !anonymousErrors[t] {
			return t.String()
		}
	}
	if runner.IsPermanent(err) {
		return "permanent"
	}
	return "_OTHER"
}

// anonymousErrors are the types of errors that say nothing about their kind: the standard
// library's errors.New, fmt.Errorf and errors.Join, and runner.Permanent's wrapper.
var anonymousErrors = func() map[reflect.Type]bool {
	base := errors.New("x")
	m := map[reflect.Type]bool{}
	for _, e := range []error{base, fmt.Errorf("%w", base), fmt.Errorf("%w %w", base, base), errors.Join(base), runner.Permanent(base)} {
		m[reflect.TypeOf(e)] = true
	}
	return m
}()

// unwrapFirst is the error err wraps, the first one when it wraps several.
func unwrapFirst(err error) error {
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return u.Unwrap()
	case interface{ Unwrap() []error }:
		if es := u.Unwrap(); len(es) > 0 {
			return es[0]
		}
	}
	return nil
}

// Hooks returns the runner hooks: a "process <kind>" span around each handler run, the
// runner's metrics. Set it as runner.Config.Hooks (wrap it to add hooks of your own).
func (in *Instrumentation) Hooks() runner.Hooks { return hooks{in} }

type hooks struct{ in *Instrumentation }

func (h hooks) TaskStart(ctx context.Context, d work.TaskDelivery) context.Context {
	in := h.in
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(systemWorklog, keyOperationType.String("process"), keyOperationName.String("process"),
			keyMessageID.String(d.Task.ID), keyDestination.String(d.Task.Kind), keySession.String(d.Task.SessionID),
			keyAttempt.Int64(int64(d.Attempt)), keyWorker.String(d.Worker)),
	}
	if sc := trace.SpanContextFromContext(in.Extract(context.Background(), d.Task)); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, _ = in.tracer.Start(ctx, "process "+d.Task.Kind, opts...)
	in.running.Add(1)
	return ctx
}

func (h hooks) TaskEnd(ctx context.Context, d work.TaskDelivery, r runner.TaskResult) {
	in := h.in
	span := trace.SpanFromContext(ctx)
	k := endKey{kind: d.Task.Kind, outcome: r.Result.String()}
	switch {
	case r.SettleErr != nil:
		k.errType = errorType(r.SettleErr)
		span.RecordError(r.SettleErr)
		span.SetStatus(codes.Error, "recording the result failed: "+r.SettleErr.Error())
	case r.Result == runner.LeaseLost:
		k.errType = "lease_lost"
		msg := "lease lost: another worker claimed the task"
		if errors.Is(r.Err, runner.ErrLeaseExpired) {
			k.errType, msg = "lease_expired", "lease expired: it could not be extended, nothing was recorded"
		}
		span.SetStatus(codes.Error, msg)
	case r.Err != nil:
		k.errType = errorType(r.Err)
		span.RecordError(r.Err)
		if r.Result == runner.Failed {
			span.SetStatus(codes.Error, r.Err.Error())
		}
	}
	if span.IsRecording() {
		span.AddEvent("settle", trace.WithAttributes(keyOutcome.String(k.outcome)))
		span.SetAttributes(keyOutcome.String(k.outcome))
		if r.Seq != 0 {
			span.SetAttributes(keyEventSeq.Int64(int64(r.Seq)))
		}
		if k.errType != "" {
			span.SetAttributes(keyErrorType.String(k.errType))
		}
	}
	if r.Result == runner.LeaseLost {
		in.leaseLost.Add(ctx, 1, metric.WithAttributes(systemWorklog, keyDestination.String(d.Task.Kind)))
	}
	set := in.endSet(k)
	if r.Duration > 0 {
		in.duration.Record(ctx, r.Duration.Seconds(), set)
	}
	in.consumed.Add(ctx, 1, set)
	in.running.Add(-1)
	span.End()
}

func (h hooks) WakeStart(ctx context.Context, d work.WakeDelivery) context.Context {
	ctx, _ = h.in.tracer.Start(ctx, "process wake", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(systemWorklog, keyOperationType.String("process"), keyOperationName.String("process"),
			keyMessageID.String(d.Wake.ID), keyDestination.String("wake"), keySession.String(d.Wake.SessionID),
			keyAttempt.Int64(int64(d.Attempt)), keyWorker.String(d.Worker)))
	return ctx
}

func (h hooks) WakeEnd(ctx context.Context, _ work.WakeDelivery, err error) {
	span := trace.SpanFromContext(ctx)
	if err != nil {
		recordError(span, err)
	}
	span.End()
}

// ObserveQueue reports q's health as observable gauges, read from q.Stats at each
// collection (on every backend the counts come from the fold: no scan): worklog.tasks by
// state and kind, worklog.queue.due and worklog.queue.oldest_due_age. The returned function
// unregisters the callback; call it before closing q.
func (in *Instrumentation) ObserveQueue(q *work.Queue) (unregister func() error, err error) {
	tasks, err1 := in.meter.Int64ObservableGauge("worklog.tasks", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks by state and kind."))
	due, err2 := in.meter.Int64ObservableGauge("worklog.queue.due", metric.WithUnit("{task}"),
		metric.WithDescription("Tasks claimable now: due pending tasks and running ones whose lease expired."))
	age, err3 := in.meter.Float64ObservableGauge("worklog.queue.oldest_due_age", metric.WithUnit("s"),
		metric.WithDescription("How long the task that has waited longest among those due has waited; 0 when none is due."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("otelworklog: making queue gauges: %w", err)
	}
	reg, err := in.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, err := q.Stats(ctx)
		if err != nil {
			return err
		}
		for _, k := range st.Kinds {
			for _, sc := range stateCounts(k.StateCounts) {
				o.ObserveInt64(tasks, sc.n, metric.WithAttributes(systemWorklog, keyDestination.String(k.Kind), keyState.String(sc.state)))
			}
		}
		o.ObserveInt64(due, st.DueNow, metric.WithAttributes(systemWorklog))
		o.ObserveFloat64(age, st.OldestDueAge.Seconds(), metric.WithAttributes(systemWorklog))
		return nil
	}, tasks, due, age)
	if err != nil {
		return nil, fmt.Errorf("otelworklog: registering the queue callback: %w", err)
	}
	return reg.Unregister, nil
}

type stateCount struct {
	state string
	n     int64
}

// stateCounts lists c by state name (the names of work.TaskState), zero counts included, so
// a gauge drops to zero rather than vanishing when the last task leaves a state.
func stateCounts(c work.StateCounts) []stateCount {
	return []stateCount{
		{"pending", c.Pending}, {"running", c.Running}, {"succeeded", c.Succeeded},
		{"failed", c.Failed}, {"canceled", c.Canceled},
	}
}
