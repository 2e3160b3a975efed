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

// pebbleIndex is where an index lives in the keyspace.
type pebbleIndex struct {
	prefix byte
	// format is the store format that added the index: a store of an older format opened
	// read-only does not have it, and a scan of it says so (what names it).
	format int
	what   string
	// lows: the writer keeps low-water marks for it (indexLows), per partition in a
	// partitioned index. The per-session wake index keeps none: the tombstones a scan of it
	// steps over are those of one session's own claims and acknowledgements since the last
	// compaction, so its cost stays bounded by the session's wakes.
	lows bool
}

var pebbleIndexes = [projection.NumIndexes]pebbleIndex{
	projection.IndexDue:          {prefix: prefixDue, format: 1, what: "due index", lows: true},
	projection.IndexKindDue:      {prefix: prefixKindDue, format: 3, what: "per-kind due index", lows: true},
	projection.IndexWakes:        {prefix: prefixAvailable, format: 1, what: "available-wake index", lows: true},
	projection.IndexSessionWakes: {prefix: prefixSessionWake, format: 5, what: "per-session wake index"},
	// Format 7 added the lease index, but a store of an older format holds no policy, so no
	// claim or stats scans it: opened read-only, it reads as the empty keyspace it is.
	projection.IndexKindLeases: {prefix: prefixKindLease, format: 1, what: "per-kind lease index"},
}

// indexHead is the start of partition part of index ix, with room for an entry's tail.
func indexHead(ix projection.Index, part string) []byte {
	if projection.Indexes[ix].Part == "" {
		return append(make([]byte, 0, 25), pebbleIndexes[ix].prefix)
	}
	k := make([]byte, 0, 1+binary.MaxVarintLen64+len(part)+24)
	k = append(k, pebbleIndexes[ix].prefix)
	k = binary.AppendUvarint(k, uint64(len(part)))
	return append(k, part...)
}

// indexEntryKey is e's key in partition part of index ix.
func indexEntryKey(ix projection.Index, part string, e projection.IndexEntry) []byte {
	return appendEntryTail(ix, indexHead(ix, part), e.Pri, e.At, e.Seq)
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
		return s.scanDue(head, head, from, to, nil, fn)
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

// ScanIndex of the writer reads through the batch from the partition's low-water mark and
// moves the mark (scanDueFrom, scanFrom); an index without marks, or a scan from a lower
// bound (which proves nothing absent below it), is read as the reader reads it.
func (w *writer) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	if w.lows == nil || !pebbleIndexes[ix].lows || from != math.MinInt64 {
		return w.reader.ScanIndex(ix, part, from, to, fn)
	}
	low := w.indexLow(ix, part)
	head := indexHead(ix, part)
	var err error
	if projection.Indexes[ix].Priority {
		err = w.scanDueFrom(head, &low, to, fn)
	} else {
		err = w.scanFrom(head, entryUpper(ix, head, to), len(head), &low, fn)
	}
	if err == nil {
		w.setIndexLow(ix, part, low)
	}
	return err
}

func (w *writer) PutIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	k := indexEntryKey(ix, part, e)
	if w.lows != nil && pebbleIndexes[ix].lows {
		if low := w.indexLow(ix, part); low != nil && bytes.Compare(k, low) < 0 {
			w.setIndexLow(ix, part, bytes.Clone(k)) // a copy: k itself then need not be on the heap
		}
	}
	return w.b.Set(k, []byte(e.ID), nil)
}

// DeleteIndex uses a sized delete: it tells Pebble's compaction picker how much data the
// tombstone covers, so the head of a queue-shaped index is compacted promptly.
func (w *writer) DeleteIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	return w.b.DeleteSized(indexEntryKey(ix, part, e), uint32(len(e.ID)), nil)
}

// partLow names the low-water mark of one partition of a partitioned index.
type partLow struct {
	ix   projection.Index
	part string
}

// indexLow is the partition's low-water mark in the batch's view; nil: unknown, its start.
// An index of one partition keeps its mark in indexLows, copied for each batch; a
// partitioned one in the committed marks (partLows, read-only during the batch) under the
// batch's own (newPartLows), merged in when it commits.
func (w *writer) indexLow(ix projection.Index, part string) []byte {
	if projection.Indexes[ix].Part == "" {
		return w.lows.ix[ix]
	}
	k := partLow{ix, part}
	if low, ok := w.newPartLows[k]; ok {
		return low
	}
	return w.partLows[k]
}

func (w *writer) setIndexLow(ix projection.Index, part string, low []byte) {
	if projection.Indexes[ix].Part == "" {
		w.lows.ix[ix] = low
		return
	}
	if w.newPartLows == nil {
		w.newPartLows = make(map[partLow][]byte)
	}
	w.newPartLows[partLow{ix, part}] = low
}

// maxPartLows bounds the partitions whose low-water marks the writer keeps; a partition
// beyond it is scanned from its start, as after a reopen.
const maxPartLows = 4096

// mergePartLows merges a committed batch's marks into the committed ones.
func mergePartLows(committed, batch map[partLow][]byte) {
	for k, low := range batch {
		if _, ok := committed[k]; ok || len(committed) < maxPartLows {
			committed[k] = low
		}
	}
}

// ScanIndex of a store of a format before 3 opened read-only: what format 3 and 5 added is
// not there to read.
func (o olderReader) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	if pebbleIndexes[ix].format > o.s.format {
		return o.needsUpgrade(pebbleIndexes[ix].what)
	}
	return o.reader.ScanIndex(ix, part, from, to, fn)
}

// format4Reader reads a store of format 3 or 4 opened read-only: everything but what format
// 5 added.
type format4Reader struct {
	reader
	s *Store
}

func (o format4Reader) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	return olderReader(o).ScanIndex(ix, part, from, to, fn)
}
