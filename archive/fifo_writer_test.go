package archive

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 25: the writer read a FIFO as its last segment as a damaged one of size 0, and began
// the next segment claiming the one before was empty. OpenWriter refuses it (ErrCorrupt
// naming the file), never blocks on it, and writes nothing; so does a FIFO before an empty
// last segment, whose length the writer would read.
func TestWriterFIFOSegmentRefused(t *testing.T) {
	for _, tc := range []struct {
		name      string
		segs      int    // segments written before
		fifo      uint32 // which segment is the FIFO
		emptyLast bool   // a last segment with no frame after the FIFO (a crash before its first Commit)
	}{{"only segment", 0, 1, false}, {"last segment", 1, 2, false}, {"before an empty last segment", 1, 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.segs > 0 {
				w, err := OpenWriter(dir, nil)
				if err != nil {
					t.Fatal(err)
				}
				commit(t, w, 1, 2, 3)
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			fifo := filepath.Join(dir, segName(tc.fifo))
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			if tc.emptyLast {
				if err := os.WriteFile(filepath.Join(dir, segName(tc.fifo+1)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			before, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				w, err := OpenWriter(dir, nil)
				if err == nil {
					w.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				var ae *Error
				if !errors.As(err, &ae) || ae.File != fifo || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "not a regular file") {
					t.Fatalf("OpenWriter: %v; want ErrCorrupt naming %s: not a regular file", err, fifo)
				}
			case <-time.After(time.Minute):
				t.Fatal("OpenWriter blocked on the FIFO")
			}
			after, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			names := func(es []os.DirEntry) (out []string) {
				for _, e := range es {
					if e.Name() != lockName { // the writer's lock file may appear
						out = append(out, e.Name())
					}
				}
				return out
			}
			if b, a := names(before), names(after); strings.Join(a, " ") != strings.Join(b, " ") {
				t.Errorf("the refused OpenWriter changed the directory: %v, before %v", a, b)
			}
		})
	}
}
