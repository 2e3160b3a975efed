package pebblelog

import (
	"context"
	"fmt"
	"slices"

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
func (t *Txn) Reader() projection.Reader { return decideReader{t.w} } // with values: input.go

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
// runs them in order against one indexed batch, and commits the batch: the commands share one
// fsync, and sequence order is commit order. A command whose fn fails would leave its partial
// writes in the shared batch, so the batch is then discarded and the commands run again one
// batch each.
//
// Commits are pipelined: the writer applies a batch to the memtable (Pebble's ApplyNoSyncWait:
// the batch is in the WAL, visible to reads, its fsync queued) and goes on to build the next
// batch on top of it while the syncer goroutine waits for the fsync and only then answers the
// batch's callers. Building batch k+1 overlaps the fsync of batch k, and Pebble's WAL writer
// folds the queued syncs together. Nothing is acknowledged early: a caller is answered after
// its own batch is durable, and the WAL is a prefix, so a batch that survives a crash brings
// every batch it was built on. (Reads may see a batch before its fsync completes; Pebble's
// own synced commits are visible before their fsync too.)
func (s *Store) writeLoop() {
	defer close(s.done)
	syncq := make(chan pending, syncDepth)
	synced := make(chan struct{})
	go s.syncLoop(syncq, synced)
	defer func() {
		close(syncq)
		<-synced
	}()
	ws := &writerState{lows: &indexLows{}, cache: newRecordCache(s.opts.RecordCacheSize), syncq: syncq, maxIDs: s.maxIDs}
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
		s.runGroup(ws, group)
	}
}

// syncDepth bounds the batches applied but not yet answered: past it the writer waits for
// the syncer, so a slow disk slows the writer instead of growing a queue.
const syncDepth = 16

// writerState is what the writer carries from batch to batch.
type writerState struct {
	lows   *indexLows   // the committed lows of the eligibility indexes (see indexLows)
	cache  *recordCache // the records of committed batches
	maxIDs *maxIDs      // the greatest record keys (see maxIDs)
	syncq  chan<- pending
}

// pending is a group of answered-to-be commands: once b (if any) is durable, the syncer
// sends each request its result.
type pending struct {
	b       *pebble.Batch // applied with ApplyNoSyncWait; nil: nothing of its own to wait for
	group   []*request
	results []error
}

// syncLoop answers the writer's groups in order. A group without a batch of its own (its
// commands wrote nothing, or NoSync) is answered only after every batch queued before it is
// durable: its commands may have read what those batches wrote (a duplicate submit finding
// the task submitted one batch earlier must not be acknowledged before that task is durable).
func (s *Store) syncLoop(q <-chan pending, done chan<- struct{}) {
	defer close(done)
	for p := range q {
		if p.b != nil {
			if err := p.b.SyncWait(); err != nil {
				err = s.fail(err)
				for i := range p.results {
					p.results[i] = err
				}
			} else {
				p.b.Close()
			}
		}
		for i, r := range p.group {
			r.done <- p.results[i]
		}
	}
}

func (s *Store) newWriter(ws *writerState) *writer {
	b := s.db.NewIndexedBatch()
	return &writer{reader: reader{b}, committed: reader{s.db}, b: b, lastSeq: s.lastSeq, lows: new(*ws.lows), cache: ws.cache, maxIDs: ws.maxIDs}
}

func (s *Store) runGroup(ws *writerState, group []*request) {
	if err := s.failure(); err != nil {
		for _, r := range group {
			r.done <- err
		}
		return
	}
	w := s.newWriter(ws)
	txn := &Txn{w: w}
	results := make([]error, len(group))
	for i, r := range group {
		if err := r.ctx.Err(); err != nil {
			results[i] = err // answered without running: nothing appended
			continue
		}
		before := w.b.Count()
		if err := r.fn(txn); err != nil {
			if w.b.Count() == before {
				results[i] = err // failed before writing anything: the batch is intact
				continue
			}
			// Partial writes in the shared batch: start over, one command per batch.
			w.b.Close()
			s.runAlone(ws, group)
			return
		}
	}
	if err := w.finish(s.lastSeq); err != nil {
		w.b.Close()
		s.runAlone(ws, group)
		return
	}
	s.publish(ws, w, slices.Clone(group), results)
}

func (s *Store) runAlone(ws *writerState, group []*request) {
	for _, r := range group {
		if err := r.ctx.Err(); err != nil {
			r.done <- err
			continue
		}
		if err := s.failure(); err != nil {
			r.done <- err
			continue
		}
		w := s.newWriter(ws)
		if err := r.fn(&Txn{w: w}); err != nil {
			w.b.Close()
			r.done <- err
			continue
		}
		if err := w.finish(s.lastSeq); err != nil {
			w.b.Close()
			r.done <- err
			continue
		}
		s.publish(ws, w, []*request{r}, []error{nil})
	}
}

// publish commits the writer's batch with the configured durability and hands the group to
// the syncer, which answers it once the batch is durable. Only a batch that Pebble accepted
// moves the writer's state (last sequence, index lows, record cache) forward. Pebble treats a
// failed WAL write or fsync as fatal: it calls Logger.Fatalf, which panics, and the process
// ends without answering anyone (fail-stop); a restart recovers what Pebble made durable,
// which may include unanswered batches. After any other commit error the store stops taking
// writes until it is reopened (ErrStoreFailed).
func (s *Store) publish(ws *writerState, w *writer, group []*request, results []error) {
	b := w.b
	if b.Empty() {
		b.Close()
		ws.syncq <- pending{group: group, results: results}
		return
	}
	var err error
	if s.opts.NoSync {
		err = b.Commit(pebble.NoSync)
	} else {
		err = s.db.ApplyNoSyncWait(b, pebble.Sync)
	}
	if err != nil {
		// The batch is not closed: after a failed ApplyNoSyncWait Pebble may still hold it
		// in its commit queue. The store is failed from here on.
		err = s.fail(err)
		for i := range results {
			results[i] = err
		}
		ws.syncq <- pending{group: group, results: results}
		return
	}
	s.lastSeq = w.lastSeq
	*ws.lows = *w.lows // only a committed batch's view may raise the committed lows
	ws.cache.merge(w.tasks, w.wakes)
	if s.opts.NoSync {
		b.Close()
		b = nil
	}
	ws.syncq <- pending{b: b, group: group, results: results}
}
