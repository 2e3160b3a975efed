package pebblelog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// Retention on Pebble (docs/design.md, "Retention").
//
// The fold keeps the retention index (r: subjects by the time they became prunable), and
// every append writes its event's entry in the per-subject event index (x), so a prune reads
// only what it removes. Txn.Prune removes a bounded group of subjects in the command's batch:
// through projection.PruneSubject their records, keys, list entries, counts and index
// entries; here their events (runs of the log by range deletion), their session and subject
// index entries; and it records the removed sequences in the pruned ranges (p), coalesced,
// so that Verify tells a pruned gap from a lost one. A subject is removed whole in one batch
// or not at all.

func pruneKey(at int64, seq uint64) []byte { return indexKey(prefixPrunable, at, seq) }

func pruneValue(e projection.PruneEntry) []byte {
	v := make([]byte, 0, 1+len(e.ID))
	if e.Wake {
		v = append(v, 'w')
	} else {
		v = append(v, 't')
	}
	return append(v, e.ID...)
}

func prunedKey(from uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixPruned}, from)
}

// ScanPrunable walks the retention index from its oldest entry while At < before, passing
// over held entries (projection.PruneHeld).
func (s reader) ScanPrunable(before int64, fn func(projection.PruneEntry) bool) (err error) {
	var herr error
	err = s.scanPrunable([]byte{prefixPrunable}, before, func(_ []byte, e projection.PruneEntry) bool {
		held, err := s.pruneHeld(e)
		if err != nil {
			herr = err
			return false
		}
		return held || fn(e)
	})
	return errors.Join(err, herr)
}

// pruneHeld is projection.PruneHeld from the stored record alone: Task would read the task's
// input from its event, which the rule does not need (and the archive's plan reads through a
// reader without the blob files).
func (s reader) pruneHeld(e projection.PruneEntry) (bool, error) {
	if e.Wake {
		return false, nil
	}
	t, err := s.taskRecord(e.ID)
	if err != nil || t == nil {
		return false, err
	}
	_, held, err := projection.LatestTick(s, t)
	return held, err
}

// scanPrunable is ScanPrunable from lower on, handing fn each entry's key too.
func (s reader) scanPrunable(lower []byte, before int64, fn func([]byte, projection.PruneEntry) bool) (err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: pruneKey(before, 0)})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		at, seq, good := parseIndexKey(it.Key())
		v, verr := it.ValueAndErr()
		if verr != nil {
			return verr
		}
		if !good || len(v) < 2 || (v[0] != 't' && v[0] != 'w') {
			return fmt.Errorf("%w: retention index key %q value %q", ErrCorruptRecord, it.Key(), v)
		}
		if !projection.PrunableBefore(at, before) {
			break // a before at math.MinInt64 has no entry
		}
		if !fn(it.Key(), projection.PruneEntry{At: at, Seq: seq, ID: string(v[1:]), Wake: v[0] == 'w'}) {
			return nil
		}
	}
	return it.Error()
}

// PrunedRanges returns the pruned ranges of the log, in order.
func (s reader) PrunedRanges() (_ projection.SeqRanges, err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPruned}, UpperBound: []byte{prefixPruned + 1}})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	var out projection.SeqRanges
	for ok := it.First(); ok; ok = it.Next() {
		r, perr := parsePruned(it)
		if perr != nil {
			return nil, perr
		}
		out = append(out, r)
	}
	return out, it.Error()
}

func parsePruned(it *pebble.Iterator) (projection.SeqRange, error) {
	k := it.Key()
	v, err := it.ValueAndErr()
	if err != nil {
		return projection.SeqRange{}, err
	}
	if len(k) != 9 || len(v) != 8 {
		return projection.SeqRange{}, fmt.Errorf("%w: pruned range key %q value %q", ErrCorruptRecord, k, v)
	}
	r := projection.SeqRange{From: binary.BigEndian.Uint64(k[1:]), To: binary.BigEndian.Uint64(v)}
	if r.From == 0 || r.To < r.From {
		return projection.SeqRange{}, fmt.Errorf("%w: pruned range [%d, %d]", ErrCorruptRecord, r.From, r.To)
	}
	return r, nil
}

// PrunedRanges returns the ranges of sequences pruned from the log (Queue.Prune): each is a
// gap of the log that is explained, not damage. The replay tool shows them.
func (s *Store) PrunedRanges(ctx context.Context) (_ projection.SeqRanges, err error) {
	if err := s.enterCtx(ctx); err != nil {
		return nil, err
	}
	defer s.leave(&err)
	return reader{s.db, s.blobs}.PrunedRanges()
}

// The writer's side of projection.PruneState.

func (w *writer) PutPrunable(e projection.PruneEntry) error {
	k := pruneKey(e.At, e.Seq)
	if w.lows != nil {
		lower(&w.lows.prunable, k) // a subject may become prunable at a time before others (the caller's now)
	}
	return w.b.Set(k, pruneValue(e), nil)
}

// LowerPrunable lowers the retention index's low to a held entry that is released
// (projection.PruneLowerer): a scan passed over it, and the next one must meet it.
func (w *writer) LowerPrunable(e projection.PruneEntry) {
	if w.lows != nil {
		lower(&w.lows.prunable, pruneKey(e.At, e.Seq))
	}
}

func (w *writer) DeletePrunable(e projection.PruneEntry) error {
	return w.b.DeleteSized(pruneKey(e.At, e.Seq), uint32(1+len(e.ID)), nil)
}

// ScanPrunable reads through the batch: a subject may have become prunable in it. It starts
// at the index's low (indexLows): every group removes the oldest entries, and a scan from the
// index's first key stepped over the tombstones of every group before it, so the groups of
// one large prune grew dearer one after the other (BenchmarkPruneLatency). It passes over
// held entries (projection.PruneHeld) and raises the low past them, as if they were absent:
// a schedule's latest tick may stay held for ever (a removed schedule's), and a low pinned
// at it would bring the tombstones back. Releasing one lowers the low to it (LowerPrunable).
func (w *writer) ScanPrunable(before int64, fn func(projection.PruneEntry) bool) error {
	var herr error
	take := func(e projection.PruneEntry) (held, more bool) {
		held, err := projection.PruneHeld(w, e)
		if err != nil {
			herr = err
			return false, false
		}
		return held, held || fn(e)
	}
	if w.lows == nil {
		err := w.reader.scanPrunable([]byte{prefixPrunable}, before, func(_ []byte, e projection.PruneEntry) bool {
			_, more := take(e)
			return more
		})
		return errors.Join(err, herr)
	}
	lower, upper := []byte{prefixPrunable}, pruneKey(before, 0)
	if w.lows.prunable != nil {
		lower = w.lows.prunable
	}
	if bytes.Compare(lower, upper) >= 0 {
		return nil // no live entry below upper
	}
	var first []byte
	stopped := false
	err := w.reader.scanPrunable(lower, before, func(k []byte, e projection.PruneEntry) bool {
		held, more := take(e)
		if first == nil && !held {
			first = bytes.Clone(k)
		}
		stopped = !more
		return more
	})
	if err != nil || herr != nil {
		return errors.Join(err, herr)
	}
	switch {
	case first != nil:
		w.lows.prunable = first
	case !stopped:
		w.lows.prunable = upper // nothing live below upper
	}
	return nil
}

// DeleteTask deletes the record in the batch and forgets it everywhere the writer would read
// it first: the batch's maps (writeRecords must not write it back) and, once the batch
// commits, the record cache (publish).
func (w *writer) DeleteTask(id string) error {
	delete(w.tasks, id)
	if w.deleted == nil {
		w.deleted = &deletedRecords{tasks: map[string]bool{}, wakes: map[string]bool{}}
	}
	w.deleted.tasks[id] = true
	return w.b.Delete(idKey(prefixTask, id), nil)
}

func (w *writer) DeleteWake(id string) error {
	delete(w.wakes, id)
	if w.deleted == nil {
		w.deleted = &deletedRecords{tasks: map[string]bool{}, wakes: map[string]bool{}}
	}
	w.deleted.wakes[id] = true
	return w.b.Delete(idKey(prefixWake, id), nil)
}

// deletedRecords are the records a batch deleted: reads of the batch find none, and the
// record cache forgets them when it commits.
type deletedRecords struct{ tasks, wakes map[string]bool }

func (w *writer) DeleteTaskKey(session, key string) error {
	return w.deleteScoped(scopedKey(prefixTaskKey, session, key))
}

func (w *writer) DeleteWakeKey(session, key string) error {
	return w.deleteScoped(scopedKey(prefixWakeKey, session, key))
}

func (w *writer) deleteScoped(k []byte) error {
	if err := w.b.Delete(k, nil); err != nil {
		return err
	}
	if w.keys == nil {
		w.keys = make(map[string]string)
	}
	w.keys[string(k)] = "" // freed: a later command of the batch reads no id
	return nil
}

func (w *writer) DeleteSessionTask(session string, submitSeq uint64) error {
	return w.b.Delete(sessionTaskKey(session, submitSeq), nil)
}

// forget drops deleted records from the cache.
func (c *recordCache) forget(d *deletedRecords) {
	if d == nil {
		return
	}
	for id := range d.tasks {
		if old, ok := c.tasks[id]; ok {
			c.bytes -= taskBytes(&old)
			delete(c.tasks, id)
		}
	}
	for id := range d.wakes {
		if old, ok := c.wakes[id]; ok {
			c.bytes -= wakeBytes(&old)
			delete(c.wakes, id)
		}
	}
}

// PruneResult is what one Txn.Prune removed.
type PruneResult struct {
	Tasks, Wakes int    // records removed (a task's completion wake counts as a wake)
	Events       uint64 // events removed from the log
	More         bool   // the group was full: more may be prunable before the same time
}

// minRangeDelete is the run of consecutive pruned events from which Prune deletes the log
// with one range deletion instead of a point deletion per event: fewer tombstones, and a
// range a compaction drops whole.
const minRangeDelete = 64

// Prune removes up to limit subjects prunable before before (projection.PrunableBefore),
// oldest first, with all their events, in this command's batch: a crash keeps all of a
// subject or none of it. Run it as a command of its own (Store.Update), one group at a time,
// so that the writer goes on serving other commands between groups.
func (t *Txn) Prune(before int64, limit int) (PruneResult, error) {
	return t.prune(before, limit, nil)
}

// prune is Prune with check, when not nil, called with the sorted sequences the group removes
// before any is deleted: an error from it fails the command (archive.go).
func (t *Txn) prune(before int64, limit int, check func(seqs []uint64) error) (PruneResult, error) {
	w := t.w
	var res PruneResult
	var entries []projection.PruneEntry
	err := w.ScanPrunable(before, func(e projection.PruneEntry) bool {
		if len(entries) == limit {
			res.More = true
			return false
		}
		entries = append(entries, e)
		return true
	})
	if err != nil || len(entries) == 0 {
		return res, err
	}
	// Remove the records, then each subject's events, found through the per-subject index
	// (x): what a prune reads is what it removes.
	var seqs []uint64
	for _, e := range entries {
		p, err := projection.PruneSubject(w, e, before)
		if err != nil {
			return res, err
		}
		for _, id := range []string{p.TaskID, p.WakeID} {
			if id == "" {
				continue
			}
			if id == p.TaskID {
				res.Tasks++
			} else {
				res.Wakes++
			}
			got, err := w.subjectEvents(p.SessionID, id)
			if err != nil {
				return res, err
			}
			if err := w.pruneBlobs(id); err != nil { // its files go once the batch is durable
				return res, err
			}
			seqs = append(seqs, got...)
		}
	}
	slices.Sort(seqs)
	if check != nil {
		if err := check(seqs); err != nil {
			return res, err
		}
	}
	runs := projection.RunsOf(seqs)
	for _, r := range runs { // first, while the batch holds no range deletion (see above)
		if err := w.addPruned(r); err != nil {
			return res, err
		}
	}
	for _, r := range runs {
		if r.To-r.From+1 >= minRangeDelete {
			if err := w.b.DeleteRange(eventKey(r.From), eventKey(r.To+1), nil); err != nil {
				return res, err
			}
			continue
		}
		for s := r.From; s <= r.To; s++ {
			if err := w.b.Delete(eventKey(s), nil); err != nil {
				return res, err
			}
		}
	}
	res.Events = uint64(len(seqs))
	return res, nil
}

// subjectEvents returns the sequences of id's events from the per-subject index, and deletes
// them from it (one range deletion: the subject's entries are contiguous) and from the
// session event index.
func (w *writer) subjectEvents(session, id string) (_ []uint64, err error) {
	prefix := subjectPrefix(id)
	end := prefixEnd(prefix)
	it, err := w.b.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: end})
	if err != nil {
		return nil, err
	}
	var out []uint64
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(prefix)+8 {
			it.Close()
			return nil, fmt.Errorf("%w: subject index key %q", ErrCorruptRecord, k)
		}
		out = append(out, binary.BigEndian.Uint64(k[len(prefix):]))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s has a record but no events in the subject index", ErrCorruptRecord, id)
	}
	// Point deletions, not a range deletion over the prefix: every later iterator over the
	// indexed batch (this group's next subjects, the claims of the same batch) fragments
	// all of the batch's range deletions, and a group of them made a prune 10 times slower
	// (BenchmarkRetention: 4.1 s instead of 0.44 s for 4,000 tasks).
	for _, seq := range out {
		if err := w.b.Delete(binary.BigEndian.AppendUint64(bytes.Clone(prefix), seq), nil); err != nil {
			return nil, err
		}
		if err := w.b.Delete(sessionEventKey(session, seq), nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// addPruned records r in the pruned ranges, coalesced with a range that ends just before it
// and one that starts just after it. It reads through the batch, so the ranges an earlier
// group of the same batch recorded are seen.
func (w *writer) addPruned(r projection.SeqRange) (err error) {
	from, to := r.From, r.To
	it, err := w.b.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixPruned}, UpperBound: []byte{prefixPruned + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	if it.SeekLT(prunedKey(from)) {
		prev, err := parsePruned(it)
		if err != nil {
			return err
		}
		if prev.To >= from {
			return fmt.Errorf("%w: pruned range [%d, %d] overlaps [%d, %d]", ErrCorruptRecord, from, to, prev.From, prev.To)
		}
		if prev.To+1 == from {
			if err := w.b.Delete(prunedKey(prev.From), nil); err != nil {
				return err
			}
			from = prev.From
		}
	}
	if it.SeekGE(prunedKey(r.From)) {
		next, err := parsePruned(it)
		if err != nil {
			return err
		}
		if next.From <= to {
			return fmt.Errorf("%w: pruned range [%d, %d] overlaps [%d, %d]", ErrCorruptRecord, r.From, to, next.From, next.To)
		}
		if next.From == to+1 {
			if err := w.b.Delete(prunedKey(next.From), nil); err != nil {
				return err
			}
			to = next.To
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	return w.b.Set(prunedKey(from), binary.BigEndian.AppendUint64(nil, to), nil)
}
