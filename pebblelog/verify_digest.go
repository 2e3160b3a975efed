package pebblelog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"io"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
)

// Verify's fast path: fold the log in memory and compare digests.
//
// The stored projection is a set of keys and values, and so is a rebuild. Two sets are equal
// when, for each keyspace (a key's first byte), the sums modulo 2^64 of two keyed hashes of
// their entries are equal, except with a probability of about 2^-128 for a given pair of
// differing sets (the hashes are keyed with seeds drawn for the one Verify, which the store's
// content cannot depend on). The sums need neither side sorted: the stored side is one pass
// over its keyspaces, in parallel with the fold; the session, subject and blob indexes are
// summed from the log as it is read, no rebuilt key of theirs kept; the records are the
// fold's record cache's, which evicts none; the keys the fold reads back are kept whole
// (digestKeys) and every other key as hashes only (hashedKeys); all are summed once the fold
// ends. A digest shows that a difference exists, not where: Verify then runs the exact path,
// which lists it.

// maxDigestFoldBytes bounds the fast path's memory, as the record cache, digestKeys and
// hashedKeys estimate theirs; a rebuild that outgrows it goes to the exact path. The
// estimate is about 720 bytes a task of internal/storegen's mix (a record, its session list
// and retention entries, a quarter of a wake), so this is about 370,000 such tasks; the Go
// heap peaked at about 2.4 times the estimate (BenchmarkVerify).
const maxDigestFoldBytes = 256 << 20

// digestEntryOverhead approximates a map entry's cost beyond its key's and value's bytes: the
// slot, the string and slice headers, the allocations' rounding.
const digestEntryOverhead = 64

// errFoldNeedsScratch: the fast path's fold needed what it does not keep (an ordered scan of
// the rebuilt state, a point read of a key kept only hashed), wrote what it does not take (an
// operation other than a set or a delete, a record deleted), met two keys with one hash half,
// or outgrew maxDigestFoldBytes. Verify then takes the exact path.
var errFoldNeedsScratch = errors.New("pebblelog: the verify fold needs the scratch store")

// keyspaceDigest is a keyspace's digest: the sums of the two hashes of its entries.
type keyspaceDigest struct{ a, b uint64 }

// digests holds a digest for each key prefix byte.
type digests [256]keyspaceDigest

// entryHasher hashes a key and value into a digest, with the seeds of one Verify.
type entryHasher struct {
	seedA, seedB maphash.Seed
	buf          []byte
}

// entry sets x to the hashes of the entry (k, v): of the key's length first, so that no two
// entries hash the same bytes.
func (h *entryHasher) entry(x *keyspaceDigest, k, v []byte) {
	h.buf = binary.AppendUvarint(h.buf[:0], uint64(len(k)))
	h.buf = append(append(h.buf, k...), v...)
	x.a = maphash.Bytes(h.seedA, h.buf)
	x.b = maphash.Bytes(h.seedB, h.buf)
}

// add adds the entry (k, v) to its keyspace's digest in d.
func (h *entryHasher) add(d *digests, k, v []byte) {
	if len(k) == 0 {
		return
	}
	var x keyspaceDigest
	h.entry(&x, k, v)
	d[k[0]].a += x.a
	d[k[0]].b += x.b
}

// keyHash is the keyed 128-bit hash that stands for key k in hashedKeys; it is not an
// entry's hash (there is no value, and no length).
func (h *entryHasher) keyHash(k []byte) [2]uint64 {
	return [2]uint64{maphash.Bytes(h.seedA, k), maphash.Bytes(h.seedB, k)}
}

// digestKeys is what the fold reads back of its rebuild: the keys and values of the keyspaces
// it reads by point reads (readable: the task and wake keys, the schedules). It is the
// pebble.Reader of the fold's writer. The records are the fold's record cache's; every other
// rebuilt key is in hashedKeys, which the fold never reads: a read of one, or any scan, is a
// fold the fast path does not do (errFoldNeedsScratch).
type digestKeys struct {
	m     map[string][]byte
	bytes int // the map's estimated size: see digestEntryOverhead
}

// readable says whether the fold reads keys of prefix p by point reads: digestKeys keeps
// their values.
func readable(p byte) bool {
	return p == prefixTaskKey || p == prefixWakeKey || p == prefixSchedule
}

func (m *digestKeys) Get(k []byte) ([]byte, io.Closer, error) {
	if len(k) == 0 || !readable(k[0]) {
		return nil, nil, errFoldNeedsScratch
	}
	v, ok := m.m[string(k)]
	if !ok {
		return nil, nil, pebble.ErrNotFound
	}
	return v, noClose{}, nil
}

// noClose is the closer of a value the map owns.
type noClose struct{}

func (noClose) Close() error { return nil }

func (m *digestKeys) NewIter(*pebble.IterOptions) (*pebble.Iterator, error) {
	return nil, errFoldNeedsScratch
}

func (m *digestKeys) NewIterWithContext(context.Context, *pebble.IterOptions) (*pebble.Iterator, error) {
	return nil, errFoldNeedsScratch
}

func (m *digestKeys) Close() error { return nil }

// batchOps calls fn with b's operations from byte offset from of its entries, in order, and
// returns the offset past the last. An operation other than a set or a delete, or of an empty
// key, is a fold the fast path does not do.
func batchOps(b *pebble.Batch, from int, fn func(set bool, k, v []byte) error) (int, error) {
	r := b.Reader()
	all := len(r)
	r = r[from:]
	for {
		kind, k, v, ok, err := r.Next()
		if err != nil {
			return 0, err
		}
		if !ok {
			return all - len(r), nil
		}
		set := kind == pebble.InternalKeyKindSet
		if len(k) == 0 || !set && kind != pebble.InternalKeyKindDelete && kind != pebble.InternalKeyKindSingleDelete &&
			kind != pebble.InternalKeyKindDeleteSized {
			return 0, errFoldNeedsScratch
		}
		if err := fn(set, k, v); err != nil {
			return 0, err
		}
	}
}

// applyReadable applies an operation of b to the map when its key is readable, and checks
// that one on a record is a set: the records are the fold's record cache's (digestSink), and
// nothing else of the fold writes one.
func (m *digestKeys) applyReadable(set bool, k, v []byte) error {
	switch {
	case k[0] == prefixTask || k[0] == prefixWake:
		if !set {
			return errFoldNeedsScratch
		}
	case readable(k[0]):
		old, in := m.m[string(k)]
		if in {
			m.bytes -= len(k) + len(old) + digestEntryOverhead
		}
		if set {
			m.bytes += len(k) + len(v) + digestEntryOverhead
			m.m[string(k)] = bytes.Clone(v)
		} else if in {
			delete(m.m, string(k))
		}
	}
	return nil
}

// hashedKeys holds every rebuilt key the fold does not read back (not a record, not
// readable), as hashes only, in a map with no pointers: the keyed hash of the key (keyHash)
// and the hashes of its entry. Its own goroutine applies the fold's batches to it.
type hashedKeys struct {
	h     entryHasher
	m     map[uint64]hashedEntry // by the first half of the key's hash
	bytes atomic.Int64           // the map's estimated size: see hashedEntryBytes
}

// hashedEntry is a key's keyspace, the second half of its key's hash (two keys whose first
// halves are equal but not their second are a fold the fast path does not do), and the
// hashes of its entry.
type hashedEntry struct {
	prefix byte
	key    uint64
	d      keyspaceDigest
}

// hashedEntryBytes approximates a hashed entry's cost in its map.
const hashedEntryBytes = 56

func (hk *hashedKeys) apply(set bool, k, v []byte) error {
	if k[0] == prefixTask || k[0] == prefixWake || readable(k[0]) {
		return nil
	}
	id := hk.h.keyHash(k)
	n := len(hk.m)
	if old, in := hk.m[id[0]]; in && old.key != id[1] {
		return errFoldNeedsScratch // two keys, one first half: about n²/2⁶⁵ for n keys
	}
	if set {
		e := hashedEntry{prefix: k[0], key: id[1]}
		hk.h.entry(&e.d, k, v)
		hk.m[id[0]] = e
	} else {
		delete(hk.m, id[0])
	}
	hk.bytes.Add(int64(len(hk.m)-n) * hashedEntryBytes)
	return nil
}

// pendingKeys is what the fold's writer reads through (writer.reader): its own batch's writes
// over digestKeys. A point read first applies the batch's readable operations not yet applied.
type pendingKeys struct{ k *digestSink }

func (p pendingKeys) Get(key []byte) ([]byte, io.Closer, error) {
	if err := p.k.applyReadable(); err != nil {
		return nil, nil, err
	}
	return p.k.keys.Get(key)
}

func (p pendingKeys) NewIter(o *pebble.IterOptions) (*pebble.Iterator, error) {
	return p.k.keys.NewIter(o)
}

func (p pendingKeys) NewIterWithContext(ctx context.Context, o *pebble.IterOptions) (*pebble.Iterator, error) {
	return p.k.keys.NewIterWithContext(ctx, o)
}

func (p pendingKeys) Close() error { return nil }

// digestSink folds into digestKeys, the record cache and hashedKeys, one batch a chunk, and
// sums the keys derived from the log alone into logSide. A chunk's batch goes to hashedKeys's
// goroutine (toHash) while the fold goes on with the next, so the fold and the hashing share
// the cores; the batches come back emptied (free).
type digestSink struct {
	fold    *foldState
	keys    *digestKeys
	b       *pebble.Batch
	applied int // the bytes of b's entries applied to keys
	h       entryHasher
	logSide digests
	kbuf    []byte
	events  int // events in the current chunk

	hashed    *hashedKeys
	hashErr   error // the hashing goroutine's; read after hashDone
	toHash    chan *pebble.Batch
	free      chan *pebble.Batch
	hashDone  chan struct{}
	closeHash sync.Once
}

func newDigestSink(seedA, seedB maphash.Seed) *digestSink {
	k := &digestSink{
		// The record cache holds every record (digestKeys holds none).
		fold:     newFoldState(math.MaxInt),
		keys:     &digestKeys{m: map[string][]byte{}},
		b:        new(pebble.Batch),
		h:        entryHasher{seedA: seedA, seedB: seedB},
		hashed:   &hashedKeys{h: entryHasher{seedA: seedA, seedB: seedB}, m: map[uint64]hashedEntry{}},
		toHash:   make(chan *pebble.Batch, 2),
		free:     make(chan *pebble.Batch, 3),
		hashDone: make(chan struct{}),
	}
	go func() {
		defer close(k.hashDone)
		for b := range k.toHash {
			if k.hashErr == nil {
				_, k.hashErr = batchOps(b, 0, k.hashed.apply)
			}
			b.Reset()
			select {
			case k.free <- b:
			default:
			}
		}
	}()
	return k
}

// stopHashing ends the hashing goroutine once it has applied every batch sent, and returns
// its error.
func (k *digestSink) stopHashing() error {
	k.closeHash.Do(func() { close(k.toHash) })
	<-k.hashDone
	return k.hashErr
}

func (k *digestSink) applyReadable() (err error) {
	k.applied, err = batchOps(k.b, k.applied, k.keys.applyReadable)
	return err
}

func (k *digestSink) writer(lastSeq uint64) *writer {
	f := k.fold
	k.events = 0
	return &writer{reader: reader{r: pendingKeys{k}}, committed: reader{r: k.keys}, b: k.b, lastSeq: lastSeq,
		cache: f.cache, counts: f.counts, maxIDs: f.ids, policies: f.policies}
}

func (k *digestSink) logKeys(it *pebble.Iterator, ev events.Event, seq uint64) error {
	k.events++
	h := ev.Head()
	k.kbuf = append(binary.AppendUvarint(append(k.kbuf[:0], prefixSession), uint64(len(h.SessionID))), h.SessionID...)
	k.kbuf = binary.BigEndian.AppendUint64(k.kbuf, seq) // sessionEventKey
	k.h.add(&k.logSide, k.kbuf, nil)
	k.kbuf = appendSubjectEventKey(k.kbuf[:0], ev, seq)
	k.h.add(&k.logSide, k.kbuf, nil)
	v, err := it.ValueAndErr()
	if err != nil || !isBlobForm(v) {
		return err
	}
	refs, _, err := parseBlobForm(v, seq)
	if err != nil {
		return err
	}
	taskID, wakeID := ev.Subject()
	for _, r := range refs {
		k.h.add(&k.logSide, blobIndexKey(taskID+wakeID, r.ref.name), nil)
	}
	return nil
}

func (k *digestSink) full(*writer) bool { return k.events >= 1024 }

func (k *digestSink) commit(w *writer) error {
	if err := k.applyReadable(); err != nil {
		return err
	}
	k.fold.merge(w)
	k.toHash <- k.b
	select {
	case k.b = <-k.free:
	default:
		k.b = new(pebble.Batch)
	}
	k.applied = 0
	if k.keys.bytes+k.fold.cache.bytes+int(k.hashed.bytes.Load()) > maxDigestFoldBytes {
		return errFoldNeedsScratch
	}
	return nil
}

// digest adds the rebuilt projection to d: digestKeys's, hashedKeys's, and the cache's
// records. Call it after stopHashing.
func (k *digestSink) digest(d *digests) {
	for key, v := range k.keys.m {
		k.h.add(d, []byte(key), v)
	}
	for _, e := range k.hashed.m {
		d[e.prefix].a += e.d.a
		d[e.prefix].b += e.d.b
	}
	var key, buf []byte
	for id, t := range k.fold.cache.tasks {
		key = append(append(key[:0], prefixTask), id...)
		buf = appendTask(buf[:0], recordTask(&t)) // as writer.writeRecords
		k.h.add(d, key, buf)
	}
	for id, x := range k.fold.cache.wakes {
		key = append(append(key[:0], prefixWake), id...)
		buf = appendWake(buf[:0], recordWake(&x))
		k.h.add(d, key, buf)
	}
}

// verifyByDigest is Verify's fast path: sound is true when the log is whole and decodes, and
// the digest of every stored projection keyspace equals the rebuild's. False says nothing
// more: a problem, or a fold the fast path cannot do; Verify then takes the exact path.
func (s *Store) verifyByDigest(ctx context.Context, snap *pebble.Snapshot, vo VerifyOptions) (sound bool, err error) {
	storedLast, err := reader{snap, s.blobs}.LastSeq()
	if err != nil {
		return false, nil
	}
	seedA, seedB := maphash.MakeSeed(), maphash.MakeSeed()

	// The stored side, in parallel with the fold. It reads snap: Verify closes snap only
	// after it ends.
	var stored digests
	var storedErr error
	storedDone := make(chan struct{})
	go func() {
		defer close(storedDone)
		storedErr = digestStored(ctx, snap, seedA, seedB, &stored)
	}()
	defer func() { <-storedDone }()

	sink := newDigestSink(seedA, seedB)
	defer sink.stopHashing()
	problem := false
	add := func(string, ...any) bool { problem = true; return false }
	if err := s.rebuild(ctx, snap, sink, storedLast, vo, add); err != nil {
		if errors.Is(err, errFoldNeedsScratch) {
			return false, nil
		}
		return false, err
	}
	if problem {
		return false, nil
	}
	if err := sink.stopHashing(); err != nil {
		if errors.Is(err, errFoldNeedsScratch) {
			return false, nil
		}
		return false, err
	}
	rebuilt := sink.logSide
	sink.digest(&rebuilt)
	sink.keys, sink.hashed, sink.fold = nil, nil, nil // they may be large: let them go before the exact path, if any, starts
	<-storedDone
	if storedErr != nil {
		return false, storedErr
	}
	return rebuilt == stored, nil
}

// digestStored sums the stored projection's keyspaces and last sequence into d, the keyspaces
// in parallel (one goroutine a core).
func digestStored(ctx context.Context, snap *pebble.Snapshot, seedA, seedB maphash.Seed, d *digests) error {
	type keyRange struct{ lo, hi []byte }
	ranges := make([]keyRange, 0, len(projectionPrefixes)+1)
	for _, p := range projectionPrefixes {
		ranges = append(ranges, keyRange{[]byte{p}, []byte{p + 1}})
	}
	ranges = append(ranges, keyRange{keyLastSeq, append(append([]byte(nil), keyLastSeq...), 0)})
	next := make(chan keyRange, len(ranges))
	for _, r := range ranges {
		next <- r
	}
	close(next)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range min(runtime.GOMAXPROCS(0), len(ranges)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := entryHasher{seedA: seedA, seedB: seedB}
			var own digests
			for r := range next {
				if err := digestRange(ctx, snap, r.lo, r.hi, &h, &own); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
			mu.Lock()
			for i := range d {
				d[i].a += own[i].a
				d[i].b += own[i].b
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// digestRange sums the stored keys of [lo, hi) into d. It stops when ctx is done (Verify
// returns once it has).
func digestRange(ctx context.Context, snap *pebble.Snapshot, lo, hi []byte, h *entryHasher, d *digests) (err error) {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		h.add(d, it.Key(), v)
	}
	return it.Error()
}
