package pebblelog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/internal/source"
	"github.com/worklog/worklog/projection"
)

// Store is an open worklog store.
type Store struct {
	dir  string
	fs   vfs.FS
	opts Options
	db   *pebble.DB
	lock *locks // WORKLOG.lock and Pebble's LOCK, released after the database is closed

	reqs    chan *request
	done    chan struct{} // closed when the writer exits
	closeMu sync.RWMutex  // held for reading by every call in flight; Close takes it for writing
	closed  bool

	fh   *failures // the failure state and Pebble's handlers (failure.go)
	comp compactor // compactions of pruned spans (compact.go)

	blobs *blobStore // the blob files of large values (format 4: blob.go)
	// dcache answers ViewDurable's repeated reads (durable_cache.go); nil when
	// Options.RecordCacheSize disables caches. The writer drops what each batch changes.
	dcache *durableCache
	wit    *syncWitness // the sync witness (witness.go); nil read-only and with NoSync

	lastSeq  uint64                            // owned by the writer goroutine after Open
	maxIDs   *maxIDs                           // read at Open, then owned by the writer goroutine
	counts   map[countID]int64                 // read at Open, then owned by the writer goroutine
	policies map[string]*projection.KindPolicy // read at Open, then owned by the writer goroutine
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// LastSeq returns the sequence of the last committed event.
func (s *Store) LastSeq(ctx context.Context) (_ uint64, err error) {
	if err := s.enterCtx(ctx); err != nil {
		return 0, err
	}
	defer s.leave(&err)
	return reader{s.db, s.blobs}.LastSeq()
}

// enterCtx is enter for a read that takes a context: a done context is refused first.
func (s *Store) enterCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.enter()
}

// enter registers a call in flight; the caller must s.closeMu.RUnlock() when done. A failed
// store refuses every call with its failure.
func (s *Store) enter() error {
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	if err := s.fh.err(); err != nil {
		s.closeMu.RUnlock()
		return err
	}
	return nil
}

// Close stops the writer after the commands already queued, syncs, and closes the database.
// Closing twice is fine. If the store's directory or its WORKLOG.lock was removed or
// replaced while it was open, Close returns that failure (ErrStoreFailed). On a failed store Close returns within Options.StallTimeout: if
// Pebble is still blocked then (a write stall on a full disk, a goroutine parked after a
// fatal error), the database is left open and closed in the background once Pebble returns,
// and Close returns an error saying so.
func (s *Store) Close() error {
	s.comp.stop() // before the lock: a running compaction holds it for reading
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.reqs != nil {
		close(s.reqs)
		// The writer, and every call that can rotate the WAL (pebblecall.go), must have
		// returned before the database is closed.
		idle := s.fh.idle(s.done)
		if !s.fh.waitWriter(idle) {
			return s.fh.abandon(idle, func() { s.db.Close(); s.fh.releaseDir(); s.lock.Close() })
		}
		if s.opts.NoSync && s.fh.err() == nil {
			err = s.fh.call("a WAL sync", func() error { return s.db.LogData(nil, pebble.Sync) })
			if s.fh.parked.Load() || s.fh.calls.Load() != 0 {
				return s.fh.abandon(s.fh.idle(s.done), func() { s.db.Close(); s.fh.releaseDir(); s.lock.Close() })
			}
		}
	}
	err = errors.Join(err, s.db.Close())
	// Pebble closes "cleanly" into unlinked files when the directory went: never a nil.
	err = errors.Join(err, s.fh.closeCheck())
	s.fh.releaseDir()
	err = errors.Join(err, s.recordCleanClose(err), s.lock.Close())
	return err
}

// View runs fn against the committed projection.
func (s *Store) View(ctx context.Context, fn func(projection.Reader) error) (err error) {
	if err := s.enterCtx(ctx); err != nil {
		return err
	}
	defer s.leave(&err)
	return fn(s.viewReader(s.db))
}

// viewReader is the projection.Reader of View and ViewSnapshot.
func (s *Store) viewReader(r pebble.Reader) projection.Reader {
	return reader{r, s.blobs}
}

// ViewSnapshot runs fn against a consistent point-in-time view of the whole store.
func (s *Store) ViewSnapshot(fn func(projection.Reader) error) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave(&err)
	snap := s.db.NewSnapshot()
	defer snap.Close()
	return fn(s.viewReader(snap))
}

// ReadLog calls fn for each event with seq >= from (inclusive), in order, until fn returns
// an error. An event that does not decode stops the walk with an error naming its sequence.
func (s *Store) ReadLog(ctx context.Context, from uint64, fn func(events.Event) error) error {
	return s.ReadRange(ctx, from, 0, fn)
}

// ReadRange is ReadLog bounded by to (inclusive; 0 means the end).
func (s *Store) ReadRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	return s.readRange(ctx, from, to, events.Decode, fn)
}

// FoldRange is ReadRange for a fold, which keeps no event: the event handed to fn is decoded
// into a struct that the next event of its type reuses (events.Decoder), so fn must not keep
// the event after it returns. It may keep the event's strings and byte strings, as
// projection.Apply does in a projection.Mem.
func (s *Store) FoldRange(ctx context.Context, from, to uint64, fn func(events.Event) error) error {
	var d events.Decoder
	return s.readRange(ctx, from, to, d.Decode, fn)
}

func (s *Store) readRange(ctx context.Context, from, to uint64,
	decode func([]byte, uint64) (events.Event, error), fn func(events.Event) error) error {
	return s.storedLog(ctx, from, to, func(seq uint64, raw []byte) error {
		ev, err := s.blobs.decodeStored(raw, seq, decode) // copies what it keeps: raw is reused by the walk
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// decodeAt decodes the event under the iterator with d.
func decodeAt(it *pebble.Iterator, d *events.Decoder, bl *blobStore) (events.Event, error) {
	k := it.Key()
	if len(k) != 9 {
		return nil, fmt.Errorf("%w: event key %q has the wrong length", events.ErrCorrupt, k)
	}
	seq := binary.BigEndian.Uint64(k[1:])
	v, err := it.ValueAndErr()
	if err != nil {
		return nil, fmt.Errorf("pebblelog: reading event at seq %d: %w", seq, err)
	}
	return bl.decodeStored(v, seq, d.Decode)
}

// walk runs fn at every key of [lower, upper) in order, until fn returns an error: the one
// iteration loop of the store's read methods. It registers the call (so Close waits for it),
// checks ctx at every step and always closes the iterator. The key and value fn sees are only
// valid during the call.
func (s *Store) walk(ctx context.Context, lower, upper []byte, fn func(key []byte, it *pebble.Iterator) error) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave(&err)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(it.Key(), it); err != nil {
			return err
		}
	}
	return it.Error()
}

// SessionSeqs calls fn with the sequence of every event of one session with seq >= from,
// in order, using the per-session index: no scan of other sessions' events.
func (s *Store) SessionSeqs(ctx context.Context, session string, from uint64, fn func(seq uint64) error) error {
	p := sessionPrefix(session)
	return s.walk(ctx, sessionEventKey(session, from), prefixEnd(p), func(k []byte, _ *pebble.Iterator) error {
		if len(k) != len(p)+8 {
			return fmt.Errorf("%w: session index key %q", ErrCorruptRecord, k)
		}
		return fn(binary.BigEndian.Uint64(k[len(p):]))
	})
}

// SessionLog calls fn for each event of one session with seq >= from, in order.
func (s *Store) SessionLog(ctx context.Context, session string, from uint64, fn func(events.Event) error) error {
	return s.SessionSeqs(ctx, session, from, func(seq uint64) error {
		ev, err := s.Event(ctx, seq)
		if err != nil {
			return err
		}
		return fn(ev)
	})
}

// Event reads the event at seq.
func (s *Store) Event(ctx context.Context, seq uint64) (_ events.Event, err error) {
	if err := s.enterCtx(ctx); err != nil {
		return nil, err
	}
	defer s.leave(&err)
	v, ok, err := reader{s.db, s.blobs}.get(eventKey(seq))
	if err != nil {
		return nil, fmt.Errorf("pebblelog: reading event at seq %d: %w", seq, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w at seq %d: the event is missing", events.ErrCorrupt, seq)
	}
	return s.blobs.decodeStored(v, seq, events.Decode)
}

// Checkpoint writes a consistent copy of the store into dir, which must not exist, while the
// store keeps running. Files are hard-linked where possible. The copy opens like any store.
// The marker is written last: a crash in between leaves a directory Open refuses as not a
// store; delete it and take the checkpoint again.
func (s *Store) Checkpoint(dir string) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave(&err)
	if _, err := s.fs.Stat(dir); err == nil {
		return fmt.Errorf("pebblelog: checkpoint destination %s already exists", dir)
	}
	// Prunes do not delete blob files meanwhile: every blob the copy's log refers to is
	// linked (blob.go).
	s.blobs.delMu.Lock()
	defer s.blobs.delMu.Unlock()
	if err := s.fh.call("a checkpoint", func() error { return s.db.Checkpoint(dir, pebble.WithFlushedWAL()) }); err != nil {
		return fmt.Errorf("pebblelog: checkpoint of %s into %s: %w", s.dir, dir, err)
	}
	if err := s.linkBlobs(dir); err != nil {
		return fmt.Errorf("pebblelog: checkpoint of %s into %s: blobs: %w", s.dir, dir, err)
	}
	return writeMarker(s.fs, dir)
}

// Metrics returns Pebble's metrics, for benchmarks and the replay tool's stats; ErrClosed
// after Close.
func (s *Store) Metrics() (*pebble.Metrics, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	return s.db.Metrics(), nil
}

// DiskUsage returns the bytes the store occupies on disk, its blob files included;
// ErrClosed after Close.
func (s *Store) DiskUsage(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m, err := s.Metrics()
	if err != nil {
		return 0, err
	}
	blobs, err := s.blobs.diskUsage()
	return m.DiskSpaceUsage() + blobs, err
}

// A read-only Store is the Pebble side of source.Source, which the replay tool reads.
var _ source.Source = (*Store)(nil)
