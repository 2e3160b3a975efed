// Package pebblelog stores worklog's event log and its projection in one Pebble database.
//
// Every command is one atomic Pebble batch that holds its events, keyed by a big-endian
// global sequence, and the projection changes they cause (task and wake records, the
// eligibility and idempotency indexes, the last sequence). A single writer goroutine drains
// every waiting command into one batch and commits it with one fsync (group commit), so
// sequence order equals commit order and concurrent callers share syncs. The projection lives
// on disk: Open does not replay the log, and memory is bounded by Pebble's cache and
// memtables, not by history.
//
// The key layout, the sync rules and recovery are described in docs/design.md.
//
// # Caveats
//
// Pebble takes an exclusive lock on its directory even for a read-only open, so a store held
// by a running process cannot be opened by another; take a Checkpoint and open that.
// Pebble makes a committed batch visible to readers a moment before its fsync completes: a
// concurrent reader may see a transition whose caller has not been answered yet (and that a
// machine crash in that window would lose). Callers are only ever answered after the sync.
package pebblelog
