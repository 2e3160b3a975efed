package pebblelog

import (
	"errors"

	"github.com/cockroachdb/pebble/v2"
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
func (s *Store) buildFormat6() (err error) {
	clear := s.db.NewBatch()
	for _, p := range []byte{prefixDue, prefixKindDue} {
		if err := clear.DeleteRange([]byte{p}, []byte{p + 1}, nil); err != nil {
			clear.Close()
			return err
		}
	}
	if err := s.commitUpgrade(clear); err != nil {
		return err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTask}, UpperBound: []byte{prefixTask + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	b := s.db.NewBatch()
	defer func() { b.Close() }()
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		t, err := decodeTask(it.Key(), v)
		if err != nil {
			return err
		}
		at, in := t.EligibleAt()
		if !in {
			continue
		}
		id := []byte(t.ID)
		if err := b.Set(dueKey(t.Priority, at, t.SubmitSeq), id, nil); err != nil {
			return err
		}
		if err := b.Set(kindIndexKey(t.Kind, t.Priority, at, t.SubmitSeq), id, nil); err != nil {
			return err
		}
		if err := s.commitIfFull(&b); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	err = s.commitUpgrade(b)
	b = s.db.NewBatch() // for the deferred Close: a committed batch is closed by commitUpgrade
	return err
}
