package pebblelog

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Txn is the write side of one command: it reads the projection (including what earlier
// commands of the same batch wrote) and appends events, each applied to the projection as it
// is appended.
type Txn struct {
	w   *writer
	buf []byte
}

// Reader returns the projection as this command sees it.
func (t *Txn) Reader() projection.Reader { return t.w }

// Append assigns the next sequence number to ev, encodes it under its log key and the
// session index, and applies it to the projection. On error nothing of ev is kept in the
// projection, but the batch may hold its log key: the writer discards the whole batch.
func (t *Txn) Append(ev events.Event) error {
	h := ev.Head()
	h.Seq = t.w.lastSeq + 1
	var err error
	if t.buf, err = events.Append(t.buf[:0], ev); err != nil {
		return err
	}
	if err := t.w.b.Set(eventKey(h.Seq), t.buf, nil); err != nil {
		return err
	}
	if err := t.w.b.Set(sessionEventKey(h.SessionID, h.Seq), nil, nil); err != nil {
		return err
	}
	return projection.Apply(t.w, ev)
}

type request struct {
	ctx  context.Context
	fn   func(*Txn) error
	done chan error
}

// Update runs fn in the store's single writer, alone against the latest state, and returns
// once the batch holding its events has committed (and, unless NoSync, been fsynced). If fn
// returns an error, nothing it appended is kept and Update returns that error.
func (s *Store) Update(ctx context.Context, fn func(*Txn) error) error {
	if s.opts.ReadOnly {
		return ErrReadOnlyStore
	}
	if err := s.enter(); err != nil {
		return err
	}
	if err := s.failure(); err != nil {
		s.closeMu.RUnlock()
		return err
	}
	r := &request{ctx: ctx, fn: fn, done: make(chan error, 1)}
	s.reqs <- r
	// The call stays registered until answered, so Close waits for it.
	s.closeMu.RUnlock()
	return <-r.done
}

func (s *Store) failure() error {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failed
}

func (s *Store) fail(err error) error {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	if s.failed == nil {
		s.failed = fmt.Errorf("%w: %v", ErrStoreFailed, err)
	}
	return s.failed
}

// writeLoop is the single writer. It takes every command waiting (up to MaxBatchCommands),
// runs them in order against one indexed batch, and commits the batch with one fsync: the
// commands share the sync, and sequence order is commit order. A command whose fn fails
// would leave its partial writes in the shared batch, so the batch is then discarded and the
// commands run again one batch each.
func (s *Store) writeLoop() {
	defer close(s.done)
	lows := &indexLows{} // the committed lows of the eligibility indexes (see indexLows)
	group := make([]*request, 0, s.opts.MaxBatchCommands)
	for r := range s.reqs {
		group = append(group[:0], r)
	drain:
		for len(group) < cap(group) {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break drain
				}
				group = append(group, r)
			default:
				break drain
			}
		}
		s.runGroup(lows, group)
	}
}

func (s *Store) runGroup(lows *indexLows, group []*request) {
	if err := s.failure(); err != nil {
		for _, r := range group {
			r.done <- err
		}
		return
	}
	b := s.db.NewIndexedBatch()
	w := &writer{reader: reader{b}, b: b, lastSeq: s.lastSeq, lows: new(*lows)}
	txn := &Txn{w: w}
	results := make([]error, len(group))
	for i, r := range group {
		if err := r.ctx.Err(); err != nil {
			results[i] = err // answered without running: nothing appended
			continue
		}
		before := b.Count()
		if err := r.fn(txn); err != nil {
			if b.Count() == before {
				results[i] = err // failed before writing anything: the batch is intact
				continue
			}
			// Partial writes in the shared batch: start over, one command per batch.
			b.Close()
			s.runAlone(lows, group)
			return
		}
	}
	if err := w.finish(s.lastSeq); err != nil {
		b.Close()
		s.runAlone(lows, group)
		return
	}
	if err := s.commit(b); err != nil {
		for _, r := range group {
			r.done <- err
		}
		return
	}
	s.lastSeq = w.lastSeq
	*lows = *w.lows // only a committed batch's view may raise the committed lows
	for i, r := range group {
		r.done <- results[i]
	}
}

func (s *Store) runAlone(lows *indexLows, group []*request) {
	for _, r := range group {
		if err := r.ctx.Err(); err != nil {
			r.done <- err
			continue
		}
		if err := s.failure(); err != nil {
			r.done <- err
			continue
		}
		b := s.db.NewIndexedBatch()
		w := &writer{reader: reader{b}, b: b, lastSeq: s.lastSeq, lows: new(*lows)}
		if err := r.fn(&Txn{w: w}); err != nil {
			b.Close()
			r.done <- err
			continue
		}
		if err := w.finish(s.lastSeq); err != nil {
			b.Close()
			r.done <- err
			continue
		}
		if err := s.commit(b); err != nil {
			r.done <- err
			continue
		}
		s.lastSeq = w.lastSeq
		*lows = *w.lows
		r.done <- nil
	}
}

// commit writes the batch with the configured durability. Pebble treats a failed WAL write
// or fsync as fatal: it calls Logger.Fatalf, which panics, and the process ends without
// answering anyone (fail-stop); a restart recovers what Pebble made durable, which may
// include the unanswered batch. After any other commit error the store stops taking writes
// until it is reopened (ErrStoreFailed).
func (s *Store) commit(b *pebble.Batch) error {
	defer b.Close()
	if b.Empty() {
		return nil
	}
	opt := pebble.Sync
	if s.opts.NoSync {
		opt = pebble.NoSync
	}
	if err := b.Commit(opt); err != nil {
		return s.fail(err)
	}
	return nil
}
