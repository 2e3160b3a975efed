// Package otelworklog connects worklog to OpenTelemetry: the submitter's trace carried with
// each task across the durable log, spans that follow OpenTelemetry's messaging conventions,
// metrics for the runner and the queue's health, and trace ids in the runner's log records.
//
// It is its own Go module (github.com/worklog/worklog/contrib/otelworklog), so that the core
// module never depends on OpenTelemetry, as River keeps otelriver in rivercontrib.
//
// Turning it on takes five lines:
//
//	inst, err := otelworklog.New(nil)                    // global tracer and meter providers
//	task, err := inst.Submit(ctx, q.Session("s1"), req) // "send <kind>" span; trace context in req.Headers
//	cfg.Hooks = inst.Hooks()                            // "process <kind>" spans and runner metrics
//	stop, err := inst.ObserveQueue(q)                   // queue health as observable gauges
//	cfg.Logger = slog.New(otelworklog.LogHandler(h))    // trace_id and span_id in the runner's log
//
// # Propagation
//
// Submit (or Inject, for a hand-written submit) writes the active span context into the
// task's Headers with the configured propagator (W3C traceparent/tracestate by default).
// The headers are stored in the task_submitted event, so they survive restarts and show in
// replay. The runner's hooks extract them when the task runs and give the "process" span a
// link to the submitter's span, not a parent: the run may be hours later, in another
// process, and a trace that lasted hours would be useless. The handler's context carries the
// process span, so spans the handler starts are its children.
//
// The console (package console) shows a task's trace id from its traceparent header, linked
// to a tracing UI with console.Options.TraceURL.
//
// # Spans
//
// There is no OpenTelemetry convention for job queues; the messaging conventions fit a
// durable queue closely and are used where they apply, worklog.* attributes for the rest:
//
//	send <kind>     PRODUCER  around Submit and SubmitMany
//	process <kind>  CONSUMER  around each handler run, linked to the submitter's span
//
// Attributes: messaging.system=worklog, messaging.operation.type (send, process),
// messaging.operation.name, messaging.message.id (the task id), messaging.destination.name
// (the kind), worklog.session.id, worklog.task.attempt, worklog.worker, and at the end
// worklog.outcome (succeeded, failed, retried, canceled, lease_lost, released) and error.type.
// error.type is a stable name of bounded cardinality, as OpenTelemetry's conventions ask:
// timeout (past runner.Config.Timeout), lease_expired (the lease could not be extended),
// lease_lost, panic, a worklog error's kind (stale_delivery, backend, ...), the Go type of the
// application's own error type when the error has one (*billing.DeclinedError, through
// wrapping and runner.Permanent), permanent for a runner.Permanent error of no type of its
// own, and _OTHER for a plain errors.New or fmt.Errorf error.
// The settlement is a span event ("settle") on the process span rather than a span of its
// own: the runner records results in batches (one fsync for many tasks), so a per-task
// settle span would time the batch, not the task. When the result was recorded, the process
// span has worklog.event.seq: the sequence number of the log event that recorded it
// (runner.TaskResult.Seq: the task_settled, or the task_released of a retry), to find it
// in the log (replay log, replay task, the console). It is absent when nothing was recorded
// (lease lost, a failed settle) or the queue's backend does not report it.
//
// # Metrics
//
// Instruments (ids never go on metric attributes, which must stay of bounded cardinality:
// kinds, states and outcomes only):
//
//	messaging.process.duration        histogram, s   handler run time, by kind and outcome
//	messaging.client.consumed.messages counter        tasks a runner finished handling, by kind
//	messaging.client.sent.messages     counter        tasks submitted through Submit/SubmitMany, by kind
//	worklog.runner.slots.used          up-down counter handlers running now
//	worklog.runner.slots.available     gauge          Options.Slots minus the slots used
//	worklog.runner.lease_lost          counter        results not recorded: the lease had been lost (a stale, fenced worker) or ran out (runner.ErrLeaseExpired)
//	worklog.tasks                      gauge          tasks by state and kind (Queue.Stats)
//	worklog.queue.due                  gauge          tasks claimable now
//	worklog.queue.oldest_due_age       gauge, s       how long the oldest due task has waited
//
// Through OpenTelemetry's Prometheus exporter they are scraped as, for example,
// worklog_queue_oldest_due_age_seconds and messaging_process_duration_seconds; grafana.json
// in this directory is a dashboard over them.
package otelworklog
