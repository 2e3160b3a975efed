package pebblelog

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// What a crash before the format key can leave of a format-5 build, made staler by a
// format-4 build running on the store meanwhile: per-session wake entries of wakes that are
// acknowledged or gone, under sessions that have none. The next upgrade clears the keyspace
// before it builds, so Verify finds exactly the rebuild's entries.
func TestUpgrade5ClearsAPartialBuild(t *testing.T) {
	mem := vfs.NewMem()
	copyFixtureFrom(t, "format4-store", mem, "/store")
	db, err := pebble.Open("/store", &pebble.Options{FS: mem, FormatMajorVersion: pebbleFormat, Logger: testLogger{t}})
	if err != nil {
		t.Fatal(err)
	}
	stale := db.NewBatch()
	stale.Set(sessionWakeKey("alpha", 1, 1), []byte("wake_gone"), nil)
	stale.Set(sessionWakeKey("nobody", 5, 999), []byte("wake_gone"), nil)
	if err := errors.Join(stale.Commit(pebble.Sync), db.Close()); err != nil {
		t.Fatal(err)
	}
	s := openT(t, "/store", &Options{FS: mem})
	mustVerify(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m, k := formats(t, mem, "/store"); m != FormatVersion || k != FormatVersion {
		t.Fatalf("after the upgrade: marker %d, format key %d", m, k)
	}
}
