package pebblelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/events"
)

// Format 3's keyspaces (keys.go): the session task lists and the counts by kind and state
// (and the per-kind due index: index.go). The fold keeps them (projection.State's
// PutSessionTask, AddCount); reads are the projection.Reader's ScanSessionTasks and Counts.

// ScanSessionTasks walks sessionID's task list from the first task submitted after afterSeq.
func (s reader) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(uint64, string) bool) (err error) {
	if afterSeq == math.MaxUint64 {
		return nil
	}
	start := sessionTaskPrefix(sessionID)
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: sessionTaskKey(sessionID, afterSeq+1), UpperBound: prefixEnd(start)})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(start)+8 {
			return fmt.Errorf("%w: session task list key %q", ErrCorruptRecord, k)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if len(v) == 0 {
			return fmt.Errorf("%w: %s has no task id", ErrCorruptRecord, describeKey(k))
		}
		if !fn(binary.BigEndian.Uint64(k[len(start):]), string(v)) {
			return nil
		}
	}
	return it.Error()
}

// Counts reads the stored counters, in key order (for kinds shorter than 128 bytes: by length,
// then bytes; states by number). A stored counter is never zero: the writer deletes a count that drops to zero.
func (s reader) Counts(fn func(string, events.TaskState, int64) bool) (err error) {
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixCount}, UpperBound: []byte{prefixCount + 1}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	for ok := it.First(); ok; ok = it.Next() {
		kind, state, n, err := decodeCount(it)
		if err != nil {
			return err
		}
		if !fn(kind, state, n) {
			return nil
		}
	}
	return it.Error()
}

// decodeCount decodes the counter under the iterator.
func decodeCount(it *pebble.Iterator) (string, events.TaskState, int64, error) {
	kind, state, ok := parseCountKey(it.Key())
	if !ok || state > events.StateCanceled {
		return "", 0, 0, fmt.Errorf("%w: count key %q", ErrCorruptRecord, it.Key())
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return "", 0, 0, err
	}
	if len(v) != 8 {
		return "", 0, 0, fmt.Errorf("%w: %s is %d bytes, not 8", ErrCorruptRecord, describeKey(it.Key()), len(v))
	}
	return kind, state, int64(binary.BigEndian.Uint64(v)), nil
}

// countID names one counter.
type countID struct {
	kind  string
	state events.TaskState
}

// compareCountIDs orders counters as their keys sort (the reader's order).
func compareCountIDs(a, b countID) int {
	return bytes.Compare(countKey(a.kind, a.state), countKey(b.kind, b.state))
}

// loadCounts reads every stored counter, for the writer (Open) and the upgrade.
func (s reader) loadCounts() (map[countID]int64, error) {
	counts := map[countID]int64{}
	err := s.Counts(func(kind string, state events.TaskState, n int64) bool {
		counts[countID{kind, state}] = n
		return true
	})
	return counts, err
}

func encodeCount(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }

// The writer's side.
//
// The counts change at every submit, claim and settlement, so the writer does not read and
// rewrite a counter per command. It keeps the committed counts in memory (loaded at Open,
// owned by the writer goroutine: writerState.counts) and the batch's changes beside them
// (countDelta); finish writes each changed counter once, its value at the batch's end, and
// only a committed batch's changes are merged into the committed counts (publish). A
// discarded batch's changes go with its writer, so a command run again alone starts from the
// committed counts.

// ScanSessionTasks reads through the batch: the list is only appended to, so there are no
// tombstones to skip and nothing to remember between batches.
func (w *writer) ScanSessionTasks(sessionID string, afterSeq uint64, fn func(uint64, string) bool) error {
	return w.reader.ScanSessionTasks(sessionID, afterSeq, fn)
}

// Counts is the committed counts with the batch's changes, in the reader's order.
func (w *writer) Counts(fn func(string, events.TaskState, int64) bool) error {
	if w.counts == nil {
		// No counts in memory (a writer made by hand in a test): the batch's changes over
		// the stored counters.
		stored, err := w.committed.loadCounts()
		if err != nil {
			return err
		}
		return visitCounts(stored, w.countDelta, fn)
	}
	return visitCounts(w.counts, w.countDelta, fn)
}

func visitCounts(base, delta map[countID]int64, fn func(string, events.TaskState, int64) bool) error {
	ids := make([]countID, 0, len(base)+len(delta))
	for id := range base {
		ids = append(ids, id)
	}
	for id := range delta {
		if _, ok := base[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, compareCountIDs)
	for _, id := range ids {
		if n := base[id] + delta[id]; n != 0 && !fn(id.kind, id.state, n) {
			return nil
		}
	}
	return nil
}

// committedCount is the counter's value before this batch.
func (w *writer) committedCount(id countID) (int64, error) {
	if w.counts != nil {
		return w.counts[id], nil
	}
	v, ok, err := w.committed.get(countKey(id.kind, id.state))
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: %s is %d bytes, not 8", ErrCorruptRecord, describeKey(countKey(id.kind, id.state)), len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// AddCount records the change in the batch's delta; finish writes it. A count that would go
// below zero is a fold that does not match the stored counts (damage, or a fold bug): the
// command fails rather than store it.
func (w *writer) AddCount(kind string, state events.TaskState, delta int64) error {
	id := countID{kind, state}
	if w.countDelta == nil {
		w.countDelta = make(map[countID]int64)
	}
	d := w.countDelta[id] + delta
	if delta < 0 {
		base, err := w.committedCount(id)
		if err != nil {
			return err
		}
		if base+d < 0 {
			return fmt.Errorf("%w: the count of %q tasks in state %s would drop to %d", ErrCorruptRecord, kind, state, base+d)
		}
	}
	w.countDelta[id] = d
	return nil
}

// writeCounts writes each counter the batch changed, once, at its value at the batch's end;
// a counter that reaches zero is deleted, so the stored counters are exactly the (kind,
// state) pairs that have tasks.
func (w *writer) writeCounts() error {
	for id, d := range w.countDelta {
		if d == 0 {
			continue
		}
		base, err := w.committedCount(id)
		if err != nil {
			return err
		}
		k := countKey(id.kind, id.state)
		if n := base + d; n == 0 {
			err = w.b.Delete(k, nil)
		} else {
			err = w.b.Set(k, encodeCount(n), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mergeCounts adds a committed batch's changes to the committed counts.
func mergeCounts(committed, delta map[countID]int64) {
	for id, d := range delta {
		if n := committed[id] + d; n == 0 {
			delete(committed, id)
		} else {
			committed[id] = n
		}
	}
}

func (w *writer) PutSessionTask(sessionID string, submitSeq uint64, taskID string) error {
	return w.b.Set(sessionTaskKey(sessionID, submitSeq), []byte(taskID), nil)
}
