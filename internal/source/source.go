// Package source is the one read-only view of a stored queue that tools read: its log, its
// projection, its pruned ranges and its own check. A Pebble store opened read-only
// (*pebblelog.Store) and a PostgreSQL queue opened read-only (*postgres.Store) both implement
// Source, so the replay tool (and the console's time travel) read either the same way and
// print the same output for the same log.
//
// It lives in a package of its own, depending only on events and projection, so that both
// backends implement it without importing each other (docs/design.md §1).
package source

import (
	"bytes"
	"context"
	"encoding/binary"
	"strings"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Source is read-only access to a stored queue. Every method takes the caller's context
// first; a context that is already done is refused with its error. Sequences are the log's
// (1-based); a range's to of 0 means the end of the log. A callback's error stops the walk
// and is returned as it is.
//
// A source whose writers go on (a live PostgreSQL queue) answers each call from what was
// committed when the call began: a caller that wants one cut reads LastSeq first and bounds
// its ranges by it (every snapshot of the log is a prefix of the next one, pruned ranges
// apart).
type Source interface {
	// LastSeq is the sequence of the last committed event (0 for an empty log).
	LastSeq(ctx context.Context) (uint64, error)
	// View calls fn with one consistent committed projection, values (inputs, payloads)
	// filled. fn must not keep the Reader after it returns.
	View(ctx context.Context, fn func(projection.Reader) error) error

	// Event reads the event at seq; an event that is missing (pruned, or never written) is an
	// error matching events.ErrCorrupt.
	Event(ctx context.Context, seq uint64) (events.Event, error)
	// RawEvent returns the wire bytes of the event at seq (events.Append's encoding), and
	// false when there is none (seq 0, past the head, or pruned).
	RawEvent(ctx context.Context, seq uint64) ([]byte, bool, error)
	// ReadRange calls fn with each event from..to, in order. A gap that no pruned range
	// explains, or an event that does not decode, stops it with an error naming the sequence.
	ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error
	// FoldRange is ReadRange for a caller that keeps no event after fn returns (a fold): a
	// source may reuse the event's memory for the next one of its type. The event's strings
	// and byte strings may be kept.
	FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error
	// RawLog calls fn with each event's wire bytes from..to, in order.
	RawLog(ctx context.Context, from, to uint64, fn func(seq uint64, raw []byte) error) error

	// Sessions calls fn with every session that has events, in SessionOrder.
	Sessions(ctx context.Context, fn func(session string) error) error
	// SessionSeqs calls fn with the sequence of each event of session from seq from, in order,
	// without reading other sessions' events.
	SessionSeqs(ctx context.Context, session string, from uint64, fn func(seq uint64) error) error
	// SessionLog is SessionSeqs with the events themselves.
	SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error

	// ScanTasks calls fn with every stored task record, in id order.
	ScanTasks(ctx context.Context, fn func(*projection.Task) error) error
	// ScanWakes calls fn with every stored wake record, in id order.
	ScanWakes(ctx context.Context, fn func(*projection.Wake) error) error
	// PrunedRanges returns the ranges of sequences that Queue.Prune removed from the log, in
	// order and coalesced: gaps of the log that are explained, not damage.
	PrunedRanges(ctx context.Context) (projection.SeqRanges, error)

	// DiskUsage is the bytes the store occupies (on disk, or in the database's tables).
	DiskUsage(ctx context.Context) (uint64, error)
	// Verify rebuilds the projection from the log with the live store's fold and returns
	// every difference from the stored one, and every gap or undecodable event of the log;
	// none when the store is sound. An error is a failure to check, not a finding.
	Verify(ctx context.Context, vo VerifyOptions) ([]string, error)
	// Close releases the source. No method may be called after it.
	Close() error
}

// VerifyOptions are Source.Verify's options: projection.VerifyOptions, declared in a public
// package so that pebblelog's and postgres's Store.Verify name no internal type.
type VerifyOptions = projection.VerifyOptions

// SessionOrder compares two session ids in the order every Source lists them: by the
// session's length in bytes encoded as an unsigned varint (encoding/binary.AppendUvarint),
// then by its bytes. That is the byte order of the Pebble store's per-session index keys, so
// a listing costs Pebble one seek per session; a backend that stores sessions otherwise
// sorts by this function. For sessions shorter than 128 bytes it is shorter first, then byte
// order.
func SessionOrder(a, b string) int {
	if len(a) == len(b) {
		return strings.Compare(a, b)
	}
	// Different lengths never encode alike, so the lengths decide.
	var ka, kb [binary.MaxVarintLen64]byte
	na := binary.PutUvarint(ka[:], uint64(len(a)))
	nb := binary.PutUvarint(kb[:], uint64(len(b)))
	return bytes.Compare(ka[:na], kb[:nb])
}
