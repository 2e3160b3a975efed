package pebblelog

import (
	"context"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// ErrNotNext: events or pruned ranges given to AppendLog do not continue the log (they are
// not its next sequences, or leave a gap no pruned range declares); nothing was appended.
var ErrNotNext = projection.ErrNotNext

// AppendLog imports a run of a log exported from another store (replay import): evs, events
// that already have their sequence numbers, and pruned, the ranges of sequences the source
// had pruned, in one batch through the writer, in sequence order (projection.ImportSteps).
// Each event is appended and folded as a command's is (Txn.Append); each range is recorded
// in the pruned ranges (coalesced with those it touches, as a prune records its own) and the
// last sequence moves past it, so the imported store's Verify explains the gap and its later
// prunes coalesce with it. A gap that no range declares is ErrNotNext naming the sequence.
func (s *Store) AppendLog(ctx context.Context, evs []events.Event, pruned []projection.SeqRange) error {
	return s.Update(ctx, func(tx *Txn) error {
		return projection.ImportSteps(tx.w.lastSeq+1, evs, pruned, tx.Append, func(r projection.SeqRange) error {
			if err := tx.w.addPruned(r); err != nil {
				return err
			}
			return tx.w.SetLastSeq(r.To)
		})
	})
}
