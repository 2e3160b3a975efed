package pebblelog

import (
	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// The upgrade to format 6: the due index (d) and the per-kind due index (D) keyed by
// priority first (keys.go), so that byte order is claim order.
//
// Both follow from the task records alone (a task is in them exactly when EligibleAt puts it
// in the due index, at its Priority, that time and its SubmitSeq; a record written before
// format 6 has priority 0), so the upgrade clears both keyspaces and rebuilds them from the
// records in one pass, without replaying the log. It is applied when the format key is below
// 6, after the earlier steps (format 3's build, format 5's), and in the same crash order as
// format 3's build: the clear, then the build in batches committed without sync, then (in
// upgrade) the format key with a sync, which makes every batch before it durable, then the
// marker. A crash before the format key leaves an older format key: the next read-write Open
// clears and builds again, whatever a crash kept of the first build and whatever an older
// build wrote meanwhile in the old layout. Records are not rewritten: their Headers field
// (field 26) is absent in older records, which read with no headers.
func (s *Store) buildFormat6() error {
	if err := s.clearKeyspaces(prefixDue, prefixKindDue); err != nil {
		return err
	}
	return s.buildFromRecords(prefixTask, func(b *pebble.Batch, key, v []byte) error {
		t, err := decodeTask(key, v)
		if err != nil {
			return err
		}
		at, in := t.EligibleAt()
		if !in {
			return nil
		}
		for _, p := range projection.TaskIndexes(t) {
			if err := b.Set(indexEntryKey(p.Index, p.Part, t.DueEntry(at)), []byte(t.ID), nil); err != nil {
				return err
			}
		}
		return nil
	}, nil)
}
