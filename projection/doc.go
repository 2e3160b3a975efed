// Package projection folds worklog events into task and wake state.
//
// Apply is a pure, deterministic fold: given a State and the next event it checks the event
// against the state (the rule that event applies) and writes the new records and index
// entries. It does no I/O of its own, reads no clock and draws no randomness; the same events
// always give the same state. The live stores, recovery and the replay tool all use it.
//
// State is the small storage seam below the fold: point reads of task and wake records, the
// session-scoped idempotency indexes, two ordered eligibility indexes, and record access for
// Apply (EditTask, TaskEdited, NewTask, PutTask and their wake twins), through which a state
// chooses how a change lands: Mem hands out its own records, changed in place; package
// pebblelog's writer hands out copies and writes them back. Apply is one orchestration for
// both. The rules' predicates (Task.OwnedBy, RejectionRecordable, ClaimableAt,
// CompletionWakeDue) are methods of the records, so the decide code in package work asks the
// same questions the fold does.
//
// # Eligibility indexes
//
// A task is in the due index while it is pending (keyed by its scheduled time) or running
// (keyed by its lease expiry); ties break by the sequence of its submission. A wake is in the
// available index until acknowledged, keyed by its creation time or, while claimed, its lease
// expiry; ties by the sequence that recorded it. A claim at time now walks the index from the
// start while keys are <= now, so its cost is O(limit · log n) however many settled tasks or
// future tasks exist.
//
// # Caveats
//
// Apply checks every precondition before it writes anything, so a rejected event leaves the
// state untouched; an event that passes may write several records, and a store must make
// those writes atomic with the event's append.
package projection
