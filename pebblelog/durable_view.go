package pebblelog

import (
	"context"

	"github.com/worklog/worklog/projection"
)

// ViewDurable runs fn against the committed projection outside the single writer, as View
// does, and reports whether everything fn read is durable: every task and wake record it
// read was last changed by an event at or below the durable sequence (Durable), read once
// fn has returned. A batch is visible a moment before its fsync returns (ApplyNoSyncWait), so
// a record read may be newer than what a crash keeps; then durable is false and the caller
// asks the writer instead, which answers only after the batches before it are durable. The
// reads are not one snapshot: each sees committed state at least as new as the one before.
// An idempotency key, once stored, names its record until a prune deletes both, so a key
// read and then its record is a consistent pair, or the record is missing (fn's error).
//
// work answers an idempotent repeat of Submit and RequestWake with it (engineapi's
// DurableViewer): a key and its record read by the caller's own goroutine, no trip through
// the writer, no empty batch answered by the syncer. Only TaskKey, WakeKey, Task and Wake
// are meant for fn; the other reads are the committed state's, not checked for durability.
func (s *Store) ViewDurable(ctx context.Context, fn func(projection.Reader) error) (durable bool, err error) {
	if err := s.enterCtx(ctx); err != nil {
		return false, err
	}
	defer s.leave(&err)
	r := &durableReader{reader: reader{s.db, s.blobs}, c: s.dcache}
	if err := fn(r); err != nil {
		return false, err
	}
	return r.maxSeq <= s.fh.durable.Seq() && s.fh.err() == nil, nil
}

// durableReader is the reader of ViewDurable: the committed state, through the durable
// cache (durable_cache.go) when the store has one, noting the newest record it handed out.
type durableReader struct {
	reader
	c      *durableCache // nil: none
	maxSeq uint64        // the highest UpdatedSeq of a record read
}

func (r *durableReader) TaskKey(session, key string) (string, error) {
	return r.key(durableKey{session: session, key: key}, r.reader.TaskKey)
}

func (r *durableReader) WakeKey(session, key string) (string, error) {
	return r.key(durableKey{wake: true, session: session, key: key}, r.reader.WakeKey)
}

// key reads an idempotency key's id through the cache (read: the store's read of it).
func (r *durableReader) key(k durableKey, read func(session, key string) (string, error)) (string, error) {
	if r.c == nil {
		return read(k.session, k.key)
	}
	id, m, ok := r.c.key(k)
	if ok {
		return id, nil
	}
	id, err := read(k.session, k.key)
	if err == nil && id != "" {
		r.c.addKey(k, id, m)
	}
	return id, err
}

// Task hands out a copy of the cached record (the caller may change its fields; its values
// are shared, as the record cache's are, and copied before they leave the store's caller).
func (r *durableReader) Task(id string) (*projection.Task, error) {
	t, err := cachedRecord(r.c, id, r.reader.Task, (*durableCache).task, (*durableCache).addTask)
	if t != nil {
		r.maxSeq = max(r.maxSeq, t.UpdatedSeq, t.SubmitSeq)
	}
	return t, err
}

func (r *durableReader) Wake(id string) (*projection.Wake, error) {
	x, err := cachedRecord(r.c, id, r.reader.Wake, (*durableCache).wake, (*durableCache).addWake)
	if x != nil {
		r.maxSeq = max(r.maxSeq, x.UpdatedSeq, x.RecordSeq)
	}
	return x, err
}

// cachedRecord reads a record through c (nil: none): its entry if it has one, else the
// store's read, kept unless a drop came in between.
func cachedRecord[R any](c *durableCache, id string, read func(string) (*R, error),
	get func(*durableCache, string) (R, durableMark, bool), add func(*durableCache, *R, durableMark)) (*R, error) {
	if c == nil {
		return read(id)
	}
	cached, m, ok := get(c, id)
	if ok {
		return &cached, nil
	}
	rec, err := read(id)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		add(c, rec, m)
	}
	return rec, nil
}
