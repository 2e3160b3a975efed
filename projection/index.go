package projection

import (
	"fmt"

	"github.com/google/btree"
)

// Index names one of the fold's eligibility indexes. Every State keeps each of them through
// the same three methods (Reader.ScanIndex, State.PutIndex, State.DeleteIndex): an index is a
// row of Indexes here and a row of each store's own table (Mem: memIndex; pebblelog: its key
// prefix; postgres: its table), not a pair of methods on every State. A scan reads the
// entries with At in a range [from, to]: the eligibility indexes are read up to a now
// (from: math.MinInt64), the lease index from just after one (ScanLeases).
//
// An index is split into partitions by a string (the kind of IndexKindDue, the session of
// IndexSessionWakes; "" for an index of one partition): a scan reads one partition, so its
// cost does not depend on the entries of the others.
type Index uint8

const (
	// IndexDue holds the tasks a claim may take: a task's DueEntry at EligibleAt, in claim
	// order (priority first).
	IndexDue Index = iota
	// IndexKindDue is IndexDue again under each task's kind (ClaimKinds).
	IndexKindDue
	// IndexWakes holds the available wakes: (AvailableAt, RecordSeq), priority 0.
	IndexWakes
	// IndexSessionWakes is IndexWakes again under each wake's session (ClaimSessionWakes).
	IndexSessionWakes
	// IndexKindLeases holds each kind's running tasks by lease expiry (Task.LeaseEntry),
	// priority 0: the tasks a kind's MaxRunning counts are those whose lease expires after
	// the claim's now (ScanLeases).
	IndexKindLeases

	// NumIndexes is the number of indexes.
	NumIndexes
)

// IndexSpec describes an index, for the stores that keep it.
type IndexSpec struct {
	// Name names the index in differences and errors ("due index").
	Name string
	// Part names what partitions it ("kind", "session"), or "" for one partition.
	Part string
	// Priority: entries carry the task's priority (IndexEntry.Pri) and a scan walks them
	// priority by priority, from the highest (claim order). Otherwise every entry has
	// priority 0 and a scan walks them in (At, Seq) order.
	Priority bool
}

// Indexes describes every index.
var Indexes = [NumIndexes]IndexSpec{
	IndexDue:          {Name: "due index", Priority: true},
	IndexKindDue:      {Name: "due index", Part: "kind", Priority: true},
	IndexWakes:        {Name: "wake index"},
	IndexSessionWakes: {Name: "wake index", Part: "session"},
	IndexKindLeases:   {Name: "lease index", Part: "kind"},
}

// Describe names a partition of an index, as Diff does: "due index of kind \"k\"".
func (ix Index) Describe(part string) string {
	s := Indexes[ix]
	if s.Part == "" {
		return s.Name
	}
	return fmt.Sprintf("%s of %s %q", s.Name, s.Part, part)
}

// Placement is an index and a partition of it.
type Placement struct {
	Index Index
	Part  string
}

// TaskIndexes are the indexes that hold a due task's entry (DueEntry): Apply puts and deletes
// the entry in all of them at once, so they always hold the same tasks at the same keys.
func TaskIndexes(t *Task) [2]Placement {
	return [2]Placement{{IndexDue, ""}, {IndexKindDue, t.Kind}}
}

// WakeIndexes are the indexes that hold an available wake's entry (WakeEntry), like
// TaskIndexes.
func WakeIndexes(w *Wake) [2]Placement {
	return [2]Placement{{IndexWakes, ""}, {IndexSessionWakes, w.SessionID}}
}

// WakeEntry is w's entry in the wake indexes when it is available at at.
func (w *Wake) WakeEntry(at int64) IndexEntry {
	return IndexEntry{At: at, Seq: w.RecordSeq, ID: w.ID}
}

// memIndex is one index of a Mem: a B-tree per partition. A partition's tree is dropped once
// empty, so the map holds only partitions with entries; the trees share one free list, so a
// partition that empties and fills again (a kind with one pending task at a time) reuses its
// nodes. last is the partition used last: a fold sees runs of events of one kind or session.
type memIndex struct {
	parts    map[string]*btree.BTreeG[IndexEntry]
	free     *btree.FreeListG[IndexEntry]
	lastPart string
	last     *btree.BTreeG[IndexEntry] // parts[lastPart], or nil
}

func newMemIndex() memIndex {
	return memIndex{parts: map[string]*btree.BTreeG[IndexEntry]{}, free: btree.NewFreeListG[IndexEntry](btree.DefaultFreeListSize)}
}

// tree returns part's tree, made on first use when create is set (nil otherwise).
func (x *memIndex) tree(part string, create bool) *btree.BTreeG[IndexEntry] {
	if x.last != nil && x.lastPart == part {
		return x.last
	}
	t := x.parts[part]
	if t == nil {
		if !create {
			return nil
		}
		t = btree.NewWithFreeListG(16, IndexEntry.Less, x.free)
		x.parts[part] = t
	}
	x.lastPart, x.last = part, t
	return t
}

// ScanIndex walks the partition's tree (scanDue: both orders are IndexEntry.Less, and a
// partition of priority-0 entries is one run).
func (m *Mem) ScanIndex(ix Index, part string, from, to int64, fn func(IndexEntry) bool) error {
	m.BuildIndexes()
	if t := m.idx[ix].tree(part, false); t != nil {
		scanDue(t, from, to, fn)
	}
	return nil
}

// The index writes do nothing while the indexes are deferred: BuildIndexes derives them.

func (m *Mem) PutIndex(ix Index, part string, e IndexEntry) error {
	if !m.deferred {
		m.idx[ix].tree(part, true).ReplaceOrInsert(e)
	}
	return nil
}

func (m *Mem) DeleteIndex(ix Index, part string, e IndexEntry) error {
	if m.deferred {
		return nil
	}
	x := &m.idx[ix]
	if t := x.tree(part, false); t != nil {
		t.Delete(e)
		if t.Len() == 0 {
			delete(x.parts, part)
			x.last = nil
		}
	}
	return nil
}

// buildIndexes rebuilds every index from the records (BuildIndexes): each is a function of
// them (TaskIndexes, WakeIndexes, Task.LeaseEntry).
func (m *Mem) buildIndexes() {
	var by [NumIndexes]map[string][]IndexEntry
	for ix := range by {
		by[ix] = map[string][]IndexEntry{}
	}
	for _, t := range m.tasks {
		if at, ok := t.EligibleAt(); ok {
			e := t.DueEntry(at)
			for _, p := range TaskIndexes(t) {
				by[p.Index][p.Part] = append(by[p.Index][p.Part], e)
			}
		}
		if e, ok := t.LeaseEntry(); ok {
			by[IndexKindLeases][t.Kind] = append(by[IndexKindLeases][t.Kind], e)
		}
	}
	for _, w := range m.wakes {
		if at, ok := w.AvailableAt(); ok {
			e := w.WakeEntry(at)
			for _, p := range WakeIndexes(w) {
				by[p.Index][p.Part] = append(by[p.Index][p.Part], e)
			}
		}
	}
	for ix := range by {
		x := newMemIndex()
		for part, es := range by[ix] {
			x.parts[part] = sortedTree(es, x.free)
		}
		m.idx[ix] = x
	}
}

// diffIndexes is Diff for the indexes; a partition with no entry equals one the other state
// never saw.
func (m *Mem) diffIndexes(o *Mem) []string {
	var out []string
	empty := newIndex()
	for ix := range NumIndexes {
		a, b := m.idx[ix].parts, o.idx[ix].parts
		for _, part := range unionKeys(a, b) {
			x, y := a[part], b[part]
			if x == nil {
				x = empty
			}
			if y == nil {
				y = empty
			}
			out = append(out, diffIndex(ix.Describe(part), x, y)...)
		}
	}
	return out
}
