package postgres

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/internal/recordcodec"
	"github.com/worklog/worklog/projection"
)

// Verify's states on disk (issue 24 §5: 100,000 tasks verified within 64 MiB of heap).
//
// Both states Verify compares — the fold of the log and what the tables store — are kept in
// one scratch Pebble database (in a temporary directory, removed afterwards; in memory for a
// log of at most spillInMemoryEvents): each under its
// own side byte (sideFold, sideStored), each category of entry under its own byte, keys
// encoded so that Pebble's order is the comparison's. The comparison then walks both sides of
// a category together in key order (mergeSide), holding one entry of each. The records of
// the stored side are not copied: the tables' scan, in id order, is merged with the fold's
// records as it reads them (foldRecords).
//
// What stays in the Go heap is what is O(kinds, schedules, policies): the counts, the
// schedules and the kind policies (a projection.Mem each side, compared with Mem.Diff), and
// the last sequence. Pebble's memtable and block cache are allocated outside the Go heap
// (cgo), bounded by spillMemTable and spillCache; a write batch is committed every
// spillBatchBytes.

const (
	sideFold   = 'F'
	sideStored = 'S'

	catTask    = 't' // id → the record, recordcodec's encoding (fold side only)
	catWake    = 'w'
	catTaskKey = 'k' // session, key → task id
	catWakeKey = 'K'
	catIndex   = 'i' // index, partition, priority (descending), at, seq → id
	catSession = 's' // session, submit seq → task id
	catPrune   = 'p' // at, seq → id and whether it is a wake

	spillMemTable   = 16 << 20
	spillCache      = 8 << 20
	spillBatchBytes = 1 << 20
)

// spillDB is the scratch database and its current write batch (indexed: the fold reads its
// own writes).
type spillDB struct {
	db  *pebble.DB
	b   *pebble.Batch
	dir string // the temporary directory; "" in memory
}

// spillInMemoryEvents is the log length up to which the scratch database lives in memory
// (vfs.NewMem, in the Go heap: a few MiB at most for this many events, well inside the 64 MiB
// bound) rather than in a temporary directory: a small queue's Verify then creates, syncs
// and removes no files.
const spillInMemoryEvents = 10_000

// openSpill opens the scratch database for a log whose last sequence is last.
func openSpill(last int64) (*spillDB, error) {
	fs, dir := vfs.FS(vfs.NewMem()), "verify"
	if last > spillInMemoryEvents {
		d, err := os.MkdirTemp("", "worklog-pg-verify-")
		if err != nil {
			return nil, fmt.Errorf("postgres: verify scratch directory: %w", err)
		}
		fs, dir = vfs.Default, d
	}
	cache := pebble.NewCache(spillCache)
	defer cache.Unref()
	db, err := pebble.Open(dir, &pebble.Options{FS: fs, MemTableSize: spillMemTable, DisableWAL: true, Cache: cache, Logger: spillLogger{pebble.DefaultLogger}})
	if err != nil {
		if fs == vfs.Default {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("postgres: verify scratch store: %w", err)
	}
	s := &spillDB{db: db, b: db.NewIndexedBatch()}
	if fs == vfs.Default {
		s.dir = dir
	}
	return s, nil
}

// spillLogger keeps the scratch store's informational messages ("Found 0 WALs", flushes and
// compactions) off the host's stderr: Verify's output is its findings, and replay's tests
// compare it between backends. Errors and fatal errors go where Pebble's default sends them.
type spillLogger struct{ pebble.Logger }

func (spillLogger) Infof(string, ...any) {}

// close closes the database and removes its directory.
func (s *spillDB) close() error {
	err := errors.Join(s.b.Close(), s.db.Close())
	if s.dir == "" {
		return err // in memory
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

// flush commits the batch (without sync: the database is thrown away) and starts another.
func (s *spillDB) flush() error {
	if err := s.b.Commit(pebble.NoSync); err != nil {
		return err
	}
	if err := s.b.Close(); err != nil {
		return err
	}
	s.b = s.db.NewIndexedBatch()
	return nil
}

func (s *spillDB) set(k, v []byte) error { return s.full(s.b.Set(k, v, nil)) }

func (s *spillDB) delete(k []byte) error { return s.full(s.b.Delete(k, nil)) }

// full commits the batch once it holds spillBatchBytes, after a write that returned err.
func (s *spillDB) full(err error) error {
	if err == nil && s.b.Len() >= spillBatchBytes {
		err = s.flush()
	}
	return err
}

// get returns a copy of k's value, or nil when there is none.
func (s *spillDB) get(k []byte) ([]byte, error) {
	v, closer, err := s.b.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append([]byte{}, v...), nil
}

// scan calls fn with every key under prefix, in order, and its value (valid during the
// call), until fn returns false. It reads the database after committing the batch, so fn may
// write (what it writes is not seen by the scan).
func (s *spillDB) scan(prefix []byte, fn func(k, v []byte) (bool, error)) (err error) {
	if !s.b.Empty() {
		if err := s.flush(); err != nil {
			return err
		}
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if more, err := fn(it.Key(), v); err != nil || !more {
			return err
		}
	}
	return it.Error()
}

// prefixEnd is the least key above every key that starts with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte{}, p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Key encoding: strings length-prefixed (any byte may occur in them), integers big-endian,
// signed ones with the sign bit flipped so that they sort as numbers.

func appendStr(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}
func appendU64(b []byte, u uint64) []byte { return binary.BigEndian.AppendUint64(b, u) }
func appendI64(b []byte, i int64) []byte  { return appendU64(b, uint64(i)^(1<<63)) }

type keyReader struct {
	b   []byte
	bad bool
}

func (r *keyReader) str() string {
	n, k := binary.Uvarint(r.b)
	if k <= 0 || uint64(len(r.b)-k) < n {
		r.bad = true
		return ""
	}
	s := string(r.b[k : k+int(n)])
	r.b = r.b[k+int(n):]
	return s
}

func (r *keyReader) u64() uint64 {
	if len(r.b) < 8 {
		r.bad = true
		return 0
	}
	u := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return u
}

func (r *keyReader) i64() int64 { return int64(r.u64() ^ (1 << 63)) }

// spillState is one side of the scratch database as a projection.State (and the retention
// index's PruneIndexer): the records, keys, index entries, session lists, the retention index
// and the kind lease index on disk; the rest in the embedded Mem, whose indexes are kept up to
// date as they change (never deferred) and never see a record.
type spillState struct {
	*projection.Mem
	db   *spillDB
	side byte
}

func newSpillState(db *spillDB, side byte) *spillState {
	return &spillState{Mem: projection.NewMem(), db: db, side: side}
}

var _ interface {
	projection.State
	projection.PruneIndexer
} = (*spillState)(nil)

func (s *spillState) key(cat byte) []byte { return []byte{s.side, cat} }

func (s *spillState) recordKey(cat byte, id string) []byte { return append(s.key(cat), id...) }

// The records are kept in the stored encoding (recordcodec, lossless: JSON would replace a
// string's invalid UTF-8).
func (s *spillState) getRecord(cat byte, id string) (any, error) {
	k := s.recordKey(cat, id)
	v, err := s.db.get(k)
	if err != nil || v == nil {
		return nil, err
	}
	if cat == catTask {
		return recordcodec.DecodeTask(k, v)
	}
	return recordcodec.DecodeWake(k, v)
}

func (s *spillState) putRecord(cat byte, id string, r any) error {
	var v []byte
	switch r := r.(type) {
	case *projection.Task:
		v = recordcodec.AppendTask(nil, r)
	case *projection.Wake:
		v = recordcodec.AppendWake(nil, r)
	}
	return s.db.set(s.recordKey(cat, id), v)
}

func (s *spillState) Task(id string) (*projection.Task, error) {
	r, err := s.getRecord(catTask, id)
	if r == nil || err != nil {
		return nil, err
	}
	return r.(*projection.Task), nil
}
func (s *spillState) Wake(id string) (*projection.Wake, error) {
	r, err := s.getRecord(catWake, id)
	if r == nil || err != nil {
		return nil, err
	}
	return r.(*projection.Wake), nil
}
func (s *spillState) EditTask(id string) (*projection.Task, error) { return s.Task(id) }
func (s *spillState) EditWake(id string) (*projection.Wake, error) { return s.Wake(id) }
func (s *spillState) TaskEdited(t *projection.Task) error          { return s.PutTask(t) }
func (s *spillState) WakeEdited(w *projection.Wake) error          { return s.PutWake(w) }
func (s *spillState) NewTask() *projection.Task                    { return &projection.Task{} }
func (s *spillState) NewWake() *projection.Wake                    { return &projection.Wake{} }
func (s *spillState) PutTask(t *projection.Task) error             { return s.putRecord(catTask, t.ID, t) }
func (s *spillState) PutWake(w *projection.Wake) error             { return s.putRecord(catWake, w.ID, w) }

func (s *spillState) scopedKey(cat byte, session, key string) []byte {
	return appendStr(appendStr(s.key(cat), session), key)
}

func (s *spillState) TaskKey(session, key string) (string, error) {
	v, err := s.db.get(s.scopedKey(catTaskKey, session, key))
	return string(v), err
}
func (s *spillState) WakeKey(session, key string) (string, error) {
	v, err := s.db.get(s.scopedKey(catWakeKey, session, key))
	return string(v), err
}
func (s *spillState) PutTaskKey(session, key, id string) error {
	return s.db.set(s.scopedKey(catTaskKey, session, key), []byte(id))
}
func (s *spillState) PutWakeKey(session, key, id string) error {
	return s.db.set(s.scopedKey(catWakeKey, session, key), []byte(id))
}

// indexKey is an entry's key in index ix's partition part: priority descending, then at and
// seq ascending (claim order, IndexEntry.Less); at most one entry per key, as in Mem's tree.
func (s *spillState) indexKey(ix projection.Index, part string, e projection.IndexEntry) []byte {
	k := appendStr(append(s.key(catIndex), byte(ix)), part)
	return appendU64(appendI64(appendI64(k, -1-e.Pri), e.At), e.Seq)
}

func (s *spillState) PutIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	return s.db.set(s.indexKey(ix, part, e), []byte(e.ID))
}
func (s *spillState) DeleteIndex(ix projection.Index, part string, e projection.IndexEntry) error {
	return s.db.delete(s.indexKey(ix, part, e))
}

func (s *spillState) ScanIndex(ix projection.Index, part string, from, to int64, fn func(projection.IndexEntry) bool) error {
	p := appendStr(append(s.key(catIndex), byte(ix)), part)
	return s.db.scan(p, func(k, v []byte) (bool, error) {
		r := keyReader{b: k[len(p):]}
		e := projection.IndexEntry{Pri: -1 - r.i64(), At: r.i64(), Seq: r.u64(), ID: string(v)}
		if r.bad {
			return false, fmt.Errorf("postgres: verify scratch index key %x", k)
		}
		if e.At < from || e.At > to {
			return true, nil // a filter, not a seek: Verify scans whole partitions
		}
		return fn(e), nil
	})
}

func (s *spillState) sessionKey(session string, seq uint64) []byte {
	return appendU64(appendStr(s.key(catSession), session), seq)
}

func (s *spillState) PutSessionTask(session string, seq uint64, id string) error {
	return s.db.set(s.sessionKey(session, seq), []byte(id))
}

func (s *spillState) ScanSessionTasks(session string, after uint64, fn func(uint64, string) bool) error {
	p := appendStr(s.key(catSession), session)
	return s.db.scan(p, func(k, v []byte) (bool, error) {
		seq := binary.BigEndian.Uint64(k[len(p):])
		if seq <= after {
			return true, nil
		}
		return fn(seq, string(v)), nil
	})
}

func (s *spillState) pruneKey(e projection.PruneEntry) []byte {
	return appendU64(appendI64(s.key(catPrune), e.At), e.Seq)
}

func (s *spillState) PutPrunable(e projection.PruneEntry) error {
	v := []byte(e.ID)
	if e.Wake {
		v = append(v, 1)
	} else {
		v = append(v, 0)
	}
	return s.db.set(s.pruneKey(e), v)
}

func (s *spillState) DeletePrunable(e projection.PruneEntry) error {
	return s.db.delete(s.pruneKey(e))
}

// eachTask calls fn with every task record of this side, in id order.
func (s *spillState) eachTask(fn func(*projection.Task) error) error {
	return s.db.scan(s.key(catTask), func(k, v []byte) (bool, error) {
		t, err := recordcodec.DecodeTask(k, v)
		if err != nil {
			return false, err
		}
		return true, fn(t)
	})
}

// diffSpill compares the stored side with the fold in the order Mem.DiffStored does (stored
// on the left, "stored vs rebuilt"), saying what it says: the last sequence, the records
// (tasks and wakes, the stored ones read by their scans, in id order), the keys, the index
// entries, the counts and the session lists, the schedules and kind policies with their lease
// index, the retention index.
func diffSpill(stored, fold *spillState, tasks func(fn func(*projection.Task) error) error, wakes func(fn func(*projection.Wake) error) error) ([]string, error) {
	var out []string
	small := stored.Mem.Diff(fold.Mem) // no record, key or index entry: the rest
	rest := small[:0:0]
	for _, d := range small {
		if strings.HasPrefix(d, "last_seq:") {
			out = append(out, d)
		} else {
			rest = append(rest, d)
		}
	}
	if err := fold.db.flush(); err != nil {
		return nil, err
	}
	t, err := foldRecords(fold, "task", catTask, func(t *projection.Task) string { return t.ID }, recordcodec.DecodeTask, tasks)
	if err != nil {
		return nil, err
	}
	w, err := foldRecords(fold, "wake", catWake, func(w *projection.Wake) string { return w.ID }, recordcodec.DecodeWake, wakes)
	if err != nil {
		return nil, err
	}
	out = append(append(out, t...), w...)
	for _, c := range []struct {
		cat  byte
		what string
	}{{catTaskKey, "task key"}, {catWakeKey, "wake key"}} {
		err := mergeSide(stored, fold, c.cat, func(k, a, b []byte) {
			r := keyReader{b: k}
			session, key := r.str(), r.str()
			if a == nil {
				out = append(out, fmt.Sprintf("%s (%q, %q): missing on the left, right has %s", c.what, session, key, b))
			} else if !bytes.Equal(a, b) {
				out = append(out, fmt.Sprintf("%s (%q, %q): %s vs %q", c.what, session, key, a, b))
			}
		})
		if err != nil {
			return nil, err
		}
	}
	// An index partition's entries one side lacks, those of the left first, as Mem's diffIndex.
	var left, right []string
	var lastPart []byte
	endPart := func() {
		out = append(append(out, right...), left...)
		left, right = left[:0], right[:0]
	}
	err = mergeSide(stored, fold, catIndex, func(k, a, b []byte) {
		if len(k) == 0 {
			return
		}
		r := keyReader{b: k[1:]}
		ix, part := projection.Index(k[0]), r.str()
		if partLen := len(k) - len(r.b); !bytes.Equal(k[:partLen], lastPart) {
			endPart()
			lastPart = append(lastPart[:0], k[:partLen]...)
		}
		r.i64() // the priority: the messages name (at, seq, id), as Mem's do
		at, seq := r.i64(), r.u64()
		name := ix.Describe(part)
		if a != nil && !bytes.Equal(a, b) {
			right = append(right, fmt.Sprintf("%s (%d, %d, %s): missing on the right", name, at, seq, a))
		}
		if b != nil && !bytes.Equal(a, b) {
			left = append(left, fmt.Sprintf("%s (%d, %d, %s): missing on the left", name, at, seq, b))
		}
	})
	if err != nil {
		return nil, err
	}
	endPart()
	out = append(out, rest...) // counts, schedules, kind policies
	err = mergeSide(stored, fold, catSession, func(k, a, b []byte) {
		r := keyReader{b: k}
		session, seq := r.str(), r.u64()
		name := fmt.Sprintf("task list of session %q", session)
		switch {
		case b == nil:
			out = append(out, fmt.Sprintf("%s (%d, %s): missing on the right", name, seq, a))
		case a == nil:
			out = append(out, fmt.Sprintf("%s (%d, %s): missing on the left", name, seq, b))
		case !bytes.Equal(a, b):
			out = append(out, fmt.Sprintf("%s seq %d: %s vs %s", name, seq, a, b))
		}
	})
	if err != nil {
		return nil, err
	}
	err = mergeSide(stored, fold, catPrune, func(k, a, b []byte) {
		r := keyReader{b: k}
		at, seq := r.i64(), r.u64()
		id := func(v []byte) []byte { return v[:max(len(v)-1, 0)] }
		if a != nil && !bytes.Equal(a, b) {
			right = append(right, fmt.Sprintf("retention index (%d, %d, %s): missing on the right", at, seq, id(a)))
		}
		if b != nil && !bytes.Equal(a, b) {
			left = append(left, fmt.Sprintf("retention index (%d, %d, %s): missing on the left", at, seq, id(b)))
		}
	})
	if err != nil {
		return nil, err
	}
	endPart()
	return out, nil
}

// mergeSide walks category cat of both sides in key order and calls fn with each key (after
// the side and category bytes) and its value on each side, nil where a side has none.
func mergeSide(a, b *spillState, cat byte, fn func(k, va, vb []byte)) (err error) {
	if err := a.db.flush(); err != nil {
		return err
	}
	db := a.db.db
	open := func(s *spillState) (*pebble.Iterator, error) {
		p := s.key(cat)
		return db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	}
	x, err := open(a)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, x.Close()) }()
	y, err := open(b)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, y.Close()) }()
	okX, okY := x.First(), y.First()
	for okX || okY {
		var c int
		switch {
		case !okX:
			c = 1
		case !okY:
			c = -1
		default:
			c = bytes.Compare(x.Key()[2:], y.Key()[2:])
		}
		switch {
		case c < 0:
			fn(x.Key()[2:], present(x.Value()), nil)
			okX = x.Next()
		case c > 0:
			fn(y.Key()[2:], nil, present(y.Value()))
			okY = y.Next()
		default:
			fn(x.Key()[2:], present(x.Value()), present(y.Value()))
			okX, okY = x.Next(), y.Next()
		}
	}
	return errors.Join(x.Error(), y.Error())
}

// present makes an empty value present (nil means absent in mergeSide).
func present(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

// foldRecords merges the stored records, read one at a time in id order by each, with the
// fold's in id order: Mem.DiffStored's record comparison with both sides streamed.
func foldRecords[T any](fold *spillState, what string, cat byte, id func(*T) string, decode func(k, v []byte) (*T, error), each func(func(*T) error) error) (_ []string, err error) {
	p := fold.key(cat)
	it, err := fold.db.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	var out []string
	ok := it.First()
	mine := func() (*T, error) {
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		return decode(it.Key(), v)
	}
	err = each(func(x *T) error {
		xid := id(x)
		for ; ok && string(it.Key()[2:]) < xid; ok = it.Next() {
			out = append(out, fmt.Sprintf("%s %s: missing on the left", what, it.Key()[2:]))
		}
		if ok && string(it.Key()[2:]) == xid {
			r, err := mine()
			if err != nil {
				return err
			}
			out = append(out, projection.DiffRecords(what+" "+xid, x, r)...)
			ok = it.Next()
		} else {
			out = append(out, fmt.Sprintf("%s %s: missing on the right", what, xid))
		}
		return nil
	})
	for ; err == nil && ok; ok = it.Next() {
		out = append(out, fmt.Sprintf("%s %s: missing on the left", what, it.Key()[2:]))
	}
	return out, errors.Join(err, it.Error())
}
