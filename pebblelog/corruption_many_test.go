package pebblelog

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// The corruption matrix's crashed store of many WALs (issue 25): crashed in its second
// session after several WAL rotations, with sstables, blob files and more than one live WAL.
//
// A flush rotates the WAL and makes the old one obsolete; a WAL stays live only until its
// memtable is flushed. To crash with several live WALs (an older one closed with its
// end-of-log trailer, the newest one open: two, as many as Pebble keeps before it stalls
// writes at MemTableStopWritesThreshold), the flushes are held: the sstables' creation
// waits on the FS until the crash clone is taken, so the memtables that filled meanwhile (and
// their WALs) are all still queued. Before that, explicit flushes leave sstables and recycled
// WAL files, and large values leave blob files. The clone is taken once the sync witness
// covers the last acknowledged event, like the other crashed stores.
func buildManyWALStore(t *testing.T) matrixStore {
	t.Helper()
	crash := vfs.NewCrashableMem()
	var holdMu sync.Mutex
	holding := false
	release := make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, ".sst") {
			holdMu.Lock()
			h := holding
			holdMu.Unlock()
			if h {
				<-release
			}
		}
		return nil
	})
	fs := errorfs.Wrap(crash, inj)
	// The first session: created, written, closed (so the second session's WALs carry synced
	// offsets from the start; the first one does too, see rotateFirstWAL).
	s, err := Open("/store", &Options{FS: fs, MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var l ledger
	l.history(t, s, 0, 16)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open("/store", &Options{FS: fs, MemTableSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	// Rotations by explicit flushes: sstables, and obsolete WAL files recycled for the next.
	for round := range 3 {
		l.history(t, s, 16+round*8, 8)
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Blob files.
	big := submitted("s1", "big1", sec(500), true)
	big.Input = bigValue(31, BlobMin)
	l.commit(t, s, big)
	wk := requestedWake("s2", "wbig2", sec(501))
	wk.Payload = bigValue(32, BlobMin+5)
	l.commit(t, s, wk)
	// From here on flushes wait: memtables that fill stay queued, each with its WAL.
	holdMu.Lock()
	holding = true
	holdMu.Unlock()
	defer func() {
		holdMu.Lock()
		holding = false
		holdMu.Unlock()
		close(release)
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	filler := []byte(`"` + strings.Repeat("f", 12<<10) + `"`)
	for i := 0; ; i++ {
		m := s.db.Metrics()
		if m.WAL.Files >= 2 {
			break
		}
		if i > 400 {
			t.Fatalf("after %d commands of 12 KiB, %d live WALs (%d memtables)", i, m.WAL.Files, m.MemTable.Count)
		}
		ev := submitted(fmt.Sprintf("s%d", i%3), fmt.Sprintf("fill%03d", i), sec(600+i), false)
		ev.Input = filler
		l.commit(t, s, ev)
	}
	// The newest WAL gets an ordinary history, so its sweep has many small chunks too.
	l.history(t, s, 100, 12)
	clone := witnessedClone(t, crash, l[len(l)-1].seq)
	return matrixStore{"crashed-many", clone, l}
}
