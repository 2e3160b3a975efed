package pebblelog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// Pruning into an archive (docs/design.md, "Retention", the archive): a prune group is
// removed in two phases, so that its events are on disk in the archive before the batch
// that deletes them commits, and the store's single writer never waits for the archive.
//
//  1. PlanPrune, outside the writer: the group Txn.Prune would remove now, chosen on a
//     snapshot made durable (a sync of the WAL after the snapshot), and each of its events'
//     wire bytes (RawEvent). The caller writes them into the archive and fsyncs it.
//  2. Txn.PruneArchived, in the writer: Txn.Prune of the group as it is then, only if every
//     event it removes was archived in phase 1; otherwise ErrNotArchived and nothing (a
//     subject became prunable before the others meanwhile): plan again.
//
// A crash between the phases leaves the events archived and live; the next prune archives
// them again, byte for byte the same (an event never changes), and readers of the archive
// keep one copy. Only durable events are archived: were the snapshot's newest batches lost
// in a crash, their sequences would be reused by other events, and the archive would hold
// a different event under the same sequence.

// ErrNotArchived: the group a prune would remove holds an event the caller did not archive;
// nothing was pruned.
var ErrNotArchived = errors.New("pebblelog: the prune group holds events that were not archived")

// PlanPrune finds the group Txn.Prune(before, limit) would remove now and calls fn with each
// of its events' sequence and wire bytes, ascending; raw is only valid during the call. It
// returns the group's sequences (sorted) and whether the group was full (more may be
// prunable). Everything it reads is durable when it returns.
//
// The events are read through RawEvent, the store's read path for an event's full wire
// bytes, after the group is chosen: an event never changes, and no other prune removes them
// meanwhile when, as in work, groups are planned and pruned one at a time. (One that did
// makes an event missing here: an error, and nothing is pruned.)
func (s *Store) PlanPrune(ctx context.Context, before int64, limit int, fn func(seq uint64, raw []byte) error) (_ []uint64, more bool, err error) {
	seqs, more, err := s.planGroup(before, limit)
	if err != nil {
		return nil, false, err
	}
	for _, seq := range seqs {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		v, ok, err := s.RawEvent(ctx, seq)
		if err != nil {
			return nil, false, fmt.Errorf("pebblelog: reading event at seq %d: %w", seq, err)
		}
		if !ok {
			return nil, false, fmt.Errorf("%w: event %d of a prunable subject is missing", ErrCorruptRecord, seq)
		}
		if err := fn(seq, v); err != nil {
			return nil, false, err
		}
	}
	return seqs, more, nil
}

// planGroup chooses the group on a snapshot made durable: its sequences, sorted.
func (s *Store) planGroup(before int64, limit int) (_ []uint64, more bool, err error) {
	if err := s.enter(); err != nil {
		return nil, false, err
	}
	defer s.leave(&err)
	snap := s.db.NewSnapshot()
	defer snap.Close()
	// Everything the snapshot holds is applied to the WAL before it; a synced record after
	// it makes it durable.
	if err := s.fh.call("a WAL sync", func() error { return s.db.LogData(nil, pebble.Sync) }); err != nil {
		return nil, false, fmt.Errorf("pebblelog: syncing the WAL before archiving: %w", err)
	}
	r := reader{r: snap} // no blobs: it reads no event
	var entries []projection.PruneEntry
	if err := r.ScanPrunable(before, func(e projection.PruneEntry) bool {
		if len(entries) == limit {
			more = true
			return false
		}
		entries = append(entries, e)
		return true
	}); err != nil {
		return nil, false, err
	}
	var seqs []uint64
	for _, e := range entries {
		ids := []string{e.ID}
		if !e.Wake {
			t, err := r.taskRecord(e.ID)
			if err != nil {
				return nil, false, err
			}
			if t == nil {
				return nil, false, fmt.Errorf("%w: %s (at %d, seq %d): no such task", projection.ErrPruneIndex, e.ID, e.At, e.Seq)
			}
			if t.CompletionWakeID != "" {
				ids = append(ids, t.CompletionWakeID)
			}
		}
		for _, id := range ids {
			got, err := subjectSeqs(snap, id)
			if err != nil {
				return nil, false, err
			}
			seqs = append(seqs, got...)
		}
	}
	slices.Sort(seqs)
	return seqs, more, nil
}

// subjectSeqs reads a subject's sequences from the per-subject event index.
func subjectSeqs(r pebble.Reader, id string) (_ []uint64, err error) {
	prefix := subjectPrefix(id)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	var out []uint64
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(prefix)+8 {
			return nil, fmt.Errorf("%w: subject index key %q", ErrCorruptRecord, k)
		}
		out = append(out, binary.BigEndian.Uint64(k[len(prefix):]))
	}
	return out, it.Error()
}

// PruneArchived is Txn.Prune for a store with an archive: it removes the group only if
// every event of it is in archived (sorted ascending: what PlanPrune returned and the
// caller archived), else it returns ErrNotArchived and the command must fail, which
// discards whatever the group had changed in the batch.
func (t *Txn) PruneArchived(before int64, limit int, archived []uint64) (PruneResult, error) {
	return t.prune(before, limit, func(seqs []uint64) error {
		for _, s := range seqs {
			if _, ok := slices.BinarySearch(archived, s); !ok {
				return fmt.Errorf("%w: seq %d", ErrNotArchived, s)
			}
		}
		return nil
	})
}
