package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/worklog/worklog/events"
	engineapi "github.com/worklog/worklog/internal/engine"
)

// ErrNotNext: the events given to Importer.Append do not continue the log (their sequence
// numbers are not the log head's next ones): the log changed, or the events are not a
// contiguous run. Nothing was appended.
var ErrNotNext = errors.New("postgres: events do not continue the log")

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
	err := im.e.pool.QueryRow(ctx, im.e.st.lastSeq).Scan(&seq)
	return uint64(seq), err
}

// Append appends evs, whose sequence numbers must be the log's next ones in order, in one
// transaction, each folded as it is appended. An event the fold refuses fails the whole call
// (a *projection.ApplyError); events out of sequence fail with ErrNotNext naming the sequence.
func (im *Importer) Append(ctx context.Context, evs []events.Event) error {
	return im.e.Update(ctx, func(tx engineapi.Txn) error {
		last, err := tx.LastSeq()
		if err != nil {
			return err
		}
		for i, ev := range evs {
			if want := last + uint64(i) + 1; ev.Head().Seq != want {
				return fmt.Errorf("%w: event %d of the batch has seq %d, the log's next is %d", ErrNotNext, i, ev.Head().Seq, want)
			}
			if err := tx.Append(ev); err != nil {
				return err
			}
		}
		return nil
	})
}

// Verify folds the log from empty and lists every difference from the stored projection.
func (im *Importer) Verify(ctx context.Context) ([]string, error) { return im.e.Verify(ctx) }

// Close stops the writer and closes the connections.
func (im *Importer) Close() error { return im.e.Close() }
