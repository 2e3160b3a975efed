package pebblelog

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// The formats this build opens, and the one upgrade it keeps (docs/pebble.md, "Store formats
// and the upgrade promise").
//
// A store's format is kept in two places: the format key inside the database and the
// WORKLOG marker. The format key is the witness of what the keyspaces hold; the marker lets
// a build refuse a newer store before it opens Pebble. Open refuses a store whose marker or
// format key names a format newer than FormatVersion (ErrFormatTooNew: checkMarker,
// checkFormatKey), and one whose format key names a format before MinFormatVersion
// (ErrFormatTooOld: checkFormatKey, which runs on the read-only check before a read-write
// Open changes anything), so a refused store is left as it was.
//
// Format 7 differs from format 8 only by the two schedule keyspaces, which a format-7 store
// cannot hold (a build without schedules writes no schedule event, and decoding refuses event
// types it does not know), so a format-7 store reads as a format-8 one. A read-write Open
// upgrades it by writing the format key, synced, then the marker (atomically: writeMarker),
// so that a format-7 build refuses the store from then on. A crash between the two writes
// leaves format key 8 with an older marker: the next read-write Open raises the marker, and
// a read-only Open reads the store as it is. A read-only Open never upgrades.

// storeFormats reads the version named by the marker and by the format key (0: none, an empty
// store opened read-only).
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
		return marker, 0, nil
	}
	key, err = strconv.Atoi(strings.TrimPrefix(string(v), markerPrefix))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %s: format key holds %q", ErrNotAStore, s.dir, v)
	}
	return marker, key, nil
}

// upgrade brings a format-7 store (or one whose marker is behind its format key) to
// FormatVersion, when it is opened read-write. Open calls it after checkMarker and
// checkFormatKey have refused newer and older formats.
func (s *Store) upgrade() error {
	if s.opts.ReadOnly {
		return nil
	}
	marker, key, err := s.storeFormats()
	if err != nil {
		return err
	}
	if key < FormatVersion {
		// Pebble answers a commit whose WAL write or sync failed with nil once its Fatalf
		// returns (failure.go): call returns the store's failure then.
		err := s.fh.call("the upgrade", func() error {
			return s.db.Set(keyFormat, []byte(markerPrefix+strconv.Itoa(FormatVersion)), pebble.Sync)
		})
		if err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading the format key from %d to %d: %w", s.dir, key, FormatVersion, err)
		}
	}
	if marker < FormatVersion {
		if err := writeMarker(s.fs, s.dir); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading the marker from %d to %d: %w", s.dir, marker, FormatVersion, err)
		}
	}
	return nil
}
