package pebblelog

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/worklog/worklog/projection"
)

// What every claim reads of the kind policies and the schedules, kept by the writer so that a
// queue without either pays no Pebble read for them (issue 23's per-claim cost).
//
// Every task claim's decide code reads all the kind policies (work's gatedScan) and the
// schedule index's first entry (submitTicks), and the fold of every claim reads its kind's
// policy (the rate's bucket). Through the indexed batch each was an iterator or a Get that
// merges the batch with every level of the DB: two iterators and one Get per claim, for
// state that is nearly always empty. Only the writer changes either, so it keeps:
//
//   - the committed policies in memory (writerState.policies, loaded at Open), beside the
//     batch's changes (writer.policyDelta), merged when the batch commits (publish), as the
//     counts are (state_kinds_sessions.go): a discarded batch's changes go with its writer;
//   - the committed schedule index's earliest tick (writerState.sched), known until a
//     committed batch changes the index and read again (one iterator over the committed DB)
//     at the next claim after. A claim whose batch has not changed the index and whose now is
//     before that tick reads nothing; one whose batch has reads through the batch as before.
//
// A writer made without them (Verify's, by hand in tests) reads the batch, as before.

// schedFirst is the committed schedule index's earliest tick: at, when known (MaxInt64: the
// index is empty).
type schedFirst struct {
	known bool
	at    int64
}

// loadPolicies reads every stored policy (Open).
func (s reader) loadPolicies() (map[string]*projection.KindPolicy, error) {
	m := map[string]*projection.KindPolicy{}
	err := s.KindPolicies(func(p *projection.KindPolicy) bool {
		m[p.Kind] = p
		return true
	})
	return m, err
}

// firstScheduleDue is the earliest tick in the schedule index (MaxInt64: none).
func (s reader) firstScheduleDue() (at int64, err error) {
	at = math.MaxInt64
	it, err := s.r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixScheduleDue}, UpperBound: []byte{prefixScheduleDue + 1}})
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, it.Close()) }()
	if it.First() {
		e, ok := parseScheduleDueKey(it.Key())
		if !ok {
			return 0, fmt.Errorf("%w: schedule index key %q", ErrCorruptRecord, it.Key())
		}
		at = e.At
	}
	return at, it.Error()
}

// policy is kind's policy as the batch sees it (nil: none); ok is false when the writer
// keeps no policies in memory.
func (w *writer) policy(kind string) (p *projection.KindPolicy, ok bool) {
	if w.policies == nil {
		return nil, false
	}
	if p, in := w.policyDelta[kind]; in {
		return p, true
	}
	return w.policies[kind], true
}

// KindPolicy is kind's policy with this batch's changes (a copy: the fold changes it and puts
// it back).
func (w *writer) KindPolicy(kind string) (*projection.KindPolicy, error) {
	p, ok := w.policy(kind)
	if !ok {
		return w.reader.KindPolicy(kind)
	}
	if p == nil {
		return nil, nil
	}
	c := *p
	return &c, nil
}

// KindPolicies walks the policies with this batch's changes in kind order, as the stored keys
// are: with none, it reads and allocates nothing.
func (w *writer) KindPolicies(fn func(*projection.KindPolicy) bool) error {
	if w.policies == nil {
		return w.reader.KindPolicies(fn)
	}
	if len(w.policies) == 0 && len(w.policyDelta) == 0 {
		return nil
	}
	kinds := slices.Collect(maps.Keys(w.policies))
	for k := range w.policyDelta {
		if _, in := w.policies[k]; !in {
			kinds = append(kinds, k)
		}
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		p, _ := w.policy(k)
		if p == nil {
			continue
		}
		c := *p
		if !fn(&c) {
			return nil
		}
	}
	return nil
}

func (w *writer) PutKindPolicy(p *projection.KindPolicy) error {
	if err := w.b.Set(idKey(prefixKindPolicy, p.Kind), encodePolicy(p), nil); err != nil {
		return err
	}
	w.notePolicy(p.Kind, p)
	return nil
}

func (w *writer) DeleteKindPolicy(kind string) error {
	if err := w.b.Delete(idKey(prefixKindPolicy, kind), nil); err != nil {
		return err
	}
	w.notePolicy(kind, nil)
	return nil
}

// notePolicy records the batch's change of kind's policy (nil: deleted).
func (w *writer) notePolicy(kind string, p *projection.KindPolicy) {
	if w.policies == nil {
		return
	}
	if w.policyDelta == nil {
		w.policyDelta = map[string]*projection.KindPolicy{}
	}
	if p != nil {
		c := *p
		p = &c
	}
	w.policyDelta[kind] = p
}

// mergePolicies applies a committed batch's changes to the committed policies.
func mergePolicies(committed, delta map[string]*projection.KindPolicy) {
	for k, p := range delta {
		if p == nil {
			delete(committed, k)
		} else {
			committed[k] = p
		}
	}
}

// ScanScheduleDue reads nothing when the committed index's earliest tick is after maxAt and
// this batch has not changed the index; otherwise it reads through the batch.
func (w *writer) ScanScheduleDue(maxAt int64, fn func(projection.ScheduleEntry) bool) error {
	if w.sched != nil && !w.schedTouched {
		if !w.sched.known {
			at, err := w.committed.firstScheduleDue()
			if err != nil {
				return err
			}
			*w.sched = schedFirst{known: true, at: at}
		}
		if w.sched.at > maxAt {
			return nil
		}
	}
	return w.reader.ScanScheduleDue(maxAt, fn)
}

func (w *writer) PutScheduleDue(e projection.ScheduleEntry) error {
	w.schedTouched = true
	return w.b.Set(scheduleDueKey(e), nil, nil)
}

func (w *writer) DeleteScheduleDue(e projection.ScheduleEntry) error {
	w.schedTouched = true
	return w.b.Delete(scheduleDueKey(e), nil)
}
