package pebblelog

import (
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
func (s reader) scanIndex(prefix byte, maxAt int64, fn func(projection.IndexEntry) bool) (err error) {
	upper := indexKey(prefix, maxAt, 1<<64-1)
	upper = append(upper, 0)
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: upper})
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
		if !fn(projection.IndexEntry{At: at, Seq: seq, ID: string(v)}) {
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
type writer struct {
	reader
	b       *pebble.Batch
	lastSeq uint64
}

func (w *writer) LastSeq() (uint64, error) { return w.lastSeq, nil }

func (w *writer) SetLastSeq(seq uint64) error {
	w.lastSeq = seq
	return w.b.Set(keyLastSeq, binary.BigEndian.AppendUint64(nil, seq), nil)
}

func (w *writer) put(key []byte, rec any) error {
	v, err := msgpack.Marshal(rec)
	if err != nil {
		return err
	}
	return w.b.Set(key, v, nil)
}

func (w *writer) PutTask(t *projection.Task) error { return w.put(idKey(prefixTask, t.ID), t) }
func (w *writer) PutWake(x *projection.Wake) error { return w.put(idKey(prefixWake, x.ID), x) }

func (w *writer) PutTaskKey(session, key, id string) error {
	return w.b.Set(scopedKey(prefixTaskKey, session, key), []byte(id), nil)
}

func (w *writer) PutWakeKey(session, key, id string) error {
	return w.b.Set(scopedKey(prefixWakeKey, session, key), []byte(id), nil)
}

func (w *writer) PutDue(e projection.IndexEntry) error {
	return w.b.Set(indexKey(prefixDue, e.At, e.Seq), []byte(e.ID), nil)
}

// DeleteDue uses a sized delete: it tells Pebble's compaction picker how much data the
// tombstone covers, so the head of a queue-shaped index is compacted promptly.
func (w *writer) DeleteDue(e projection.IndexEntry) error {
	return w.b.DeleteSized(indexKey(prefixDue, e.At, e.Seq), uint32(len(e.ID)), nil)
}

func (w *writer) PutWakeIndex(e projection.IndexEntry) error {
	return w.b.Set(indexKey(prefixAvailable, e.At, e.Seq), []byte(e.ID), nil)
}

func (w *writer) DeleteWakeIndex(e projection.IndexEntry) error {
	return w.b.DeleteSized(indexKey(prefixAvailable, e.At, e.Seq), uint32(len(e.ID)), nil)
}
