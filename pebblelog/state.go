package pebblelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/worklog/worklog/projection"
)

// ErrCorruptRecord marks a projection record or index entry that does not decode.
var ErrCorruptRecord = errors.New("pebblelog: corrupt projection record")

// reader implements projection.Reader over any Pebble reader: the DB, a snapshot, or an
// indexed batch (which reads its own writes merged with the DB).
type reader struct {
	r pebble.Reader
}

func (s reader) get(key []byte) ([]byte, bool, error) {
	v, closer, err := s.r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	out := append([]byte(nil), v...)
	return out, true, closer.Close()
}

func decodeRecord[T any](key, v []byte) (*T, error) {
	rec := new(T)
	if err := msgpack.Unmarshal(v, rec); err != nil {
		return nil, fmt.Errorf("%w: key %q: %v", ErrCorruptRecord, key, err)
	}
	return rec, nil
}

func (s reader) Task(id string) (*projection.Task, error) {
	k := idKey(prefixTask, id)
	v, ok, err := s.get(k)
	if err != nil || !ok {
		return nil, err
	}
	return decodeRecord[projection.Task](k, v)
}

func (s reader) Wake(id string) (*projection.Wake, error) {
	k := idKey(prefixWake, id)
	v, ok, err := s.get(k)
	if err != nil || !ok {
		return nil, err
	}
	return decodeRecord[projection.Wake](k, v)
}

func (s reader) TaskKey(session, key string) (string, error) {
	v, _, err := s.get(scopedKey(prefixTaskKey, session, key))
	return string(v), err
}

func (s reader) WakeKey(session, key string) (string, error) {
	v, _, err := s.get(scopedKey(prefixWakeKey, session, key))
	return string(v), err
}

func (s reader) ScanDue(maxAt int64, fn func(projection.IndexEntry) bool) error {
	return s.scanIndex(prefixDue, maxAt, fn)
}

func (s reader) ScanWakes(maxAt int64, fn func(projection.IndexEntry) bool) error {
	return s.scanIndex(prefixAvailable, maxAt, fn)
}

// scanIndex walks an eligibility index from its oldest entry while entries are due at maxAt.
// The upper bound stops the iterator at the first key past maxAt, so a claim never reads
// future entries.
func (s reader) scanIndex(prefix byte, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return s.scanRange([]byte{prefix}, indexUpper(prefix, maxAt), func(_ []byte, e projection.IndexEntry) bool {
		return fn(e)
	})
}

// indexUpper is the exclusive upper bound of the index entries due at maxAt.
func indexUpper(prefix byte, maxAt int64) []byte {
	return append(indexKey(prefix, maxAt, 1<<64-1), 0)
}

// scanRange walks the index entries in [lower, upper), passing each one's key (valid only
// during the call) and entry to fn until fn returns false.
func (s reader) scanRange(lower, upper []byte, fn func(key []byte, e projection.IndexEntry) bool) (err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		at, seq, good := parseIndexKey(it.Key())
		if !good {
			return fmt.Errorf("%w: index key %q", ErrCorruptRecord, it.Key())
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if !fn(it.Key(), projection.IndexEntry{At: at, Seq: seq, ID: string(v)}) {
			return nil
		}
	}
	return it.Error()
}

func (s reader) LastSeq() (uint64, error) {
	v, ok, err := s.get(keyLastSeq)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: last sequence is %d bytes", ErrCorruptRecord, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// writer implements projection.State: reads through an indexed batch, writes into it.
//
// It also keeps the task and wake records put through it, so reading one back (a command
// reads the record it just appended; the next command of the batch may read it again) costs
// a map lookup instead of a batch-merged Pebble Get and a msgpack decode. A writer lives as
// long as its batch, and every record put into the batch is put into the maps, so they hold
// exactly the batch's latest version of each record.
type writer struct {
	reader
	b       *pebble.Batch
	lastSeq uint64
	tasks   map[string]projection.Task
	wakes   map[string]projection.Wake
	lows    *indexLows // nil: scans start at each index's first key
}

// indexLows holds, for each eligibility index, a key below which the index has no live entry
// in the state the writer reads (nil: not known, the index's start). Claims scan from there
// instead of from the index's first key, so they do not step over the tombstones that claims
// and settlements leave at the head of the index: a Pebble iterator visits every tombstone
// between its lower bound and the next live key, and they pile up in the memtable until a
// flush and in sstables until a compaction drops them, so a scan from the start costs time
// in proportion to the claims since then.
//
// The single writer keeps the committed lows (writeLoop) and gives each batch's writer a copy.
// A scan raises the copy to the first live key it meets (or to its upper bound when it meets
// none): everything below is absent in the batch's view. A put below the copy lowers it to
// the new key. Deletes change nothing. Only a committed batch's copy replaces the committed
// lows; a discarded batch's is dropped, so a raise never outlives the state it observed.
type indexLows struct {
	due, avail []byte
}

func (w *writer) ScanDue(maxAt int64, fn func(projection.IndexEntry) bool) error {
	if w.lows == nil {
		return w.reader.ScanDue(maxAt, fn)
	}
	return w.scanFrom(prefixDue, &w.lows.due, maxAt, fn)
}

func (w *writer) ScanWakes(maxAt int64, fn func(projection.IndexEntry) bool) error {
	if w.lows == nil {
		return w.reader.ScanWakes(maxAt, fn)
	}
	return w.scanFrom(prefixAvailable, &w.lows.avail, maxAt, fn)
}

// scanFrom scans the index from *low (the index's start when nil) and raises *low to the
// first live key it meets, or to its upper bound when it meets none.
func (w *writer) scanFrom(prefix byte, low *[]byte, maxAt int64, fn func(projection.IndexEntry) bool) error {
	lower := []byte{prefix}
	if *low != nil {
		lower = *low
	}
	upper := indexUpper(prefix, maxAt)
	if bytes.Compare(lower, upper) >= 0 {
		return nil // no live entry below upper
	}
	var first []byte
	err := w.reader.scanRange(lower, upper, func(key []byte, e projection.IndexEntry) bool {
		if first == nil {
			first = bytes.Clone(key)
		}
		return fn(e)
	})
	if err != nil {
		return err
	}
	if first != nil {
		*low = first
	} else {
		*low = upper
	}
	return nil
}

// lower lowers *low to key when key is below it.
func lower(low *[]byte, key []byte) {
	if *low != nil && bytes.Compare(key, *low) < 0 {
		*low = key
	}
}

// Task returns a copy, like every projection.Reader: callers may change it freely.
func (w *writer) Task(id string) (*projection.Task, error) {
	if t, ok := w.tasks[id]; ok {
		return &t, nil
	}
	return w.reader.Task(id)
}

func (w *writer) Wake(id string) (*projection.Wake, error) {
	if x, ok := w.wakes[id]; ok {
		return &x, nil
	}
	return w.reader.Wake(id)
}

func (w *writer) LastSeq() (uint64, error) { return w.lastSeq, nil }

// SetLastSeq records the sequence in the writer; the key is written once per batch, by
// finish, not once per event.
func (w *writer) SetLastSeq(seq uint64) error {
	w.lastSeq = seq
	return nil
}

// finish writes the batch's last sequence, if it applied any event. Call it once, just
// before the batch commits: the key then always moves with the events in the same batch.
func (w *writer) finish(from uint64) error {
	if w.lastSeq == from {
		return nil
	}
	return w.b.Set(keyLastSeq, binary.BigEndian.AppendUint64(nil, w.lastSeq), nil)
}

func (w *writer) put(key []byte, rec any) error {
	v, err := msgpack.Marshal(rec)
	if err != nil {
		return err
	}
	return w.b.Set(key, v, nil)
}

func (w *writer) PutTask(t *projection.Task) error {
	if err := w.put(idKey(prefixTask, t.ID), t); err != nil {
		return err
	}
	if w.tasks == nil {
		w.tasks = make(map[string]projection.Task)
	}
	w.tasks[t.ID] = *t
	return nil
}

func (w *writer) PutWake(x *projection.Wake) error {
	if err := w.put(idKey(prefixWake, x.ID), x); err != nil {
		return err
	}
	if w.wakes == nil {
		w.wakes = make(map[string]projection.Wake)
	}
	w.wakes[x.ID] = *x
	return nil
}

func (w *writer) PutTaskKey(session, key, id string) error {
	return w.b.Set(scopedKey(prefixTaskKey, session, key), []byte(id), nil)
}

func (w *writer) PutWakeKey(session, key, id string) error {
	return w.b.Set(scopedKey(prefixWakeKey, session, key), []byte(id), nil)
}

func (w *writer) PutDue(e projection.IndexEntry) error {
	k := indexKey(prefixDue, e.At, e.Seq)
	if w.lows != nil {
		lower(&w.lows.due, k)
	}
	return w.b.Set(k, []byte(e.ID), nil)
}

// DeleteDue uses a sized delete: it tells Pebble's compaction picker how much data the
// tombstone covers, so the head of a queue-shaped index is compacted promptly.
func (w *writer) DeleteDue(e projection.IndexEntry) error {
	return w.b.DeleteSized(indexKey(prefixDue, e.At, e.Seq), uint32(len(e.ID)), nil)
}

func (w *writer) PutWakeIndex(e projection.IndexEntry) error {
	k := indexKey(prefixAvailable, e.At, e.Seq)
	if w.lows != nil {
		lower(&w.lows.avail, k)
	}
	return w.b.Set(k, []byte(e.ID), nil)
}

func (w *writer) DeleteWakeIndex(e projection.IndexEntry) error {
	return w.b.DeleteSized(indexKey(prefixAvailable, e.At, e.Seq), uint32(len(e.ID)), nil)
}
