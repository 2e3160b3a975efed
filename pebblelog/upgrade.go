package pebblelog

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// The upgrades. A format-1 store is brought to format 3 in one Open: its records are read as
// they are (format 2's rule, below), and format 3's keyspaces are built from them (further
// down); the format key and the marker then move straight to FormatVersion.
//
// The upgrade from format 1 to format 2.
//
// Format 2 reads format-1 records as they are (a record that carries its input is used as it
// is: input.go), so the upgrade rewrites no record: records lose their values as they are
// next rewritten. What it changes is the version, in both places it is kept, so that a
// format-1 build refuses the store from then on (it would read a format-2 record's missing
// input as JSON null): the format key inside the database and the WORKLOG marker.
//
// The two writes are ordered: the format key first, synced, then the marker (written
// atomically: writeMarker). A crash between them leaves format key 2 with marker 1; the
// next read-write Open sees the marker behind and finishes the upgrade, and a format-1 build
// is refused by the format key meanwhile. The other order (marker 2, key 1) is not written
// by this code, but Open handles it the same way (the key is raised), so a store is never
// stuck half-way whatever order a crash or an older tool left it in. A read-only Open (the
// replay tool) upgrades nothing: it reads a format-1 store as it is.

// storeFormats reads the version named by the marker and by the format key.
func (s *Store) storeFormats() (marker, key int, err error) {
	f, err := s.fs.Open(s.fs.PathJoin(s.dir, MarkerFile))
	if err != nil {
		return 0, 0, fmt.Errorf("pebblelog: reading marker in %s: %w", s.dir, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 256))
	f.Close()
	if err != nil {
		return 0, 0, fmt.Errorf("pebblelog: reading marker in %s: %w", s.dir, err)
	}
	// checkMarker and checkFormatKey have accepted both: they parse.
	marker, err = strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(string(b)), markerPrefix))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %s: %s: %v", ErrNotAStore, s.dir, MarkerFile, err)
	}
	v, ok, err := reader{s.db, s.blobs}.get(keyFormat)
	if err != nil {
		return 0, 0, fmt.Errorf("pebblelog: %s: reading format key: %w", s.dir, err)
	}
	if !ok {
		return marker, 0, nil // an empty store opened read-only: nothing to upgrade
	}
	key, err = strconv.Atoi(strings.TrimPrefix(string(v), markerPrefix))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %s: format key holds %q", ErrNotAStore, s.dir, v)
	}
	return marker, key, nil
}

// upgrade brings a store of an older format to FormatVersion, when it is opened read-write.
// Open calls it after checkMarker and checkFormatKey have refused newer formats. It also
// records the format the store is read in (Store.format): a read-only Open of an older store
// upgrades nothing and reads it as it is.
func (s *Store) upgrade() error {
	marker, key, err := s.storeFormats()
	if err != nil {
		return err
	}
	s.format = key
	if key == 0 {
		s.format = FormatVersion // an empty store opened read-only: nothing in any keyspace
	}
	if s.opts.ReadOnly {
		return nil
	}
	if key < 3 {
		if err := s.buildFormat3(); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading to format 3 (building the kind index, session task lists and counts): %w", s.dir, err)
		}
	}
	if key < 5 {
		if err := s.buildFormat5(); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading to format 5 (building the per-session wake index): %w", s.dir, err)
		}
	}
	if key < 6 {
		if err := s.buildFormat6(); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading to format 6 (the due indexes keyed by priority): %w", s.dir, err)
		}
	}
	if key < 7 {
		if err := s.buildFormat7(); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading to format 7 (the kind policies and the per-kind lease index): %w", s.dir, err)
		}
	}
	if key < 8 {
		if err := s.buildFormat8(); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading to format 8 (the schedules): %w", s.dir, err)
		}
	}
	if key < FormatVersion {
		// Pebble answers a commit whose WAL write or sync failed with nil once its Fatalf
		// returns (failure.go): call returns the store's failure then.
		err := s.fh.call("the upgrade", func() error {
			return s.db.Set(keyFormat, []byte(markerPrefix+strconv.Itoa(FormatVersion)), pebble.Sync)
		})
		if err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading the format key to %d: %w", s.dir, FormatVersion, err)
		}
	}
	if marker < FormatVersion {
		if err := writeMarker(s.fs, s.dir); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading the marker to %d: %w", s.dir, FormatVersion, err)
		}
	}
	s.format = FormatVersion
	return nil
}

// The upgrade to format 3.
//
// Format 3 adds four keyspaces that the fold keeps: the per-kind due index, the session task
// lists, the counts by kind and state, and the retention index (prune.go, which also needs
// an acknowledged wake's AckedAt: upgradeRetention.go). Each follows from the task records alone (a task's
// entry in its kind's index is its due-index entry, EligibleAt at SubmitSeq; its place in its
// session's list is its SubmitSeq; it counts once under its kind and state), so the upgrade
// builds them from the records in one pass, without replaying the log.
//
// Order, for crash safety: the three keyspaces are first cleared, then built, in batches
// committed without sync; then the format key is written with a sync, which makes every
// batch before it durable too (the WAL is a prefix); then the marker. A crash before the
// format key leaves format key 2: the next Open builds again from scratch, whatever a crash
// kept of the first build and whatever a format-2 build wrote meanwhile (it keeps none of
// these keyspaces, so a partial build would be stale by then: hence the clear). A crash
// between the key and the marker is the format-1 case above: the key is the witness that the
// keyspaces are complete, the marker is raised at the next Open.

// upgradeBatchBytes bounds one batch of the build.
const upgradeBatchBytes = 4 << 20

func (s *Store) buildFormat3() (err error) {
	if err := s.clearKeyspaces(format3Prefixes...); err != nil {
		return fmt.Errorf("clearing the new keyspaces: %w", err)
	}
	// The wakes first: an acknowledged wake gets its AckedAt (older formats did not keep it)
	// and a requested one its retention entry; the tasks' pass then reads their completion
	// wakes with AckedAt set.
	if err := s.buildRetentionWakes(); err != nil {
		return fmt.Errorf("building the retention index of wakes: %w", err)
	}
	if err := s.buildSubjectIndex(); err != nil {
		return fmt.Errorf("building the per-subject event index: %w", err)
	}
	counts := map[countID]int64{}
	return s.buildFromRecords(prefixTask, func(b *pebble.Batch, key, v []byte) error {
		t, err := decodeTask(key, v)
		if err != nil {
			return err
		}
		id := []byte(t.ID)
		if err := b.Set(sessionTaskKey(t.SessionID, t.SubmitSeq), id, nil); err != nil {
			return err
		}
		if at, in := t.EligibleAt(); in {
			if err := b.Set(indexEntryKey(projection.IndexKindDue, t.Kind, t.DueEntry(at)), id, nil); err != nil {
				return err
			}
		}
		counts[countID{t.Kind, t.State}]++
		return s.buildRetentionTask(b, t)
	}, func(b *pebble.Batch) error {
		for id, n := range counts {
			if err := b.Set(countKey(id.kind, id.state), encodeCount(n), nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// clearKeyspaces deletes every key of the keyspaces prefixes, in one batch committed
// without sync: an upgrade's build starts from nothing, whatever a crash kept of an earlier
// build and whatever an older build wrote meanwhile.
func (s *Store) clearKeyspaces(prefixes ...byte) error {
	clear := s.db.NewBatch()
	for _, p := range prefixes {
		if err := clear.DeleteRange([]byte{p}, []byte{p + 1}, nil); err != nil {
			clear.Close()
			return err
		}
	}
	return s.commitUpgrade(clear)
}

// buildFromRecords calls add for every record of the keyspace prefix (its key and value),
// with a batch to write the entries it derives into, then last (nil: none) with the final
// batch; batches are committed without sync as they fill (commitIfFull). The caller's synced
// write of the format key afterwards makes them durable and witnesses a complete build.
func (s *Store) buildFromRecords(prefix byte, add func(b *pebble.Batch, key, v []byte) error, last func(b *pebble.Batch) error) (err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
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
		if err := add(b, it.Key(), v); err != nil {
			return err
		}
		if err := s.commitIfFull(&b); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	if last != nil {
		if err := last(b); err != nil {
			return err
		}
	}
	err = s.commitUpgrade(b)
	b = s.db.NewBatch() // for the deferred Close: a committed batch is closed by commitUpgrade
	return err
}

// commitIfFull commits an upgrade's batch once it holds upgradeBatchBytes, and starts the
// next one in *b.
func (s *Store) commitIfFull(b **pebble.Batch) error {
	if (*b).Len() < upgradeBatchBytes {
		return nil
	}
	if err := s.commitUpgrade(*b); err != nil {
		return err
	}
	*b = s.db.NewBatch()
	return nil
}

// commitUpgrade commits one batch of the upgrade without sync (the format key's synced write
// comes after) and closes it.
func (s *Store) commitUpgrade(b *pebble.Batch) error {
	// A Fatalf in the commit pipeline returns nil to us: call returns the store's failure.
	err := s.fh.call("the upgrade", func() error { return b.Commit(pebble.NoSync) })
	if err == nil {
		b.Close()
	}
	return err
}
