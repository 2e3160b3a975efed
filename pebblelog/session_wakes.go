package pebblelog

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// Format 5's keyspace (keys.go): the per-session available-wake index
// (projection.IndexSessionWakes: index.go), the available-wake index's entries again under
// each wake's session, which is length-prefixed so that one session's range holds no other
// session's keys. A claim of the wakes of chosen sessions (work's ClaimSessionWakes) reads
// it, so its cost does not depend on other sessions' wakes.

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
		return b.Set(indexEntryKey(projection.IndexSessionWakes, x.SessionID, x.WakeEntry(at)), []byte(x.ID), nil)
	}, nil)
}
