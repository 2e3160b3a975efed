package pebblelog

import (
	"bytes"
	"encoding/binary"
	"math"

	"github.com/worklog/worklog/projection"
)

// The eligibility indexes (projection.Index): one row each of pebbleIndexes, and one
// ScanIndex, PutIndex and DeleteIndex for all of them.
//
// An index's entries are keys <prefix>[<uvarint len><part>][<priority 8B inverted>]<at 8B
// ordered><seq 8B BE> with the record's id as value (keys.go): the partition (a kind, a
// session) is length-prefixed, so one partition's range holds no other's keys; the
// priority is there in an index with priorities (projection.IndexSpec.Priority), so that
// byte order is claim order.

// The per-session wake index's keyspace (keys.go): the per-session available-wake index
// (projection.IndexSessionWakes: index.go), the available-wake index's entries again under
// each wake's session, which is length-prefixed so that one session's range holds no other
// session's keys. A claim of the wakes of chosen sessions (work's ClaimSessionWakes) reads
// it, so its cost does not depend on other sessions' wakes.

// pebbleIndex is where an index lives in the keyspace.
type pebbleIndex struct {
	prefix byte
	what   string // names the index in errors
	// lows: the writer keeps low-water marks for it (indexLows), per partition in a
	// partitioned index. The per-session wake index keeps none: the tombstones a scan of it
	// steps over are those of one session's own claims and acknowledgements since the last
	// compaction, so its cost stays bounded by the session's wakes.
	lows bool
}

var pebbleIndexes = [projection.NumIndexes]pebbleIndex{
	projection.IndexDue:          {prefix: prefixDue, what: "due index", lows: true},
	projection.IndexKindDue:      {prefix: prefixKindDue, what: "per-kind due index", lows: true},
	projection.IndexWakes:        {prefix: prefixAvailable, what: "available-wake index", lows: true},
	projection.IndexSessionWakes: {prefix: prefixSessionWake, what: "per-session wake index"},
	projection.IndexKindLeases:   {prefix: prefixKindLease, what: "per-kind lease index"},
}

// indexHead is the start of partition part of index ix, with room for an entry's tail.
func indexHead(ix projection.Index, part string) []byte {
	if projection.Indexes[ix].Part == "" {
		return append(make([]byte, 0, 25), pebbleIndexes[ix].prefix)
	}
	return appendIndexHead(make([]byte, 0, 1+binary.MaxVarintLen64+len(part)+24), ix, part)
}

func appendIndexHead(k []byte, ix projection.Index, part string) []byte {
	k = append(k, pebbleIndexes[ix].prefix)
	if projection.Indexes[ix].Part == "" {
		return k
	}
	k = binary.AppendUvarint(k, uint64(len(part)))
	return append(k, part...)
}

// indexEntryKey is e's key in partition part of index ix.
func indexEntryKey(ix projection.Index, part string, e projection.IndexEntry) []byte {
	return appendEntryTail(ix, indexHead(ix, part), e.Pri, e.At, e.Seq)
}

// keyScratch is e's key built in the writer's key buffer, valid until its next use: for a
// write (the batch copies the key), so that the writes of a submit allocate no key.
func (w *writer) keyScratch(ix projection.Index, part string, e projection.IndexEntry) []byte {
	w.kbuf = appendEntryTail(ix, appendIndexHead(w.kbuf[:0], ix, part), e.Pri, e.At, e.Seq)
	return w.kbuf
}

func appendEntryTail(ix projection.Index, head []byte, pri, at int64, seq uint64) []byte {
	if projection.Indexes[ix].Priority {
		return appendDueTail(head, pri, at, seq)
	}
	head = binary.BigEndian.AppendUint64(head, orderedTime(at))
	return binary.BigEndian.AppendUint64(head, seq)
}

// ScanIndex walks the partition: an index with priorities in claim order (scanDue), one
// without from the first key at or after from (the partition's first key when from is
// math.MinInt64) up to the first key past to (scanRange's bounds), so it never reads an
// entry outside the range.
func (s reader) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	if from > to {
		return nil
	}
	head := indexHead(ix, part)
	if projection.Indexes[ix].Priority {
		return s.scanDue(head, from, to, nil, fn)
	}
	lower := head
	if from != math.MinInt64 {
		lower = appendEntryTail(ix, bytes.Clone(head), 0, from, 0)
	}
	return s.scanRange(lower, entryUpper(ix, head, to), len(head), func(_ []byte, e projection.IndexEntry) bool {
		return fn(e)
	})
}

// entryUpper is the exclusive upper bound of the entries under head (an index without
// priorities) at or before to.
func entryUpper(ix projection.Index, head []byte, to int64) []byte {
	return append(appendEntryTail(ix, bytes.Clone(head), 0, to, 1<<64-1), 0)
}

// ScanIndex of the writer reads through the batch from the partition's low-water marks and
// moves them (scanDue's marks: runMarks; scanFrom); an index without marks, or a scan from a
// lower bound (which proves nothing absent below it), is read as the reader reads it.
func (w *writer) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	if w.lows == nil || !pebbleIndexes[ix].lows || from != math.MinInt64 {
		return w.reader.ScanIndex(ix, part, from, to, fn)
	}
	head := indexHead(ix, part)
	if projection.Indexes[ix].Priority {
		return w.reader.scanDue(head, math.MinInt64, to, &dueMarkView{w: w, k: partLow{ix, part}}, fn)
	}
	low := w.lows.ix[ix] // an index without priorities has one partition (the available wakes)
	err := w.scanFrom(head, entryUpper(ix, head, to), len(head), &low, fn)
	if err == nil {
		w.lows.ix[ix] = low
	}
	return err
}

func (w *writer) PutIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	k := w.keyScratch(ix, part, e)
	if w.lows != nil && pebbleIndexes[ix].lows {
		if projection.Indexes[ix].Priority {
			w.lowerRunMarks(partLow{ix, part}, e.Pri, k)
		} else {
			lower(&w.lows.ix[ix], k) // copies k
		}
	}
	return w.b.Set(k, []byte(e.ID), nil)
}

// DeleteIndex uses a sized delete: it tells Pebble's compaction picker how much data the
// tombstone covers, so the head of a queue-shaped index is compacted promptly.
func (w *writer) DeleteIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	return w.b.DeleteSized(w.keyScratch(ix, part, e), uint32(len(e.ID)), nil)
}

// A due index partition's low-water marks: one per run the walk (scanDue) enters by a seek.
//
// The walk enters the partition at its first key and each next run by a seek to the start of
// the priority below the run it leaves (priorityStart), and a seek steps over every tombstone
// between its target and the first live key. One mark per partition, raised to the first
// live key the walk met, did not help the later seeks: with a future run of a higher priority
// present, that first key is the future run's, the mark never passes it, and each lower run
// was entered at its start, over the deleted entries of every claim made from it since the
// last compaction (a claim cost that grew with the claims: BenchmarkClaimLatency's
// priorities=8). So the writer keeps a mark per seek target: runMark{run, low} says that
// the partition has no live entry in [priorityStart(head, run), low), and the walk seeks to
// low instead of to the run's start (run math.MaxInt64: the partition's first key). The
// rules are indexLows': a walk raises a mark to the key its seek landed on (nil when it found
// none: the partition holds no live entry from the run's start on); a put of key k of
// priority p lowers every mark whose range holds k (run >= p and k below low) to k; deletes
// change nothing; only a committed batch's marks replace the committed ones.

// runMark: the partition has no live entry in [priorityStart(head, run), low); low nil: none
// from priorityStart(head, run) on.
type runMark struct {
	run int64
	low []byte
}

// runMarks are one partition's marks, in no order. The committed marks and a batch's view
// share them until the batch changes one (ownRunMarks copies them first); a low is never
// changed in place.
type runMarks []runMark

// maxRunMarks bounds a partition's marks: a walk that would add one more starts the
// partition's marks afresh with it (a run without a mark is entered at its start).
const maxRunMarks = 32

// find returns the index of run's mark, or -1.
func (m runMarks) find(run int64) int {
	for i := range m {
		if m[i].run == run {
			return i
		}
	}
	return -1
}

// partLow names the low-water marks of one partition of an index with priorities ("" for
// the due index, of one partition).
type partLow struct {
	ix   projection.Index
	part string
}

// runMarks are the partition's marks in the batch's view: the batch's own once it changed
// them (newPartLows), else the committed ones (partLows, read-only during the batch).
func (w *writer) runMarks(k partLow) runMarks {
	if m, ok := w.newPartLows[k]; ok {
		return m
	}
	return w.partLows[k]
}

// ownRunMarks returns the batch's own copy of the partition's marks, to change in place (an
// append is stored back in newPartLows). The copy reuses the array of marks a committed batch
// replaced (freeMarks): a claim then allocates nothing for its marks but a moved mark's key.
func (w *writer) ownRunMarks(k partLow) runMarks {
	if m, ok := w.newPartLows[k]; ok {
		return m
	}
	if w.newPartLows == nil {
		w.newPartLows = make(map[partLow]runMarks)
	}
	committed := w.partLows[k]
	var m runMarks
	if free := w.freeMarks; free != nil && len(*free) > 0 && cap((*free)[len(*free)-1]) > len(committed) {
		m, *free = (*free)[len(*free)-1], (*free)[:len(*free)-1]
	} else {
		m = make(runMarks, 0, max(len(committed)+1, 8))
	}
	m = append(m, committed...)
	w.newPartLows[k] = m
	return m
}

// lowerRunMarks lowers the partition's marks whose range holds key k, of priority pri.
func (w *writer) lowerRunMarks(k partLow, pri int64, key []byte) {
	for i, m := range w.runMarks(k) {
		if m.run >= pri && (m.low == nil || bytes.Compare(key, m.low) < 0) {
			w.ownRunMarks(k)[i].low = bytes.Clone(key) // a copy: key itself then need not be on the heap
		}
	}
}

// dueMarkView is a writer's walk of one partition of a due index (scanDue): where its seeks
// go, and what they found.
type dueMarkView struct {
	w *writer
	k partLow
}

// target is where a seek to run's start may go instead: its mark's low, and whether the
// partition has a live entry from there on at all (false: a mark says it has none).
func (v *dueMarkView) target(run int64) (low []byte, live bool) {
	m := v.w.runMarks(v.k)
	if i := m.find(run); i >= 0 {
		return m[i].low, m[i].low != nil
	}
	return nil, true
}

// landed records that a seek to run's start (or past it, to its mark) met key first (nil:
// no key until the partition's end).
func (v *dueMarkView) landed(run int64, key []byte) {
	m := v.w.runMarks(v.k)
	i := m.find(run)
	if i >= 0 && bytes.Equal(m[i].low, key) && (m[i].low == nil) == (key == nil) {
		return
	}
	own := v.w.ownRunMarks(v.k)
	low := bytes.Clone(key) // nil stays nil
	switch {
	case i >= 0:
		own[i].low = low
	case len(own) >= maxRunMarks:
		v.w.newPartLows[v.k] = append(own[:0], runMark{run, low})
	default:
		v.w.newPartLows[v.k] = append(own, runMark{run, low})
	}
}

// maxPartLows bounds the partitions whose low-water marks the writer keeps; a partition
// beyond it is scanned from its start, as after a reopen. The due index's marks (one
// partition) are always kept.
const maxPartLows = 4096

// mergePartLows merges a committed batch's marks into the committed ones (ws.partLows), and
// keeps the arrays of the marks they replace, and the emptied batch map, for later batches.
func (ws *writerState) mergePartLows(batch map[partLow]runMarks) {
	if batch == nil {
		return
	}
	for k, m := range batch {
		old, ok := ws.partLows[k]
		if ok || len(ws.partLows) < maxPartLows || projection.Indexes[k.ix].Part == "" {
			ws.partLows[k] = m
		}
		if cap(old) > 0 && len(ws.freeMarks) < maxFreeMarks {
			ws.freeMarks = append(ws.freeMarks, old[:0])
		}
	}
	clear(batch)
	ws.sparePartLows = batch
}

// maxFreeMarks bounds the arrays of marks the writer keeps for reuse (ownRunMarks).
const maxFreeMarks = 64
