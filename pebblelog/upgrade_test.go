package pebblelog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// copyFixtureFrom copies the fixture testdata/name into dir on fs, synced.
func copyFixtureFrom(t *testing.T, name string, fs vfs.FS, dir string) {
	t.Helper()
	src := filepath.Join("testdata", name)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		f, err := fs.Create(fs.PathJoin(dir, e.Name()), vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(f.Sync(), f.Close()); err != nil {
			t.Fatal(err)
		}
	}
	d, err := fs.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(d.Sync(), d.Close()); err != nil {
		t.Fatal(err)
	}
	if parent, err := fs.OpenDir(fs.PathDir(dir)); err == nil {
		parent.Sync()
		parent.Close()
	}
}

// formats returns the version in the marker and in the format key of the store in dir.
func formats(t *testing.T, fs vfs.FS, dir string) (marker, key int) {
	t.Helper()
	s, err := Open(dir, &Options{FS: fs, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only Open: %v", err)
	}
	defer s.Close()
	marker, key, err = s.storeFormats()
	if err != nil {
		t.Fatal(err)
	}
	return marker, key
}

// files reads every file of the store in dir but the lock files (which a refused Open may
// create), by name.
func files(t *testing.T, fs vfs.FS, dir string) map[string]string {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range names {
		if n == lockFile || n == "LOCK" {
			continue
		}
		f, err := fs.Open(fs.PathJoin(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if _, err := b.ReadFrom(f); err != nil {
			f.Close()
			t.Fatal(err)
		}
		f.Close()
		got[n] = b.String()
	}
	return got
}

// A store of an earlier development format (the format-4 fixture, written by the last
// format-4 build) is refused, read-write and read-only, with ErrFormatTooOld: the error
// names the store's format and the formats this build reads, its hint says how to move the
// data (replay export --wire with an earlier build, replay import with this one), and no
// file of the store changes.
func TestOldFormatStoreRefused(t *testing.T) {
	dir := t.TempDir()
	copyFixtureFrom(t, "format4-store", vfs.Default, dir)
	before := files(t, vfs.Default, dir)
	for _, ro := range []bool{false, true} {
		s, err := Open(dir, &Options{ReadOnly: ro})
		if err == nil {
			s.Close()
			t.Fatalf("ReadOnly %v: Open of a format-4 store succeeded", ro)
		}
		var oe *OpenError
		if !errors.Is(err, ErrFormatTooOld) || !errors.As(err, &oe) {
			t.Fatalf("ReadOnly %v: Open of a format-4 store = %v, want ErrFormatTooOld", ro, err)
		}
		msg := err.Error()
		for _, want := range []string{dir, "format 4", "formats 7 and 8", "replay export " + dir + " --wire > store.wlog", "replay import store.wlog NEWDIR"} {
			if !strings.Contains(msg, want) {
				t.Errorf("ReadOnly %v: the error does not say %q: %s", ro, want, msg)
			}
		}
		after := files(t, vfs.Default, dir)
		if len(after) != len(before) {
			t.Fatalf("ReadOnly %v: the refused Open left files %d, had %d", ro, len(after), len(before))
		}
		for n, b := range before {
			if after[n] != b {
				t.Errorf("ReadOnly %v: the refused Open changed %s", ro, n)
			}
		}
	}
}

// setFormat writes version v into the format key and the marker of the closed store in dir.
func setFormat(t *testing.T, fs vfs.FS, dir string, key, marker int) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{FS: fs, FormatMajorVersion: pebbleFormat})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set(keyFormat, []byte(markerPrefix+strconv.Itoa(key)), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := fs.Create(fs.PathJoin(dir, MarkerFile), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(markerPrefix + strconv.Itoa(marker) + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// A store whose format key says 6 is refused, whatever its marker says (the key is the
// witness of what the keyspaces hold); the store is left as it was.
func TestFormat6KeyRefused(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	appendEvents(t, s, submitted("s1", "t1", sec(1), true))
	s.Close()
	for _, marker := range []int{6, 8} {
		setFormat(t, vfs.Default, dir, 6, marker)
		if s, err := Open(dir, &Options{}); !errors.Is(err, ErrFormatTooOld) {
			if err == nil {
				s.Close()
			}
			t.Fatalf("marker %d: Open of a store whose format key is 6 = %v, want ErrFormatTooOld", marker, err)
		}
		if m, k := readFormats(t, dir); m != marker || k != 6 {
			t.Fatalf("after the refusal: marker %d, key %d; want %d and 6", m, k, marker)
		}
	}
}

// readFormats reads the marker and the format key of the closed store in dir without Open
// (which refuses an old one).
func readFormats(t *testing.T, dir string) (marker, key int) {
	t.Helper()
	m, err := os.ReadFile(filepath.Join(dir, MarkerFile))
	if err != nil {
		t.Fatal(err)
	}
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, closer, err := db.Get(keyFormat)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	marker, err = strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(string(m)), markerPrefix))
	if err != nil {
		t.Fatal(err)
	}
	key, err = strconv.Atoi(strings.TrimPrefix(string(v), markerPrefix))
	if err != nil {
		t.Fatal(err)
	}
	return marker, key
}

// A format-7 store opens read-only as it is (nothing written), and a read-write Open
// upgrades it: the format key first, synced, then the marker. A crash between the two
// leaves format key 8 with marker 7, which opens (read-only as it is, read-write raising the
// marker) with every event and record as before, and Verify agrees.
func TestFormat7UpgradeCrashBetweenKeyAndMarker(t *testing.T) {
	mem := vfs.NewCrashableMem()
	s := openT(t, "/store", &Options{FS: mem})
	appendEvents(t, s, submitted("s1", "t1", sec(1), true))
	appendEvents(t, s, requestedWake("s1", "w1", sec(2)))
	s.Close()
	setFormat(t, mem, "/store", 7, 7)
	if m, k := formats(t, mem, "/store"); m != 7 || k != 7 {
		t.Fatalf("the format-7 store read-only: marker %d, key %d", m, k)
	}
	failMarker := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, MarkerFile+".tmp") {
			return errorfs.ErrInjected
		}
		return nil
	})
	if _, err := Open("/store", &Options{FS: errorfs.Wrap(mem, failMarker)}); !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Open with a failing marker write: %v, want the injected error", err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	if m, k := formats(t, crashed, "/store"); m != 7 || k != FormatVersion {
		t.Fatalf("after the crash: marker %d, format key %d; want 7 and %d (the key is written first)", m, k, FormatVersion)
	}
	s = openT(t, "/store", &Options{FS: crashed})
	mustVerify(t, s)
	if last, err := s.LastSeq(t.Context()); err != nil || last != 2 {
		t.Fatalf("LastSeq after the upgrade = %d, %v; want 2", last, err)
	}
	s.Close()
	if m, k := formats(t, crashed, "/store"); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after reopening: marker %d, format key %d; want %d", m, k, FormatVersion)
	}
}
