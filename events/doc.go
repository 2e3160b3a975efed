// Package events defines worklog's event catalogue and its wire encoding.
//
// Every transition of a task or a wake is one event: a task submitted, claimed, settled or
// asked to cancel; a wake recorded, claimed or acknowledged; and two audit events that record
// a rejected settlement or acknowledgment without changing state. Events are appended to a log
// in sequence order; package projection folds them into task and wake state.
//
// # Wire format
//
// The encoding is a wire format: stores written today must decode forever. An encoded event is
//
//	byte 0     envelope version (EnvelopeV1 = 1)
//	byte 1     event type (a Type; numbers are never reused or renumbered)
//	byte 2     schema version of that type's body
//	bytes 3..  the body: one msgpack array whose fields are listed per type below
//	last 4     CRC-32C (Castagnoli) of every byte before it, big-endian
//
// A newer schema version may only append fields to the body array; a decoder of version v
// reads the fields it knows and rejects a body shorter than its version requires. Golden
// encodings of every type live in testdata/ and are decoded by the tests forever.
//
// Times are Unix nanoseconds (int64), the caller's time; worklog never reads the clock.
// JSON values (task input, wake payload, task output) are carried as the caller's bytes.
//
// # Caveats
//
// Lease tokens travel inside TaskClaimed, TaskSettled, WakeClaimed and WakeAcked: the log is
// the authority that fences stale workers after a restart. Tools that print events must
// redact them (see Redacted).
package events
