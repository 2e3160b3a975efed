package pebblelog

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Txn is the write side of one command: it reads the projection (including what earlier
// commands of the same batch wrote) and appends events, each applied to the projection as it
// is appended.
type Txn struct {
	w *writer
}

// Reader returns the projection as this command sees it.
func (t *Txn) Reader() projection.Reader { return decideReader{t.w} } // with values: input.go

// Append assigns the next sequence number to ev, encodes it under its log key and the
// session index, and applies it to the projection. On error nothing of ev is kept in the
// projection, but the batch may hold its log key: the writer discards the whole batch.
func (t *Txn) Append(ev events.Event) error {
	h := ev.Head()
	h.Seq = t.w.lastSeq + 1
	n := events.ValueLen(ev)
	var fields []blobField
	var owner string
	if n >= BlobMin && t.w.bl != nil {
		fields, owner = blobFields(ev) // format 4: large values go to blob files (blob.go)
	}
	if len(fields) > 0 {
		if err := t.appendBlobbed(eventKey(h.Seq), ev, fields, owner); err != nil {
			return err
		}
	} else if n > directEncodeMin {
		if err := t.appendDirect(eventKey(h.Seq), ev); err != nil {
			return err
		}
	} else {
		var err error
		if t.w.ebuf, err = events.Append(t.w.ebuf[:0], ev); err != nil {
			return err
		}
		if err := t.w.b.Set(eventKey(h.Seq), t.w.ebuf, nil); err != nil {
			return err
		}
	}
	if err := t.w.b.Set(sessionEventKey(h.SessionID, h.Seq), nil, nil); err != nil {
		return err
	}
	// The per-subject index: a prune finds a subject's events without reading others.
	t.w.kbuf = appendSubjectEventKey(t.w.kbuf[:0], ev, h.Seq)
	if err := t.w.b.Set(t.w.kbuf, nil, nil); err != nil {
		return err
	}
	return projection.Apply(t.w, ev)
}

// ReserveSubmits tells the Txn that its command is about to append the submits of requests
// tasks whose requests hold bytes of values and text in all (work.SubmitMany): it gives
// the writer's batch room for what they will write, so that Pebble does not grow it by
// doubling as they are appended (every doubling copies the batch; the last leaves it up to
// twice the size it needs: 4x a 64 MiB batch's bytes were allocated, 2x at once at the
// peak). What the batch held already is copied into the new one once.
func (t *Txn) ReserveSubmits(requests, bytes int) {
	need := bytes + requests*submitWriteBytes
	if need < reserveMin {
		return
	}
	old := t.w.b
	nb := t.w.db.NewIndexedBatchWithSize(old.Len() + need)
	if !old.Empty() {
		if err := nb.Apply(old, nil); err != nil {
			nb.Close() // keep the old batch: it only grows as before
			return
		}
	}
	// The old batch is left to the garbage collector, not closed: Close would hand its
	// buffer to Pebble's pool for reuse, and a value read from it earlier in the group may
	// still be referenced.
	t.w.b, t.w.reader.r = nb, nb
}

// submitWriteBytes is what one submit writes to the batch beyond its request's bytes (the
// event's other fields and its three keys, the task record, the key and index entries,
// Pebble's framing of each): about 600 bytes measured (a batch of 10,000 submits of 6,701
// bytes each is 73 MB: 67 MB of requests), with room to spare, for a short fall makes
// Pebble double the whole batch. reserveMin: below it, growing costs little.
const (
	submitWriteBytes = 1 << 10
	reserveMin       = 1 << 20
)

// directEncodeMin is the size of values above which Append encodes the event straight into
// the batch (appendDirect) rather than into the Txn's buffer, which the batch then copies:
// with a 64 MiB input that buffer was one more 64 MiB copy, kept until the batch ended.
// Smaller events keep the buffer: sizing one first costs a second encoding of its fields.
const directEncodeMin = 64 << 10

// appendDirect encodes ev into the batch under key, in place: the batch's deferred operation
// is sized by events.EncodedLen, and the encoding must fill it exactly.
func (t *Txn) appendDirect(key []byte, ev events.Event) error {
	n, err := events.EncodedLen(ev)
	if err != nil {
		return err
	}
	op := t.w.b.SetDeferred(len(key), n)
	copy(op.Key, key)
	b, err := events.Append(op.Value[:0], ev)
	if err != nil {
		return err
	}
	if len(b) != n || (n > 0 && &b[0] != &op.Value[0]) {
		return fmt.Errorf("pebblelog: event %s encoded to %d bytes, not the %d sized for it", ev.Type(), len(b), n)
	}
	return op.Finish()
}

type request struct {
	ctx  context.Context
	fn   func(*Txn) error
	done chan error // buffered: the syncer never waits for a caller that has left

	// mu is held by the writer while fn runs. A caller that returns without an answer (its
	// ctx is done, or the store failed) takes it first and sets gone: it waits for a running
	// fn to end, and fn never runs again, so the caller may read what fn wrote as soon as
	// Update returns. fn only reads and appends; it does not wait for the disk's writes.
	mu   sync.Mutex
	gone bool
}

// run runs fn unless the caller has gone; ran is false if it has.
func (r *request) run(txn *Txn) (ran bool, err error) {
	r.mu.Lock()
	if r.gone {
		r.mu.Unlock()
		return false, nil
	}
	err = r.fn(txn)
	r.mu.Unlock()
	return true, err
}

// leave is the caller's side of run: after it, fn is not running and never runs again. It
// returns the answer if one came meanwhile, else err.
func (r *request) leave(err error) error {
	r.mu.Lock()
	r.gone = true
	r.mu.Unlock()
	select {
	case answer := <-r.done:
		return answer
	default:
		return err
	}
}

// goneErr is the answer to a command whose caller has gone: nobody reads it.
func (r *request) goneErr(s *Store) error {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	return s.fh.err()
}

// Update runs fn in the store's single writer, alone against the latest state, and returns
// once the batch holding its events has committed (and, unless NoSync, been fsynced). If fn
// returns an error, nothing it appended is kept and Update returns that error.
//
// fn may run more than once: when another command of the same batch fails after writing, the
// batch is discarded and every command runs again in a batch of its own. Only what fn does
// through the Txn is undone; fn must reset anything else it sets (results captured in
// variables) at its start.
//
// Update honours ctx while it waits, to be queued and to be answered. An abandoned call (ctx
// done, Update returned ctx.Err()) may still commit: if its command ran before the caller
// left, what it appended is in a batch that commits with the others. Once Update has returned
// fn is not running and never runs again, so the caller may read what fn set. Commands made
// idempotent (an idempotency key, a lease token) make a retry safe.
//
// Once the store has failed (a failed WAL write or fsync, damage found by a read or a
// compaction, a commit or sync stalled longer than Options.StallTimeout, a fatal error of
// Pebble's), Update returns that failure, an error wrapping ErrStoreFailed, and so does every
// call waiting for an answer: a call that is not answered with success may or may not have
// committed.
func (s *Store) Update(ctx context.Context, fn func(*Txn) error) error {
	if s.opts.ReadOnly {
		return ErrReadOnlyStore
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	r := &request{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		s.closeMu.RUnlock()
		return ctx.Err() // not queued: nothing runs
	case <-s.fh.ch:
		s.closeMu.RUnlock()
		return s.fh.err()
	}
	// The call stays registered until queued, so Close waits for it.
	s.closeMu.RUnlock()
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return r.leave(ctx.Err())
	case <-s.fh.ch:
		return r.leave(s.fh.err()) // an answer that came before the failure stands
	}
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
	if !s.opts.NoSync && !witnessOff { // NoSync batches are never known durable: nothing to witness
		s.wit = newSyncWitness(s.fs, s.dir, s.opts.Logger)
		go s.wit.run()
	}
	go s.syncLoop(syncq, synced)
	stopWatch := make(chan struct{})
	go s.fh.watch(stopWatch)
	defer func() {
		close(syncq)
		<-synced
		close(stopWatch)
		if s.wit != nil {
			s.wit.close()
		}
	}()
	ws := &writerState{lows: &indexLows{}, cache: newRecordCache(s.opts.RecordCacheSize), syncq: syncq, maxIDs: s.maxIDs,
		counts: s.counts, partLows: map[partLow]runMarks{}, policies: s.policies, sched: &schedFirst{}}
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
	maxIDs *maxIDs      // the ids known to have no record (see maxIDs)
	syncq  chan<- pending

	counts   map[countID]int64                 // the committed counts (state_kinds_sessions.go)
	policies map[string]*projection.KindPolicy // the committed kind policies (decide_cache.go)
	sched    *schedFirst                       // the committed schedule index's earliest tick
	partLows map[partLow]runMarks              // the committed marks of the due indexes (runMarks: index.go)
	// The arrays of replaced marks and the emptied batch map of marks, for the next batches.
	freeMarks     []runMarks
	sparePartLows map[partLow]runMarks

	// The record maps and order of the last published writer, emptied, for the next one:
	// growing fresh maps for every batch was two allocations per submit (see recycle).
	spareTasks map[string]projection.Task
	spareWakes map[string]projection.Wake
	spareOrder []string
	// The encoding and key scratch buffers of the last published writer (writer.buf, kbuf,
	// ebuf): a writer starting with none regrew each by doubling, a few allocations per
	// command when a batch holds one.
	spareBuf, spareKbuf, spareEbuf []byte
}

// recycleMax bounds the maps recycle keeps: clear costs a map's capacity, not its length, so
// one batch of many records must not slow every later one. recycleBufMax bounds the scratch
// buffers it keeps: one large value must not stay allocated for good.
const (
	recycleMax    = 1024
	recycleBufMax = 64 << 10
)

// spareBuf is b emptied for the next writer, or nil when it grew past recycleBufMax.
func spareBuf(b []byte) []byte {
	if cap(b) > recycleBufMax {
		return nil
	}
	return b[:0]
}

// recycle keeps w's record maps for the next writer. Call it only once w is done with: its
// batch published and its records merged into the cache (which copies them).
func (ws *writerState) recycle(w *writer) {
	if w.tasks != nil && len(w.tasks) <= recycleMax {
		clear(w.tasks)
		ws.spareTasks = w.tasks
	}
	if w.wakes != nil && len(w.wakes) <= recycleMax {
		clear(w.wakes)
		ws.spareWakes = w.wakes
	}
	if cap(w.taskOrder) <= recycleMax {
		ws.spareOrder = w.taskOrder[:0]
	}
	ws.spareBuf, ws.spareKbuf, ws.spareEbuf = spareBuf(w.buf), spareBuf(w.kbuf), spareBuf(w.ebuf)
	w.tasks, w.wakes, w.taskOrder = nil, nil, nil
	w.buf, w.kbuf, w.ebuf = nil, nil, nil
}

// pending is a group of answered-to-be commands: once b (if any) is durable, the syncer
// sends each request its result.
type pending struct {
	b       *pebble.Batch // applied with ApplyNoSyncWait; nil: nothing of its own to wait for
	group   []*request
	results []error
	blobs   []string // blob files a prune in b released: removed once b is durable (blob.go)
	seq     uint64   // the last event sequence once b is committed: witnessed once b is durable
}

// syncLoop answers the writer's groups in order. A group without a batch of its own (its
// commands wrote nothing, or NoSync) is answered only after every batch queued before it is
// durable: its commands may have read what those batches wrote (a duplicate submit finding
// the task submitted one batch earlier must not be acknowledged before that task is durable).
// For the same reason, once any batch has failed, every later group fails too, with or
// without a batch of its own: it may have read what the failed batch wrote.
func (s *Store) syncLoop(q <-chan pending, done chan<- struct{}) {
	defer close(done)
	for p := range q {
		if p.b != nil {
			s.fh.inSync()
			err := p.b.SyncWait()
			s.fh.outOfSync()
			if err != nil {
				s.fh.fail(fmt.Errorf("WAL write or sync: %w", err))
			} else {
				p.b.Close()
				if s.wit != nil {
					s.wit.advance(p.seq) // before the callers hear of it (witness.go)
				}
			}
		}
		if len(p.blobs) > 0 {
			s.removePrunedBlobs(p.blobs)
		}
		// No batch is answered after the store's directory was removed (Linux), nor more
		// than dirCheckInterval after it went (its fsyncs reach unlinked files): dirWatch.
		s.fh.checkDirLinked()
		s.fh.checkDirEvery()
		if err := s.fh.err(); err != nil {
			for i := range p.results {
				p.results[i] = err
			}
		} else {
			s.fh.durable.Advance(p.seq) // followers read up to here (follow.go); before the callers hear
		}
		for i, r := range p.group {
			r.done <- p.results[i]
		}
	}
}

func (s *Store) newWriter(ws *writerState) *writer {
	b := s.db.NewIndexedBatch()
	w := &writer{reader: reader{b, s.blobs}, committed: reader{s.db, s.blobs}, b: b, db: s.db, lastSeq: s.lastSeq, lows: new(*ws.lows), cache: ws.cache, maxIDs: ws.maxIDs,
		counts: ws.counts, policies: ws.policies, sched: ws.sched, partLows: ws.partLows, newPartLows: ws.sparePartLows, freeMarks: &ws.freeMarks, tasks: ws.spareTasks, wakes: ws.spareWakes, taskOrder: ws.spareOrder}
	w.buf, w.kbuf, w.ebuf = ws.spareBuf, ws.spareKbuf, ws.spareEbuf
	ws.spareTasks, ws.spareWakes, ws.spareOrder, ws.sparePartLows = nil, nil, nil, nil // one writer at a time owns them
	ws.spareBuf, ws.spareKbuf, ws.spareEbuf = nil, nil, nil
	return w
}

func (s *Store) runGroup(ws *writerState, group []*request) {
	if err := s.fh.err(); err != nil {
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
		w.newCommand()
		ran, err := r.run(txn)
		if !ran {
			results[i] = r.goneErr(s)
			continue
		}
		if err != nil {
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
		if err := s.fh.err(); err != nil {
			r.done <- err
			continue
		}
		w := s.newWriter(ws)
		ran, err := r.run(&Txn{w: w})
		if !ran {
			w.b.Close()
			r.done <- r.goneErr(s)
			continue
		}
		if err == nil {
			err = w.finish(s.lastSeq)
		}
		if err != nil {
			w.b.Close()
			if ferr := s.fh.err(); ferr != nil {
				err = ferr // e.g. fn's read found a damaged block: the store failed under it
			}
			r.done <- err
			continue
		}
		s.publish(ws, w, []*request{r}, []error{nil})
	}
}

// publish commits the writer's batch with the configured durability and hands the group to
// the syncer, which answers it once the batch is durable. Only a batch that Pebble accepted
// moves the writer's state (last sequence, index lows, record cache) forward. A failed WAL
// write or fsync surfaces in the syncer (SyncWait); a commit error fails the store here,
// including one Pebble reports through Logger.Fatalf, after which ApplyNoSyncWait returns nil
// (see failures.fatal): so the store's failure is checked after every commit. A commit that
// waits in a write stall longer than Options.StallTimeout fails the store from the watchdog
// and stays inside Pebble until the stall ends. Once failed, the store stops taking writes
// until it is reopened (ErrStoreFailed).
func (s *Store) publish(ws *writerState, w *writer, group []*request, results []error) {
	b := w.b
	if b.Empty() {
		b.Close()
		ws.syncq <- pending{group: group, results: results}
		return
	}
	err := s.fh.err() // a failed WAL write fails the store before its SyncWait returns
	if err == nil {
		err = s.commit(b)
	}
	if err == nil {
		err = s.fh.err() // a Fatalf in the commit pipeline returns nil to us
	}
	if err != nil {
		// The batch is not closed: after a failed ApplyNoSyncWait Pebble may still hold it
		// in its commit queue. The store is failed from here on.
		err = s.fh.fail(fmt.Errorf("commit: %w", err))
		for i := range results {
			results[i] = err
		}
		ws.syncq <- pending{group: group, results: results}
		return
	}
	s.lastSeq = w.lastSeq
	*ws.lows = *w.lows // only a committed batch's view may raise the committed lows
	ws.mergePartLows(w.newPartLows)
	mergeCounts(ws.counts, w.countDelta)
	mergePolicies(ws.policies, w.policyDelta)
	if w.schedTouched {
		ws.sched.known = false // read again at the next claim that needs it
	}
	if ws.maxIDs != nil {
		ws.maxIDs.task.settle()
		ws.maxIDs.wake.settle()
	}
	ws.cache.merge(w.tasks, w.wakes)
	ws.cache.forget(w.deleted)
	if s.dcache != nil {
		// After the commit, which made the batch visible: a reader that read before it and
		// adds later finds its shard's generation moved (durable_cache.go).
		if w.deleted != nil {
			s.dcache.clear() // a prune: its keys went with its records
		} else {
			s.dcache.invalidate(w.tasks, w.wakes)
		}
	}
	blobs := w.prunedBlobs
	ws.recycle(w)
	if s.opts.NoSync {
		b.Close()
		b = nil
	}
	ws.syncq <- pending{b: b, group: group, results: results, blobs: blobs, seq: s.lastSeq}
}

// commit commits b with the configured durability, inside the watchdog's bracket. Pebble
// panics in the commit when its WAL writer failed earlier (DB.commitWrite); that panic is
// the store's failure, and Pebble's commit mutex stays held, so the database is not closed
// again (see walFS).
func (s *Store) commit(b *pebble.Batch) (err error) {
	s.fh.inCommit()
	defer func() {
		s.fh.outOfCommit()
		if p := recover(); p != nil {
			s.fh.parked.Store(true)
			err = s.fh.fail(fmt.Errorf("pebble panicked in a commit: %v", p))
		}
	}()
	if s.opts.NoSync {
		return b.Commit(pebble.NoSync)
	}
	return s.db.ApplyNoSyncWait(b, pebble.Sync)
}
