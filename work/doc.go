// Package work is worklog's public API: durable, session-owned background work and wakes.
//
// A Queue holds tasks and wakes. A Session (Queue.Session) submits tasks, reads and cancels
// its own tasks, and records direct wakes. Workers claim due tasks with leased,
// at-least-once deliveries (Queue.ClaimDue) and settle them (Queue.Finish); a settled task
// with WakeOnCompletion records one wake for its session, which is claimed
// (Queue.ClaimWakes) and acknowledged (Queue.AckWake) in the same leased way; a runtime
// that serves some sessions claims only theirs (Queue.ClaimSessionWakes).
//
// The semantics are those of the work module of the Rust crate everruns; docs/design.md
// lists every deliberate difference.
//
// # Backends
//
// NewInMemory keeps everything in this process. Open keeps it in a Pebble store on disk:
// every acknowledged call has been fsynced. Both are event-sourced with the same code: each
// command decides the events it causes from the current projection, appends them to the log
// and folds them into the projection (package projection) in one atomic step. New wraps any
// other Backend.
//
// # Time and randomness
//
// Every method that records a transition has an ...At twin that takes the caller's time;
// the plain one uses the queue's clock: the host's wall clock for NewInMemory and Open, the
// database server's for postgres.Open (one clock for every host sharing the queue), a
// Backend's own for New over a Backend that is a Clock. The core never reads the clock
// itself. Ids are
// "task_"/"wake_" plus a UUIDv7 built from the caller's time and crypto-strength random
// bits; lease tokens are 128 random bits.
//
// # Delivery
//
// Delivery is at least once. A claim leases a task until now+leaseFor; an unfinished
// lease that expires makes the task claimable again, with a new token, and the old token can
// no longer settle it. Handlers should use Task.ID or Task.IdempotencyKey to make their
// side effects idempotent. Cancellation of running work is cooperative.
//
// # Errors
//
// Every error matches exactly one of ErrInvalidRequest, ErrTaskNotFound,
// ErrIdempotencyConflict, ErrStaleDelivery, ErrInvalidTransition and ErrBackend with
// errors.Is; errors.As gives a *Error with the field, id or key.
//
// # Caveats
//
// A lease token never appears in fmt output, logs or errors; LeaseToken returns it for
// workers that must hand a delivery across a process boundary.
package work
