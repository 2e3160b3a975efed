package pebblelog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// wantOpenErr checks that err is an *OpenError of kind that names dir, and returns it.
func wantOpenErr(t *testing.T, err, kind error, dir string) *OpenError {
	t.Helper()
	if err == nil {
		t.Fatalf("Open(%s) succeeded, want %v", dir, kind)
	}
	if !errors.Is(err, kind) {
		t.Fatalf("Open(%s) = %v, want an error matching %v", dir, err, kind)
	}
	var oe *OpenError
	if !errors.As(err, &oe) {
		t.Fatalf("Open(%s) = %T %v, want an *OpenError", dir, err, err)
	}
	if oe.Kind != kind || oe.Dir != dir {
		t.Errorf("OpenError kind %v dir %q, want %v %q", oe.Kind, oe.Dir, kind, dir)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("Open error %q does not name the directory %s", err, dir)
	}
	return oe
}

func TestOpenCreatesMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "store")
	s := openT(t, dir, &Options{})
	marker, err := os.ReadFile(filepath.Join(dir, MarkerFile))
	if err != nil {
		t.Fatalf("no marker after creating a store: %v", err)
	}
	if got, want := string(marker), fmt.Sprintf("worklog store format %d\n", FormatVersion); got != want {
		t.Errorf("marker = %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, MarkerFile+".tmp")); !os.IsNotExist(err) {
		t.Errorf("the marker's temporary file is left behind: %v", err)
	}
	seedStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, &Options{})
	if last, err := s.LastSeq(context.Background()); err != nil || last != 6 {
		t.Fatalf("LastSeq after reopen = %d, %v; want 6", last, err)
	}
	mustVerify(t, s)
}

func TestOpenEmptyDirectoryBecomesStore(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	if last, err := s.LastSeq(context.Background()); err != nil || last != 0 {
		t.Fatalf("LastSeq of a new store = %d, %v", last, err)
	}
	mustVerify(t, s)
	if _, err := os.Stat(filepath.Join(dir, MarkerFile)); err != nil {
		t.Fatalf("no marker: %v", err)
	}
}

func TestOpenRefusesForeignDirectory(t *testing.T) {
	for _, readOnly := range []bool{false, true} {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "notes.txt"), "my precious notes\n")
		if err := os.Mkdir(filepath.Join(dir, "photos"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "photos", "cat.jpg"), "meow")
		before := listing(t, dir)
		_, err := Open(dir, &Options{ReadOnly: readOnly})
		wantOpenErr(t, err, ErrNotAStore, dir)
		if after := listing(t, dir); !slices.Equal(before, after) {
			t.Errorf("read-only %v: a refused Open changed the directory:\nbefore %q\nafter  %q", readOnly, before, after)
		}
	}
}

func TestOpenRefusesNewerFormat(t *testing.T) {
	t.Run("existing store", func(t *testing.T) {
		dir := t.TempDir()
		s := openT(t, dir, &Options{})
		seedStore(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, MarkerFile), "worklog store format 99\n")
		before := listing(t, dir)
		_, err := Open(dir, &Options{})
		wantOpenErr(t, err, ErrFormatTooNew, dir)
		if want := fmt.Sprintf("format 99, this build reads up to %d", FormatVersion); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name the store's format and this build's (%q)", err, want)
		}
		if after := listing(t, dir); !slices.Equal(before, after) {
			t.Errorf("a refused Open changed the store:\nbefore %q\nafter  %q", before, after)
		}
	})
	t.Run("marker only", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, MarkerFile), "worklog store format 99")
		before := listing(t, dir)
		for _, ro := range []bool{false, true} {
			_, err := Open(dir, &Options{ReadOnly: ro})
			wantOpenErr(t, err, ErrFormatTooNew, dir)
		}
		if after := listing(t, dir); !slices.Equal(before, after) {
			t.Errorf("a refused Open changed the directory:\nbefore %q\nafter  %q", before, after)
		}
	})
}

func TestOpenRefusesGarbageMarker(t *testing.T) {
	for _, marker := range []string{
		"", "hello", "\x00\x01\x02", "worklog store format", "worklog store format abc",
		"worklog store format 0", "worklog store format -3", "WORKLOG STORE FORMAT 1",
	} {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, MarkerFile), marker)
		before := listing(t, dir)
		_, err := Open(dir, &Options{})
		if err == nil || !errors.Is(err, ErrNotAStore) || !strings.Contains(err.Error(), dir) {
			t.Errorf("marker %q: Open = %v, want ErrNotAStore naming %s", marker, err, dir)
		}
		if after := listing(t, dir); !slices.Equal(before, after) {
			t.Errorf("marker %q: a refused Open changed the directory:\nbefore %q\nafter  %q", marker, before, after)
		}
	}
}

// The format key inside the database is the second half of the marker.
func TestOpenRefusesNewerFormatKey(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	seedStore(t, s)
	if err := s.db.Set(keyFormat, []byte("worklog store format 99"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The key is read on a read-only open first: the refusal leaves every file as it was
	// (a read-write pebble.Open would have flushed the WAL and rewritten the MANIFEST).
	before := fileHashes(t, dir)
	_, err := Open(dir, &Options{})
	wantOpenErr(t, err, ErrFormatTooNew, dir)
	if want := fmt.Sprintf("this build reads up to %d", FormatVersion); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name this build's format (%q)", err, want)
	}
	if after := fileHashes(t, dir); !maps.Equal(before, after) {
		t.Errorf("the refused Open changed the store:\nbefore %v\nafter  %v", before, after)
	}
}

// A directory with a valid marker but someone else's Pebble database is refused.
func TestOpenRefusesForeignDatabaseWithMarker(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebbleFormat, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("their-key"), []byte("their value"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, MarkerFile), "worklog store format 1\n")
	_, err = Open(dir, &Options{})
	wantOpenErr(t, err, ErrNotAStore, dir)
}

// Builds before this one wrote the marker first: a crash of one after the marker, before
// Pebble created its files, left only the marker. Once the marker says a store exists, Open
// never creates a database, so that directory is refused (nothing in it is changed), with
// the advice to delete it.
func TestOpenMarkerWithoutDatabase(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, MarkerFile), "worklog store format 1\n")
	before := listing(t, dir)
	for _, ro := range []bool{false, true} {
		_, err := Open(dir, &Options{ReadOnly: ro})
		oe := wantOpenErr(t, err, ErrCorruptStore, dir)
		if !strings.Contains(oe.Hint, "deleted") {
			t.Errorf("hint %q does not say the directory can be deleted", oe.Hint)
		}
	}
	after := slices.DeleteFunc(listing(t, dir), func(l string) bool {
		return strings.HasPrefix(l, lockFile+" ") || strings.HasPrefix(l, "LOCK ")
	})
	if !slices.Equal(before, after) {
		t.Errorf("a refused Open changed the directory (lock files aside):\nbefore %q\nafter  %q", before, after)
	}
}

// Creation writes WORKLOG.tmp, then Pebble's files, then renames WORKLOG.tmp to WORKLOG. A
// crash before the rename leaves Pebble's files beside WORKLOG.tmp: the next read-write Open
// finishes the creation; a read-only one refuses it without writing.
func TestOpenInterruptedCreation(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebbleFormat, Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, MarkerFile+".tmp"), "worklog store format 1\n")
	before := listing(t, dir)
	_, err = Open(dir, &Options{ReadOnly: true})
	wantOpenErr(t, err, ErrNotAStore, dir)
	if after := listing(t, dir); !slices.Equal(before, after) {
		t.Errorf("a refused read-only Open changed the directory:\nbefore %q\nafter  %q", before, after)
	}
	s := openT(t, dir, nil)
	seedStore(t, s)
	mustVerify(t, s)
	if _, err := os.Stat(filepath.Join(dir, MarkerFile)); err != nil {
		t.Errorf("no marker after finishing the creation: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, MarkerFile+".tmp")); !os.IsNotExist(err) {
		t.Errorf("WORKLOG.tmp left behind: %v", err)
	}
}

// A crash while a new store was being created, after the lock file was created but before the
// marker was renamed into place, leaves only worklog's own files. The next Open must finish
// creating the store, not refuse the directory as foreign for ever.
func TestOpenAfterCrashDuringCreation(t *testing.T) {
	for _, files := range [][]string{
		{lockFile},
		{lockFile, MarkerFile + ".tmp"},
	} {
		dir := t.TempDir()
		for _, f := range files {
			writeFile(t, filepath.Join(dir, f), "")
		}
		s, err := Open(dir, &Options{})
		if err != nil {
			t.Errorf("directory holding only %v: Open = %v, want a new store", files, err)
			continue
		}
		seedStore(t, s)
		mustVerify(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenRefusesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	writeFile(t, path, "I am a file")
	_, err := Open(path, &Options{})
	wantOpenErr(t, err, ErrNotAStore, path)
	if b, _ := os.ReadFile(path); string(b) != "I am a file" {
		t.Errorf("the file was changed: %q", b)
	}
}

func TestOpenReadOnlyMissingOrEmpty(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	_, err := Open(missing, &Options{ReadOnly: true})
	wantOpenErr(t, err, ErrNotAStore, missing)
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("a read-only Open created %s", missing)
	}
	empty := t.TempDir()
	_, err = Open(empty, &Options{ReadOnly: true})
	wantOpenErr(t, err, ErrNotAStore, empty)
	if l := listing(t, empty); len(l) != 1 { // "." itself
		t.Errorf("a read-only Open wrote into an empty directory: %q", l)
	}
}

func TestOpenReadOnlyRefusesWrites(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	seedStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ro := openT(t, dir, &Options{ReadOnly: true})
	if got := len(readAll(t, ro)); got != 6 {
		t.Fatalf("read-only store has %d events, want 6", got)
	}
	mustVerify(t, ro)
	err := ro.Update(t.Context(), func(tx *Txn) error { return tx.Append(submitted("s1", "t9", sec(9), false)) })
	if !errors.Is(err, ErrReadOnlyStore) {
		t.Fatalf("Update on a read-only store = %v, want ErrReadOnlyStore", err)
	}
}

func wantLocked(t *testing.T, err error, dir string) {
	t.Helper()
	wantOpenErr(t, err, ErrLocked, dir)
	if !strings.Contains(err.Error(), "checkpoint") {
		t.Errorf("lock error %q does not say to take a checkpoint", err)
	}
}

func TestOpenLockedInProcess(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	seedStore(t, s)
	// Issue 26.7: the error says the store is open in this process, not in another one, and
	// what to do; and another path to the same directory is the same store (fcntl locks are
	// the process's: it locked again, and closing either dropped the other's lock).
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dir, dir + "/.", link} {
		for _, ro := range []bool{false, true} {
			s2, err := Open(path, &Options{ReadOnly: ro})
			if err == nil {
				s2.Close()
				t.Fatalf("a second Open of %s (ReadOnly %v) in this process succeeded", path, ro)
			}
			wantLocked(t, err, path)
			if !strings.Contains(err.Error(), "already open in this process") || strings.Contains(err.Error(), "another process") {
				t.Errorf("Open(%s): %v, want it to say the store is already open in this process", path, err)
			}
		}
	}
	// The refused opens left the holder working.
	appendEvents(t, s, submitted("s1", "t4", sec(7), false))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, &Options{})
	if last, _ := s.LastSeq(context.Background()); last != 7 {
		t.Fatalf("LastSeq = %d, want 7", last)
	}
	mustVerify(t, s)
}

const holdStoreEnv = "WORKLOG_TEST_HOLD_STORE"

// TestHelperHoldStore is not a test: TestOpenLockedByAnotherProcess runs the test binary again
// with holdStoreEnv set, and this opens the store, says "ready" and waits to be killed.
func TestHelperHoldStore(t *testing.T) {
	dir := os.Getenv(holdStoreEnv)
	if dir == "" {
		t.Skip("helper process for TestOpenLockedByAnotherProcess")
	}
	s, err := Open(dir, &Options{})
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(3)
	}
	os.Stdout.WriteString("ready\n")
	// Wait for the parent to kill us; if it dies instead, stdin closes and we exit.
	io.Copy(io.Discard, os.Stdin)
	s.Close()
	os.Exit(0)
}

func TestOpenLockedByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, &Options{})
	seedStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	line, cmd, stop := startHolderCmd(t, dir)
	defer stop()
	if line != "ready" {
		t.Fatalf("helper process said %q; want ready", line)
	}

	for _, ro := range []bool{false, true} {
		_, err := Open(dir, &Options{ReadOnly: ro})
		wantLocked(t, err, dir)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper process ended with %v, want killed by SIGKILL", err)
	}

	// The kernel dropped the dead holder's lock: the store opens, with its history.
	s = openT(t, dir, &Options{})
	if got := len(readAll(t, s)); got != 6 {
		t.Fatalf("store has %d events after the holder was killed, want 6", got)
	}
	mustVerify(t, s)
}

// quietLogger keeps Pebble's WAL-replay lines out of the test output.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic("pebble fatal: " + format)
}

// A process that holds Pebble's LOCK but not WORKLOG.lock (a raw Pebble open, a tool) makes
// Open fail with ErrLocked from pebble.LockDirectory, typed: replay used to recognise Pebble's
// lock error by its message.
func TestOpenPebbleLockHeld(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, nil)
	seedStore(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	held, err := pebble.LockDirectory(dir, vfs.Default)
	if err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{false, true} {
		_, err := Open(dir, &Options{ReadOnly: ro})
		oe := wantOpenErr(t, err, ErrLocked, dir)
		if oe.File != "LOCK" {
			t.Errorf("OpenError.File = %q, want LOCK", oe.File)
		}
	}
	// WORKLOG.lock was released with the refusal: once Pebble's lock goes, the store opens.
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, nil)
	if got := len(readAll(t, s)); got != 6 {
		t.Fatalf("%d events, want 6", got)
	}
}
