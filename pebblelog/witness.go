package pebblelog

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// The sync witness (docs/design.md §7.2, §7.5).
//
// After a crash the newest WAL is its own only witness of how far it had been synced: damage
// in its last batches, before any later chunk could say they had been synced, looks exactly
// like the torn tail of writes the crash cut short, and Pebble drops those batches without a
// word (so does a newest WAL cut at a chunk boundary, or deleted). witnessFile keeps that
// proof outside the WAL: the sequence of the last event whose batch the store knows to be
// durable, written off the commit path. The syncer, which learns from Pebble's SyncWait that
// a batch is durable, stores its last sequence in an atomic and wakes the witness goroutine;
// that goroutine writes and fsyncs the newest value, then rests witnessInterval before the
// next write, so a busy store costs one small fsync per interval and an idle one none.
//
// Open checks the witness before Pebble changes anything (checkReadOnly; a read-only Open
// after its Pebble open): a store whose last event (mlastseq, written in the batch of the
// events it counts) is older than the witnessed sequence has lost acknowledged work and is
// refused with ErrCorruptStore, naming the newest WAL and where its reading stopped. What
// the witness cannot cover is the window between a batch's acknowledgement and the next
// witness write: at most witnessInterval plus one write and fsync of the witness.
//
// The file has two slots; each write goes to the slot after the last one written, so a write
// torn by a crash damages only that slot and the other still holds the witness before it. A
// slot that does not check out (torn, or damaged) is no evidence and is skipped: the witness
// can only ever be weaker than the truth, never stronger, so a damaged witness never refuses
// a whole store. An older build ignores the file and leaves it behind: a witnessed sequence
// stays true as the log only grows, so no store format change is needed.
const witnessFile = "WORKLOG.synced"

// witnessInterval is the least time between two witness writes: the window of §7.5 (plus
// one write and fsync) and the cost of the witness (one fsync per interval at most).
const witnessInterval = 50 * time.Millisecond

// A slot: magic (8), generation (8), sequence (8), CRC-32C of the 24 bytes before it (4).
// Slots lie witnessSlotSize apart, each in a disk sector of its own.
const (
	witnessMagic    = "wlsync01"
	witnessSlotLen  = 28
	witnessSlotSize = 512
)

// witnessSlot is one decoded slot.
type witnessSlot struct {
	gen, seq uint64
}

func encodeWitnessSlot(w witnessSlot) []byte {
	b := make([]byte, witnessSlotLen)
	copy(b, witnessMagic)
	binary.LittleEndian.PutUint64(b[8:], w.gen)
	binary.LittleEndian.PutUint64(b[16:], w.seq)
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
	return b
}

func decodeWitnessSlot(b []byte) (witnessSlot, bool) {
	if len(b) < witnessSlotLen || string(b[:8]) != witnessMagic ||
		binary.LittleEndian.Uint32(b[24:]) != crc32.Checksum(b[:24], castagnoli) {
		return witnessSlot{}, false
	}
	return witnessSlot{binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:])}, true
}

// readWitness returns the newest slot of dir's witness that checks out; ok false when there
// is no file or no such slot.
func readWitness(fs vfs.FS, dir string) (w witnessSlot, ok bool, err error) {
	data, err := readFile(fs, fs.PathJoin(dir, witnessFile))
	if oserrNotExist(err) {
		return w, false, nil
	}
	if err != nil {
		return w, false, err
	}
	for off := 0; off < 2*witnessSlotSize && off < len(data); off += witnessSlotSize {
		if s, good := decodeWitnessSlot(data[off:]); good && (!ok || s.gen > w.gen) {
			w, ok = s, true
		}
	}
	return w, ok, nil
}

// checkWitness refuses a store whose last event, lastSeq, is older than the sequence its
// witness says was durable. The error names the newest WAL, where the lost batches were, and
// where its reading stops.
func checkWitness(fs vfs.FS, dir string, lastSeq uint64) error {
	w, ok, err := readWitness(fs, dir)
	if err != nil {
		return ioError(dir, witnessFile, "reading the sync witness", err)
	}
	if !ok || w.seq <= lastSeq {
		return nil
	}
	file, off := witnessShortfall(fs, dir)
	e := damagedFile(file, off, fmt.Sprintf("the log ends at event %d, but %s says event %d had been synced and acknowledged: the batches after the log's end are lost", lastSeq, witnessFile, w.seq))
	e.Dir = dir
	e.Hint += "; or delete " + witnessFile + " to open the store without them"
	return e
}

// witnessShortfall names the file where a store short of its witness lost its tail: the
// newest WAL holding batches of its own and the offset where its reading stops, or the
// witness file itself when no WAL holds any (the WAL was deleted or emptied; an obsolete
// WAL kept for recycling holds none).
func witnessShortfall(fs vfs.FS, dir string) (string, int64) {
	names, err := fs.List(dir)
	if err != nil {
		return witnessFile, -1
	}
	var nums []uint64
	for _, n := range names {
		if num, ok := parseWALName(n); ok {
			nums = append(nums, num)
		}
	}
	slices.Sort(nums)
	for _, num := range slices.Backward(nums) {
		data, err := readFile(fs, fs.PathJoin(dir, walName(num)))
		if err != nil {
			return walName(num), -1
		}
		if s := scanLog(data, uint32(num), 0); len(s.records) > 0 {
			return walName(num), s.endOff
		}
	}
	return witnessFile, -1
}

// syncWitness is a running store's witness writer.
type syncWitness struct {
	fs     vfs.FS
	dir    string
	logger *slog.Logger

	durable atomic.Uint64 // the last sequence known durable (set by the syncer)
	wake    chan struct{} // capacity 1: the syncer's nudge
	stop    chan struct{}
	done    chan struct{}

	f    vfs.File
	last witnessSlot // the slot written last
}

func newSyncWitness(fs vfs.FS, dir string, logger *slog.Logger) *syncWitness {
	return &syncWitness{fs: fs, dir: dir, logger: logger,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// advance records that every event up to seq is durable. It runs in the syncer, after the
// batch's SyncWait and before its callers are answered: an atomic store and a send that
// never blocks.
func (w *syncWitness) advance(seq uint64) {
	w.durable.Store(seq)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run writes the witness until close: after each write it rests witnessInterval. A failed
// write or sync ends the witness for this session (logged): the file keeps what was last
// written, which is still true. The store goes on; its WAL's own failures fail it.
func (w *syncWitness) run() {
	defer close(w.done)
	defer func() {
		if w.f != nil {
			w.f.Close()
		}
	}()
	rest := time.NewTimer(0)
	defer rest.Stop()
	for {
		select {
		case <-w.wake:
		case <-w.stop:
			w.write() // what the last batches made durable, before the store closes
			return
		}
		if !w.write() {
			<-w.stop
			return
		}
		rest.Reset(witnessInterval)
		select {
		case <-rest.C:
		case <-w.stop:
			w.write()
			return
		}
	}
}

// close stops the witness after a last write; call it once the syncer has answered every
// batch.
func (w *syncWitness) close() {
	close(w.stop)
	<-w.done
}

// write writes the durable sequence into the next slot and syncs it, if it moved; false
// after a failure.
func (w *syncWitness) write() bool {
	seq := w.durable.Load()
	if seq <= w.last.seq {
		return true
	}
	if err := w.writeSlot(seq); err != nil {
		w.logger.Error("the sync witness could not be written; the store goes on without it until it is reopened",
			"file", w.fs.PathJoin(w.dir, witnessFile), "err", err)
		return false
	}
	return true
}

func (w *syncWitness) writeSlot(seq uint64) error {
	if w.f == nil {
		if err := w.openFile(); err != nil {
			return err
		}
	}
	next := witnessSlot{gen: w.last.gen + 1, seq: seq}
	if _, err := w.f.WriteAt(encodeWitnessSlot(next), int64(next.gen%2)*witnessSlotSize); err != nil {
		return err
	}
	if err := w.f.SyncData(); err != nil {
		return err
	}
	w.last = next
	return nil
}

// openFile opens (or creates) the witness file and continues its generations. A new file's
// directory entry is synced once: until then a crash may lose the file, which only loses
// the witness.
func (w *syncWitness) openFile() error {
	prev, ok, err := readWitness(w.fs, w.dir)
	if err != nil {
		return err
	}
	path := w.fs.PathJoin(w.dir, witnessFile)
	_, statErr := w.fs.Stat(path)
	f, err := w.fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if oserrNotExist(statErr) {
		if err := syncDir(w.fs, w.dir); err != nil {
			f.Close()
			return err
		}
	}
	w.f = f
	if ok {
		w.last.gen = prev.gen // the next write goes to the other slot: prev stays intact
	}
	return nil
}

// checkWitnessOf is checkWitness against the last sequence of db, Open's read-only check of
// an existing store.
func checkWitnessOf(dir string, fs vfs.FS, db *pebble.DB) error {
	last, err := reader{r: db}.LastSeq()
	if err != nil {
		return &OpenError{Dir: dir, Kind: ErrCorruptStore, Offset: -1, Detail: "reading the last sequence", Err: err}
	}
	return checkWitness(fs, dir, last)
}
