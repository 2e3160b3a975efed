package postgres

import (
	"context"
	"fmt"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
	"github.com/worklog/worklog/projection"
)

// ErrNotNext: the events (or pruned ranges) given to Importer.Append or AppendLog do not
// continue the log (their sequence numbers are not the log head's next ones, or leave a gap
// no pruned range declares): the log changed, or the events are not a contiguous run. The
// error names the sequence; nothing was appended. It is projection.ErrNotNext, which
// pebblelog's import returns too.
var ErrNotNext = projection.ErrNotNext

// Importer appends events that already have their sequence numbers (a log exported from
// another store) to a queue's log, through the same writer, transaction and fold
// (projection.Apply) as a command's events: the stored projection is the fold of the
// imported log, as on the store it came from. It is how a log moves between backends; see
// replay import.
type Importer struct{ e *engine }

// OpenImporter opens (creating its tables when missing, as Open does) the queue in the schema
// dsn names, for Append.
func OpenImporter(ctx context.Context, dsn string) (*Importer, error) {
	e, err := open(ctx, dsn, (&Options{}).withDefaults(), false)
	if err != nil {
		return nil, err
	}
	e.startWriter()
	return &Importer{e: e}, nil
}

// Schema is the schema the queue's tables are in.
func (im *Importer) Schema() string { return im.e.schema }

// LastSeq is the sequence of the log's last committed event.
func (im *Importer) LastSeq(ctx context.Context) (uint64, error) {
	var seq int64
	err := queryRow(ctx, im.e, im.e.st.lastSeq, nil, &seq)
	return uint64(seq), err
}

// Append appends evs, whose sequence numbers must be the log's next ones in order, in one
// transaction, each folded as it is appended. An event the fold refuses fails the whole call
// (a *projection.ApplyError); events out of sequence fail with ErrNotNext naming the sequence.
func (im *Importer) Append(ctx context.Context, evs []events.Event) error {
	return im.AppendLog(ctx, evs, nil)
}

// AppendLog is Append for a log that was pruned: pruned are the ranges of sequences the
// source had pruned (sorted), taken in sequence order with evs (projection.ImportSteps). A
// gap between events is accepted only when a range declares it; the ranges are recorded in
// the pruned table, coalesced with those they touch, and the log head moves past them (a
// range may end the log), so Verify and ReadLog explain the gaps and a later prune coalesces
// with them. Anything else out of sequence is ErrNotNext naming the sequence.
func (im *Importer) AppendLog(ctx context.Context, evs []events.Event, pruned []projection.SeqRange) error {
	return im.e.Update(ctx, func(tx engineapi.Txn) error {
		t, ok := tx.(*txn)
		if !ok { // never: e.Update hands its closures its own transaction
			return fmt.Errorf("postgres: AppendLog ran in a %T, not the engine's transaction", tx)
		}
		var ranges []projection.SeqRange // recorded at the end, in one round trip
		err := projection.ImportSteps(t.seq+1, evs, pruned, t.Append, func(r projection.SeqRange) error {
			ranges = append(ranges, r)
			return t.SetLastSeq(r.To)
		})
		if err != nil || len(ranges) == 0 {
			return err
		}
		return t.addPruned(ranges)
	})
}

// Verify folds the log from empty and lists every difference from the stored projection.
func (im *Importer) Verify(ctx context.Context) ([]string, error) { return im.e.Verify(ctx) }

// Close stops the writer and closes the connections.
func (im *Importer) Close() error { return im.e.Close() }
