package runner

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/worklog/worklog/work"
)

// Result is what became of a task the runner handled (Hooks.TaskEnd).
type Result int

const (
	Succeeded Result = iota // settled with the handler's output
	Failed                  // settled as failed: permanent error, last attempt, or attempts used up
	Retried                 // released, to run again at TaskResult.RetryAt
	Canceled                // settled as canceled: a cancel was requested
	LeaseLost               // the lease was lost (Err: ErrLeaseLost, another worker claimed the task) or ran out (ErrLeaseExpired); nothing recorded
	Released                // a graceful stop ran out of time and gave the task back
)

var resultNames = [...]string{"succeeded", "failed", "retried", "canceled", "lease_lost", "released"}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// TaskResult describes a task's end for Hooks.TaskEnd.
type TaskResult struct {
	Result   Result
	Err      error         // the handler's error (nil when it succeeded)
	Duration time.Duration // how long the handler ran (0 when it did not run)
	RetryAt  time.Time     // Retried: when the task runs again
	// SettleErr is the error of recording the result, if any (the task then stays claimed
	// until its lease expires and is delivered again).
	SettleErr error
	// Seq is the sequence number of the log event that recorded the result (the task's
	// task_settled, or task_released for a retry or a stop's release: see
	// work.SettleResult.Seq), for finding it in the log (replay task, Queue.ReadLog). It is
	// 0 when no event was recorded: SettleErr is set, the lease was lost, the queue's backend
	// does not report it (a custom work.Backend), or the result had been recorded before (a
	// round the queue ran again).
	Seq uint64
}

// Hooks is told about the tasks and wakes a runner handles, for metrics and tracing (an
// OpenTelemetry span, a Prometheus histogram) without the runner depending on either.
// Methods are called from the runner's goroutines and must be quick and safe for
// concurrent use. Embed NoHooks to implement only some of them. A method that panics is
// recovered and logged (at Error, with the stack), and the runner goes on as if it had
// returned: a TaskStart or WakeStart that panics leaves the handler its own context.
type Hooks interface {
	// TaskStart is called before a task's handler runs; the handler runs with the context
	// it returns (a span's).
	TaskStart(ctx context.Context, d work.TaskDelivery) context.Context
	// TaskEnd is called once the task's result is recorded (or known lost), with the
	// context TaskStart returned; for a recorded result, after the round that recorded it
	// has started the tasks it claimed (no round waits for TaskEnd). Stop returns after
	// every TaskEnd it caused has returned.
	TaskEnd(ctx context.Context, d work.TaskDelivery, r TaskResult)
	// WakeStart and WakeEnd are the same for wakes; err is the handler's error or the
	// acknowledgment's.
	WakeStart(ctx context.Context, d work.WakeDelivery) context.Context
	WakeEnd(ctx context.Context, d work.WakeDelivery, err error)
}

// NoHooks implements Hooks with methods that do nothing.
type NoHooks struct{}

func (NoHooks) TaskStart(ctx context.Context, _ work.TaskDelivery) context.Context { return ctx }
func (NoHooks) TaskEnd(context.Context, work.TaskDelivery, TaskResult)             {}
func (NoHooks) WakeStart(ctx context.Context, _ work.WakeDelivery) context.Context { return ctx }
func (NoHooks) WakeEnd(context.Context, work.WakeDelivery, error)                  {}

// The runner calls its hooks through these, which recover a hook's panic: a hook must not
// kill the host process, nor keep a task from running or its result from being recorded.

func (r *Runner) taskStart(base context.Context, d work.TaskDelivery) context.Context {
	var ctx context.Context
	if !r.hook("TaskStart", "task_id", d.Task.ID, func() { ctx = r.hooks.TaskStart(base, d) }) || ctx == nil {
		return base
	}
	return ctx
}

func (r *Runner) taskEnd(ctx context.Context, d work.TaskDelivery, res TaskResult) {
	r.hook("TaskEnd", "task_id", d.Task.ID, func() { r.hooks.TaskEnd(ctx, d, res) })
}

func (r *Runner) wakeStart(base context.Context, d work.WakeDelivery) context.Context {
	var ctx context.Context
	if !r.hook("WakeStart", "wake_id", d.Wake.ID, func() { ctx = r.hooks.WakeStart(base, d) }) || ctx == nil {
		return base
	}
	return ctx
}

func (r *Runner) wakeEnd(ctx context.Context, d work.WakeDelivery, err error) {
	r.hook("WakeEnd", "wake_id", d.Wake.ID, func() { r.hooks.WakeEnd(ctx, d, err) })
}

// hook runs call, a call of the hook method named method about the task or wake id
// (subject: the log key, "task_id" or "wake_id"), and recovers its panic: logged with the panic's stack (the
// deferred function runs on it), and reported as false.
func (r *Runner) hook(method, subject, id string, call func()) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			r.log.Error("runner: Hooks."+method+" panicked (recovered)",
				subject, id, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			ok = false
		}
	}()
	call()
	return true
}

// taskAttrs are the attributes of every log record about a task: its id, session, kind and
// attempt, under the same keys everywhere, so that a log pipeline can join a task's records
// (and contrib/otelworklog's handler adds trace_id and span_id from the record's context).
// They are typed for a JSON handler as for a text one: ids are strings, the attempt a
// number; elsewhere results are words ("result":"retried") and durations are seconds with
// the unit in the key ("duration_seconds":1.5), never a Duration's nanoseconds.
func taskAttrs(d work.TaskDelivery) []any {
	return []any{slog.String("task_id", d.Task.ID), slog.String("session", d.Task.SessionID),
		slog.String("kind", d.Task.Kind), slog.Uint64("attempt", uint64(d.Attempt))}
}
