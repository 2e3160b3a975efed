package pebblelog

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// Format 5's keyspace (keys.go): the per-session available-wake index, the available-wake
// index's entries again under each wake's session, which is length-prefixed so that one
// session's range holds no other session's keys. The fold keeps it (projection.State's
// PutSessionWake, DeleteSessionWake, beside PutWakeIndex and DeleteWakeIndex); a claim of the
// wakes of chosen sessions (work's ClaimSessionWakes) reads it through
// projection.Reader.ScanSessionWakes, so its cost does not depend on other sessions' wakes.

// sessionWakePrefix is the start of one session's part of the index.
func sessionWakePrefix(session string) []byte {
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(session)+16)
	k = append(k, prefixSessionWake)
	k = binary.AppendUvarint(k, uint64(len(session)))
	return append(k, session...)
}

func sessionWakeKey(session string, at int64, seq uint64) []byte {
	k := sessionWakePrefix(session)
	k = binary.BigEndian.AppendUint64(k, orderedTime(at))
	return binary.BigEndian.AppendUint64(k, seq)
}

// sessionWakeUpper is the exclusive upper bound of session's entries available at maxAt.
func sessionWakeUpper(session string, maxAt int64) []byte {
	return append(sessionWakeKey(session, maxAt, 1<<64-1), 0)
}

// ScanSessionWakes walks session's part of the index, like ScanWakes.
func (s reader) ScanSessionWakes(session string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	start := sessionWakePrefix(session)
	return s.scanRange(start, sessionWakeUpper(session, maxAt), len(start), func(_ []byte, e projection.IndexEntry) bool {
		return fn(e)
	})
}

// ScanSessionWakes reads through the batch from the session's first key. It keeps no
// low-water mark (the per-kind due index does, state_kinds_sessions.go): the tombstones it
// may step over are those of this session's own claims and acknowledgements since the last
// compaction, so its cost stays bounded by the session's wakes.
func (w *writer) ScanSessionWakes(session string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return w.reader.ScanSessionWakes(session, maxAt, fn)
}

func (w *writer) PutSessionWake(session string, e projection.IndexEntry) error {
	return w.b.Set(sessionWakeKey(session, e.At, e.Seq), []byte(e.ID), nil)
}

// DeleteSessionWake is a sized delete, as DeleteWakeIndex.
func (w *writer) DeleteSessionWake(session string, e projection.IndexEntry) error {
	return w.b.DeleteSized(sessionWakeKey(session, e.At, e.Seq), uint32(len(e.ID)), nil)
}

// olderReader (format 1 and 2, read-only) has no per-session wake index either.
func (o olderReader) ScanSessionWakes(string, int64, func(projection.IndexEntry) bool) error {
	return o.needsUpgrade("per-session wake index")
}

// format4Reader reads a store of format 3 or 4 opened read-only: everything but what format
// 5 added.
type format4Reader struct {
	reader
	s *Store
}

func (o format4Reader) ScanSessionWakes(string, int64, func(projection.IndexEntry) bool) error {
	return olderReader(o).needsUpgrade("per-session wake index")
}

// The upgrade to format 5 (upgrade.go calls it for a store of format < 5 opened read-write).
//
// The index follows from the wake records alone (a wake's entry is its available-wake
// index entry, AvailableAt at RecordSeq, under its SessionID), so it is built from them in
// one pass, without replaying the log. As for format 3: the keyspace is first cleared (a
// crash before the format key is written leaves a partial build, and an older build running
// on the store meanwhile would make it stale), then built in batches committed without
// sync; the synced write of the format key after it makes them durable and is the witness
// that the build is complete.
func (s *Store) buildFormat5() error {
	if err := s.clearKeyspaces(prefixSessionWake); err != nil {
		return fmt.Errorf("clearing the per-session wake index: %w", err)
	}
	return s.buildFromRecords(prefixWake, func(b *pebble.Batch, key, v []byte) error {
		x, err := decodeWake(key, v)
		if err != nil {
			return err
		}
		at, in := x.AvailableAt()
		if !in {
			return nil
		}
		return b.Set(sessionWakeKey(x.SessionID, at, x.RecordSeq), []byte(x.ID), nil)
	}, nil)
}
