package pebblelog

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// The retention part of the upgrade to format 3 (upgrade.go). A wake record of an older
// format has no AckedAt; an acknowledged one gets it from its WakeAcked event, found at the
// record's UpdatedSeq (the acknowledgment is its last change but for a later rejected
// acknowledgment, in which case its session's events between its creation and UpdatedSeq are
// searched), and the record is rewritten. Then requested acknowledged wakes, and tasks with
// their completion wakes, enter the retention index where PruneAt puts them.

func (s *Store) buildRetentionWakes() (err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixWake}, UpperBound: []byte{prefixWake + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	b := s.db.NewBatch()
	defer func() { b.Close() }()
	var d events.Decoder
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		x, err := decodeWake(it.Key(), v)
		if err != nil {
			return err
		}
		if !x.Acked {
			continue
		}
		if x.AckedAt == 0 {
			at, err := s.ackTime(x, &d)
			if err != nil {
				return err
			}
			if at != 0 {
				x.AckedAt = at
				if err := b.Set(idKey(prefixWake, x.ID), appendWake(nil, x), nil); err != nil {
					return err
				}
			}
		}
		if at, ok := x.PruneAt(); ok {
			e := projection.PruneEntry{At: at, Seq: x.RecordSeq, ID: x.ID, Wake: true}
			if err := b.Set(pruneKey(e.At, e.Seq), pruneValue(e), nil); err != nil {
				return err
			}
		}
		if err := s.commitIfFull(&b); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	err = s.commitUpgrade(b)
	b = s.db.NewBatch()
	return err
}

// ackTime finds the time of x's WakeAcked event.
func (s *Store) ackTime(x *projection.Wake, d *events.Decoder) (int64, error) {
	isAck := func(seq uint64) (int64, bool, error) {
		v, ok, err := reader{s.db, s.blobs}.get(eventKey(seq))
		if err != nil || !ok {
			return 0, false, err
		}
		ev, err := d.Decode(v, seq)
		if err != nil {
			return 0, false, err
		}
		if a, ok := ev.(*events.WakeAcked); ok && a.WakeID == x.ID {
			return a.At, true, nil
		}
		return 0, false, nil
	}
	if at, ok, err := isAck(x.UpdatedSeq); err != nil || ok {
		return at, err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: sessionEventKey(x.SessionID, x.RecordSeq), UpperBound: sessionEventKey(x.SessionID, x.UpdatedSeq)})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	prefix := len(sessionPrefix(x.SessionID))
	for ok := it.First(); ok; ok = it.Next() {
		if len(it.Key()) != prefix+8 {
			continue
		}
		if at, ok, err := isAck(binary.BigEndian.Uint64(it.Key()[prefix:])); err != nil || ok {
			return at, err
		}
	}
	if err := it.Error(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%w: wake %s is acknowledged but its log has no acknowledgment", ErrCorruptRecord, x.ID)
}

// buildRetentionTask puts t's retention entry into b, reading its completion wake (its
// AckedAt set by buildRetentionWakes).
func (s *Store) buildRetentionTask(b *pebble.Batch, t *projection.Task) error {
	if !t.State.Terminal() {
		return nil
	}
	var w *projection.Wake
	if t.CompletionWakeID != "" {
		var err error
		if w, err = (reader{s.db, s.blobs}).wakeRecord(t.CompletionWakeID); err != nil {
			return err
		}
	}
	at, ok := t.PruneAt(w)
	if !ok {
		return nil
	}
	e := projection.PruneEntry{At: at, Seq: t.SubmitSeq, ID: t.ID}
	return b.Set(pruneKey(e.At, e.Seq), pruneValue(e), nil)
}

// buildSubjectIndex writes the per-subject event index (x) of every event in the log: the
// one part of the upgrade that reads the whole log (decoding each event's subject).
func (s *Store) buildSubjectIndex() (err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixEvent}, UpperBound: []byte{prefixEvent + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	b := s.db.NewBatch()
	defer func() { b.Close() }()
	var d events.Decoder
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != 9 {
			return fmt.Errorf("%w: log key %q", ErrCorruptRecord, k)
		}
		seq := binary.BigEndian.Uint64(k[1:])
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		ev, err := d.Decode(v, seq)
		if err != nil {
			return err
		}
		if err := b.Set(subjectEventKey(ev, seq), nil, nil); err != nil {
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
	b = s.db.NewBatch()
	return err
}
