package pebblelog

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fileHashes returns the SHA-256 of every file in dir, by name.
func fileHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	return out
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A failed Open never changes the store. A closed store with data (WAL only, and with
// sstables after a flush) loses one file, or has one truncated to 0 bytes; Open, read-write
// and read-only, either succeeds or fails with a typed error, and after a failure every other
// file is byte-identical and no file but the lock files is new. (Whether a successful Open
// still has every acknowledged event is the corruption matrix's business, not this test's.)
//
// Before: deleting marker.manifest.* made Pebble create a new database over the old one (a
// new MANIFEST, the WALs replaced, the sstables deleted) on the way to "not a worklog store";
// and every check after the read-write pebble.Open (the format key) ran after Pebble had
// already flushed the WAL and rewritten the MANIFEST.
func TestFailedOpenChangesNothing(t *testing.T) {
	for _, flushed := range []bool{false, true} {
		src := filepath.Join(t.TempDir(), "src")
		s := openT(t, src, nil)
		seedStore(t, s)
		if flushed {
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
			appendEvents(t, s, submitted("s3", "t9", sec(9), false)) // and some in the WAL
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		files := slices.Sorted(maps.Keys(fileHashes(t, src)))
		if flushed && !slices.ContainsFunc(files, func(n string) bool { return strings.HasSuffix(n, ".sst") }) {
			t.Fatalf("no sstable after a flush: %v", files)
		}
		failures := 0
		for _, file := range files {
			for _, damage := range []string{"deleted", "truncated"} {
				for _, ro := range []bool{false, true} {
					name := fmt.Sprintf("flushed=%v/%s %s/read-only=%v", flushed, file, damage, ro)
					dir := filepath.Join(t.TempDir(), "store")
					copyDir(t, src, dir)
					p := filepath.Join(dir, file)
					var err error
					if damage == "deleted" {
						err = os.Remove(p)
					} else {
						err = os.Truncate(p, 0)
					}
					if err != nil {
						t.Fatal(err)
					}
					before := fileHashes(t, dir)
					st, err := Open(dir, &Options{ReadOnly: ro})
					if err == nil {
						st.Close()
						// The new store's first WAL, empty and obsolete (rotateFirstWAL), is kept
						// for recycling: it holds nothing to lose.
						_, isWAL := parseWALName(file)
						emptyWAL := isWAL && len(walRecords(t, vfs.Default, src, file)) == 0
						if mustRefuse(file, damage, flushed) && !emptyWAL {
							t.Errorf("%s: Open succeeded, want it refused", name)
						}
						continue
					}
					failures++
					var oe *OpenError
					if !errors.As(err, &oe) || oe.Dir != dir {
						t.Errorf("%s: Open = %T %v, want an *OpenError naming the directory", name, err, err)
						continue
					}
					if oe.Kind != ErrCorruptStore && !(file == MarkerFile && oe.Kind == ErrNotAStore) {
						t.Errorf("%s: Open = %v, want ErrCorruptStore", name, err)
					}
					if strings.HasPrefix(file, "MANIFEST-") || strings.HasSuffix(file, ".sst") {
						if oe.File != file {
							t.Errorf("%s: OpenError.File = %q, want %q (%v)", name, oe.File, file, err)
						}
					}
					after := fileHashes(t, dir)
					for n, h := range before {
						if after[n] != h {
							t.Errorf("%s: the failed Open (%v) changed %s", name, err, n)
						}
					}
					for n := range after {
						if _, ok := before[n]; !ok && n != lockFile && n != "LOCK" {
							t.Errorf("%s: the failed Open (%v) created %s", name, err, n)
						}
					}
				}
			}
		}
		if failures == 0 {
			t.Fatalf("flushed=%v: no damage made Open fail", flushed)
		}
	}
}

// mustRefuse says which damage Open must refuse rather than open: a store without its marker,
// its MANIFEST, its MANIFEST marker or its format marker; an sstable; and the WAL of a store
// whose data is all in the WAL (Pebble opens that as an empty database).
func mustRefuse(file, damage string, flushed bool) bool {
	switch {
	case file == MarkerFile, strings.HasPrefix(file, "MANIFEST-"), strings.HasSuffix(file, ".sst"):
		return true
	case strings.HasPrefix(file, "marker."):
		return damage == "deleted" // a marker is an empty file: its name is its content
	case strings.HasSuffix(file, ".log"):
		return !flushed
	}
	return false
}

// The directory that made Pebble create a new database: a closed store without its
// MANIFEST marker is refused as damaged, every file as it was.
func TestOpenMissingManifestMarker(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	seedStore(t, s)
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	markers, _ := filepath.Glob(filepath.Join(dir, "marker.manifest.*"))
	if len(markers) != 1 {
		t.Fatalf("MANIFEST markers: %v", markers)
	}
	if err := os.Remove(markers[0]); err != nil {
		t.Fatal(err)
	}
	before := fileHashes(t, dir)
	_, err := Open(dir, nil)
	oe := wantOpenErr(t, err, ErrCorruptStore, dir)
	if !strings.Contains(oe.Detail, "marker.manifest") {
		t.Errorf("the error does not name the missing marker: %v", err)
	}
	if after := fileHashes(t, dir); !maps.Equal(before, after) {
		t.Errorf("the refused Open changed the store:\nbefore %v\nafter  %v", before, after)
	}
}
