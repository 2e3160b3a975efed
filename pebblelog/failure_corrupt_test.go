package pebblelog

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// flushedStore builds a store in dir holding one sstable of n submits (flushed, so nothing is
// left in the WAL) and returns the sstable's path. Task i is "0-%04d" of session "s1", with
// an input of ~200 incompressible bytes, so events and task records fill most of the file.
func flushedStore(t *testing.T, dir string, n int) string {
	t.Helper()
	s, err := Open(dir, &Options{})
	if err != nil {
		t.Fatal(err)
	}
	writeTasks(t, s, 0, n)
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil || len(names) != 1 {
		t.Fatalf("want one sstable, found %v (%v)", names, err)
	}
	return names[0]
}

func writeTasks(t *testing.T, s *Store, file, n int) {
	t.Helper()
	for i := range n {
		ev := submitted("s1", fmt.Sprintf("%d-%04d", file, i), sec(i), false)
		sum := sha256.Sum256([]byte(ev.TaskID))
		ev.Input = []byte(fmt.Sprintf(`{"pad":"%x%x%x"}`, sum, sum, sum))
		appendEvents(t, s, ev)
	}
}

// flipDataBlocks flips one byte in the middle of data blocks of the sstable at path: every
// one when all is set, else the one at 30% of the data (in the log's events: see
// flushedStore). It reads the table's layout with Pebble's sstable reader, so the byte is
// inside a block's checksummed contents.
func flipDataBlocks(t *testing.T, path string, all bool) {
	t.Helper()
	f, err := vfs.Default.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	readable, err := sstable.NewSimpleReadable(f)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sstable.NewReader(context.Background(), readable, sstable.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	layout, err := r.Layout()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // closes readable and f
	if len(layout.Data) < 4 {
		t.Fatalf("%s has %d data blocks; the test needs more", path, len(layout.Data))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range layout.Data {
		if all || i == len(layout.Data)*3/10 {
			b[h.Offset+h.Length/2] ^= 0x5a
		}
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantDamage checks err names the damage: ErrStoreFailed (or, from Open, an *OpenError)
// wrapping ErrCorruptStore, with the damaged file in its text.
func wantDamage(t *testing.T, what string, err error, file string) {
	t.Helper()
	if !errors.Is(err, ErrCorruptStore) || !strings.Contains(fmt.Sprint(err), filepath.Base(file)) {
		t.Errorf("%s: err = %v, want ErrCorruptStore naming %s", what, err, filepath.Base(file))
	}
}

// Issue 11.3 (a): a damaged block read while opening (the format key) refuses the store with
// an *OpenError of kind ErrCorruptStore naming the sstable; before, Pebble's DataCorruption
// handler called our logger's Fatalf, which panicked.
func TestCorruptBlockAtOpen(t *testing.T) {
	dir := t.TempDir()
	sst := flushedStore(t, dir, 500)
	flipDataBlocks(t, sst, true)
	s, err := Open(dir, &Options{})
	if err == nil {
		s.Close()
		t.Fatal("Open of a store whose every data block is damaged succeeded")
	}
	var oe *OpenError
	if !errors.As(err, &oe) || oe.Kind != ErrCorruptStore || oe.File != filepath.Base(sst) {
		t.Fatalf("Open: err = %v (%T), want an *OpenError of kind ErrCorruptStore with File %s", err, err, filepath.Base(sst))
	}
	t.Logf("Open: %v", err)
}

// Issue 11.3 (b): a damaged block found by a read while the store runs (ReadLog in the
// caller's goroutine, Verify) is an error wrapping ErrStoreFailed and ErrCorruptStore naming
// the file; the store has failed, so every later call, reads and writes, returns it too.
func TestCorruptBlockOnRead(t *testing.T) {
	for _, read := range []string{"ReadLog", "Verify"} {
		t.Run(read, func(t *testing.T) {
			dir := t.TempDir()
			sst := flushedStore(t, dir, 500)
			flipDataBlocks(t, sst, false) // a block of events, not one of the keys Open reads
			s := openT(t, dir, &Options{})
			var err error
			switch read {
			case "ReadLog":
				err = s.ReadLog(context.Background(), 1, func(events.Event) error { return nil })
			case "Verify":
				_, err = s.Verify(context.Background(), VerifyOptions{})
			}
			if !errors.Is(err, ErrStoreFailed) {
				t.Errorf("%s: err = %v, want ErrStoreFailed", read, err)
			}
			wantDamage(t, read, err, sst)
			wantDamage(t, "Update after the damage was found", update(s, submitted("s1", "new", sec(1), false)), sst)
			wantDamage(t, "View after the damage was found", s.View(context.Background(), func(projection.Reader) error { return nil }), sst)
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

// Issue 11.3 (c): a compaction (a Pebble goroutine, which no caller could recover from a
// panic) that reads a damaged block fails the store instead of the process.
func TestCorruptBlockInCompaction(t *testing.T) {
	dir := t.TempDir()
	sst := flushedStore(t, dir, 300)
	flipDataBlocks(t, sst, false)
	s := openT(t, dir, &Options{})
	writeTasks(t, s, 1, 300) // a second sstable over the same key ranges: the compaction must merge
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	// Pebble retries the failing compaction (slowed to once a second by backgroundError), so
	// a manual Compact does not return on its own: it is canceled once the store failed.
	ctx, cancel := context.WithCancel(context.Background())
	compacted := make(chan error, 1)
	go func() { compacted <- s.db.Compact(ctx, []byte{0}, []byte{0xff}, false) }()
	select {
	case <-s.fh.ch: // reported from Pebble's compaction goroutine
	case err := <-compacted:
		t.Fatalf("the compaction of a damaged sstable ended (%v) without failing the store", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the store did not fail after a compaction over a damaged block")
	}
	cancel()
	<-compacted
	wantDamage(t, "Update after the compaction", update(s, submitted("s1", "new", sec(1), false)), sst)
	wantDamage(t, "LastSeq after the compaction", func() error { _, err := s.LastSeq(context.Background()); return err }(), sst)
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
