package pebblelog

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 25: a FIFO put in place of one of the store's files blocked Open for good (the WAL
// check and Pebble open them for reading, which waits for a writer). Open refuses it, before
// the locks, naming the file, read-write and read-only, and changes nothing.
func TestFIFOInPlaceOfStoreFileRefused(t *testing.T) {
	src := t.TempDir()
	s := openT(t, src, &Options{})
	seedStore(t, s)
	if err := s.db.Flush(); err != nil { // an sstable
		t.Fatal(err)
	}
	ev := submitted("s1", "big", sec(40), false)
	ev.Input = bigValue(7, BlobMin) // a blob file
	appendEvents(t, s, ev)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	pick := func(t *testing.T, dir, pattern string) string {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil || len(m) == 0 {
			t.Fatalf("no %s in the store: %v", pattern, err)
		}
		rel, _ := filepath.Rel(dir, m[len(m)-1])
		return rel
	}
	for _, pattern := range []string{"*.log", "MANIFEST-*", "OPTIONS-*", "*.sst", BlobDir + "/*.blob", cleanCloseFile, witnessFile} {
		t.Run(strings.NewReplacer("*", "", "/", "_").Replace(pattern), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			copyTree(t, src, dir)
			name := pick(t, dir, pattern)
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(filepath.Join(dir, name), 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			for _, ro := range []bool{false, true} {
				before := fileHashesNoFIFO(t, dir)
				done := make(chan error, 1)
				go func() {
					s, err := Open(dir, &Options{ReadOnly: ro})
					if err == nil {
						s.Close()
					}
					done <- err
				}()
				select {
				case err := <-done:
					oe := wantOpenErr(t, err, ErrCorruptStore, dir)
					if oe.File != name || !strings.Contains(err.Error(), "not a regular file") {
						t.Errorf("read-only %v: %v; want the file %s named, not a regular file", ro, err, name)
					}
				case <-time.After(time.Minute):
					t.Fatalf("read-only %v: Open blocked on the FIFO %s", ro, name)
				}
				if after := fileHashesNoFIFO(t, dir); !maps.Equal(before, after) {
					t.Errorf("read-only %v: the refused Open changed the store", ro)
				}
			}
		})
	}
}

// copyTree copies a closed store directory (files and the blob directory).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// fileHashesNoFIFO is the contents of every regular file under dir (reading the FIFO would
// block), by relative path, plus the names of the others.
func fileHashesNoFIFO(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !d.Type().IsRegular() {
			out[rel] = "not regular"
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
