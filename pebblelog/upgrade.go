package pebblelog

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

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
	v, ok, err := reader{s.db}.get(keyFormat)
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
// Open calls it after checkMarker and checkFormatKey have refused newer formats.
func (s *Store) upgrade() error {
	if s.opts.ReadOnly {
		return nil
	}
	marker, key, err := s.storeFormats()
	if err != nil {
		return err
	}
	if key < FormatVersion {
		err := s.db.Set(keyFormat, []byte(markerPrefix+strconv.Itoa(FormatVersion)), pebble.Sync)
		if err == nil {
			// Pebble answers a commit whose WAL write or sync failed with nil once its
			// Fatalf returns (failure.go): the store's failure says it did not happen.
			err = s.fh.err()
		}
		if err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading the format key to %d: %w", s.dir, FormatVersion, err)
		}
	}
	if marker < FormatVersion {
		if err := writeMarker(s.fs, s.dir); err != nil {
			return fmt.Errorf("pebblelog: %s: upgrading the marker to %d: %w", s.dir, FormatVersion, err)
		}
	}
	return nil
}
