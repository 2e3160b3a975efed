// Package runner runs handlers on a worklog queue: the worker loop people would otherwise
// write around work.Queue's claims, heartbeats and settlements, modelled on what River's
// client does for its users.
//
//	r, err := runner.New(q, runner.Config{
//		Handlers:    map[string]runner.Handler{"email.send": sendEmail},
//		Concurrency: 16,
//		LeaseFor:    30 * time.Second,
//	})
//	...
//	r.Start()
//	...
//	r.Stop(ctxWithTimeout) // graceful
//
// What a runner does:
//
//   - It claims only the kinds it has handlers for (Queue.ClaimKinds' rules), and runs at
//     most Concurrency handlers at once, each in its own goroutine.
//   - It records results and claims the next tasks in groups: one Queue.SettleAndClaim
//     settles every delivery finished since the last round and claims as many tasks as there
//     are free slots, in one durable step (one fsync on a store opened with work.Open), so a
//     worker never waits a full fsync round trip per task.
//   - It never polls: with nothing to claim it blocks in Queue.WaitTasks, which returns on a
//     commit that may have made work claimable (in this process, or in another one on a
//     shared engine), at the earliest scheduled time or lease expiry, or when a running
//     handler finishes. An idle runner uses no CPU.
//   - Each claim has a lease of LeaseFor, extended every Heartbeat (a third of the lease by
//     default) while its handler runs. A heartbeat that sees a cancel request cancels the
//     handler's context (context.Cause: ErrCancelRequested); one that finds the lease lost
//     (work.ErrStaleDelivery: another worker claimed the task after the lease expired)
//     cancels it with ErrLeaseLost, and then the runner records nothing for it.
//   - A handler never outlives its lease: when heartbeats fail (the queue cannot be
//     reached), its context ends LeaseMargin before the lease can expire (cause
//     ErrLeaseExpired), and the runner records nothing for it, so two handlers of one task
//     never run at once. Timeout and KindTimeouts limit an attempt's run (cause ErrTimeout:
//     a failure, retried like any error); the limit and the lease share one deadline.
//   - Results: a handler's nil error settles the task as succeeded with the returned output;
//     an error releases it (Queue.Release) to run again after Backoff (exponential with
//     jitter by default), until MaxAttempts, when it fails; an error marked with Permanent
//     fails it at once; an error after a cancel request settles it as canceled; a panic is
//     recovered and treated as an error (*PanicError: the log gets its stack, the queue
//     records only its value and the frame that panicked). A task
//     claimed beyond MaxAttempts (its earlier workers died) fails without running, so a task
//     that crashes its worker is not delivered forever.
//   - Wakes: with a WakeHandler, the runner also claims the queue's wakes and acknowledges
//     each one whose handler returns nil. A runner may have a WakeHandler and no Handlers:
//     it then claims no tasks. WakeSessions restricts it to the wakes of those sessions
//     (work.Queue.ClaimSessionWakes), leaving other sessions' wakes to other runners.
//   - Stop is graceful: it stops claiming, lets running handlers finish within its context,
//     then cancels the rest (ErrStopping) and releases their tasks so that they are delivered
//     again at once, not when their leases expire. It returns within its context, or at the
//     latest StopGrace after it, also when the store stopped answering: every call the
//     runner makes to the queue is bounded. What it could not do (tasks released, results
//     not recorded because the queue closed or the store failed) is in its *StopError.
//   - A Hooks method (or Config.Backoff) that panics is recovered and logged: it never
//     kills the host process nor loses a task's result.
//   - It logs with log/slog (Config.Logger), with attributes typed for a JSON handler
//     (results as words, durations in seconds with the unit in the key, ids as strings): a
//     retry at Info (the queue will try again, nothing to do yet), a failure on the last
//     attempt at Warn (errors worth retrying wore the task out), a permanent failure and a
//     result that could not be recorded at Error (the handler gave up, or the store failed),
//     a success at Debug. It tells Config.Hooks about every task and wake
//     it handles, so metrics and tracing (OpenTelemetry, Prometheus) plug in without being
//     dependencies of worklog.
//
// Delivery is at least once, as the queue's: a handler may run again for a task whose earlier
// run was not recorded (its process died, its lease was lost), so handlers should be
// idempotent. Every result is recorded exactly once: the queue fences a late worker by its
// lease token.
package runner
