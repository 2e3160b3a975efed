package projection

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/google/btree"

	"github.com/worklog/worklog/events"
)

type sessionKey struct{ session, key string }

// Mem is State in memory: maps for records and keys, B-trees for the eligibility indexes.
// It is not safe for concurrent use; its owner serialises access.
type Mem struct {
	tasks    map[string]*Task
	wakes    map[string]*Wake
	taskKeys map[sessionKey]string
	wakeKeys map[sessionKey]string
	idx      [NumIndexes]memIndex      // the eligibility indexes (index.go)
	prune    *btree.BTreeG[PruneEntry] // the retention index (prune.go)
	// pruneKept: this Mem keeps the retention index (Apply put or deleted an entry, or
	// BuildIndexes derived it). A Mem loaded record by record from another store (the
	// PostgreSQL backend's Verify) keeps none, and Diff then does not compare it.
	pruneKept bool
	lastSeq   uint64

	// The counts and session task lists (mem_kinds_sessions.go): per kind, the number of its
	// tasks in each state; per session, its tasks in submission order. lastKind and
	// lastSession are the last looked up: a session often submits several tasks in a row,
	// and a move touches its kind's counts twice.
	kinds       map[string]*kindIndex
	lastKind    *kindIndex
	sessions    map[string]*sessionList
	lastSession *sessionList
	// The schedules and their index by next tick (mem_schedules.go); made on first use.
	schedules map[sessionKey]*Schedule
	schedDue  *btree.BTreeG[ScheduleEntry]
	// policies: the kind policies (mem_kind_policies.go).
	policies map[string]*KindPolicy

	// Unused records for the next submissions and wakes (see NewTask).
	taskChunk []Task
	wakeChunk []Wake

	// deferred: the indexes are not kept up to date (see DeferIndexes).
	deferred bool
}

// NewMem returns an empty state.
func NewMem() *Mem { return NewMemSized(0, 0) }

// NewMemSized returns an empty state with room for about tasks tasks and wakes wakes, for a
// caller that knows roughly how much it will fold (a rebuild knows the length of the log):
// the record maps then never grow and rehash. Both are hints; 0 means unknown.
func NewMemSized(tasks, wakes int) *Mem {
	m := &Mem{
		tasks:    make(map[string]*Task, max(tasks, 0)),
		wakes:    make(map[string]*Wake, max(wakes, 0)),
		taskKeys: map[sessionKey]string{},
		wakeKeys: map[sessionKey]string{},
		prune:    newPruneIndex(),
		kinds:    map[string]*kindIndex{},
		sessions: map[string]*sessionList{},

		policies: map[string]*KindPolicy{},
	}
	for ix := range m.idx {
		m.idx[ix] = newMemIndex()
	}
	return m
}

// Task returns a copy of the record; callers may change it freely.
func (m *Mem) Task(id string) (*Task, error) {
	t, ok := m.tasks[id]
	if !ok {
		return nil, nil
	}
	c := *t
	return &c, nil
}

func (m *Mem) Wake(id string) (*Wake, error) {
	w, ok := m.wakes[id]
	if !ok {
		return nil, nil
	}
	c := *w
	return &c, nil
}

func (m *Mem) TaskKey(sessionID, key string) (string, error) {
	return m.taskKeys[sessionKey{sessionID, key}], nil
}

func (m *Mem) WakeKey(sessionID, key string) (string, error) {
	return m.wakeKeys[sessionKey{sessionID, key}], nil
}

// DeferIndexes stops the upkeep of the indexes (the due and wake indexes, the per-kind due
// indexes and counts, the session task lists) until BuildIndexes, which rebuilds them all
// from the records: each is a function of the records (Task.EligibleAt, Wake.AvailableAt,
// Task.Kind, State, SessionID and SubmitSeq), so the result is the same as keeping them all
// along. It is for a bulk fold that reads no index on the way (a rebuild, a time-travel
// fold): keeping a B-tree of every pending task in order, entry by entry, was a fifth of the
// time of folding a log where a million tasks were pending at once. Every index read and Diff
// call BuildIndexes first; a Mem shared by concurrent readers must have its indexes built
// before it is shared.
func (m *Mem) DeferIndexes() { m.deferred = true }

// BuildIndexes rebuilds every index from the records if DeferIndexes stopped their upkeep,
// and resumes it. It does nothing otherwise.
func (m *Mem) BuildIndexes() {
	if !m.deferred {
		return
	}
	m.deferred = false
	m.buildIndexes()
	m.buildKindsSessions()
	m.buildPrune()
}

func newIndex() *btree.BTreeG[IndexEntry] { return btree.NewG(16, IndexEntry.Less) }

// sortedTree returns a B-tree of the entries, with the free list free. Inserting them in
// order is the cheap case of the B-tree's insert (always into the rightmost leaf).
func sortedTree(es []IndexEntry, free *btree.FreeListG[IndexEntry]) *btree.BTreeG[IndexEntry] {
	slices.SortFunc(es, compareEntries)
	t := btree.NewWithFreeListG(16, IndexEntry.Less, free)
	for _, e := range es {
		t.ReplaceOrInsert(e)
	}
	return t
}

// scanDue calls fn with t's entries with At in [from, to] in claim order (priority
// descending, then At, then Seq), until fn returns false. The tree is in that order, so the
// entries of one priority are a run in At order: the scan walks a run from its first entry at
// or after from while its entries are at or before to and, at the first that is not, jumps
// to the start of the next lower priority present (a seek). Its cost is O(p · log n +
// entries seen), p the priorities present: a future entry of a high priority does not hide
// the due ones of lower priorities.
func scanDue(t *btree.BTreeG[IndexEntry], from, to int64, fn func(IndexEntry) bool) {
	if from > to {
		return
	}
	pivot, first := IndexEntry{Pri: math.MaxInt64, At: from}, from == math.MinInt64
	for {
		var next IndexEntry
		jump, stop := false, false
		visit := func(e IndexEntry) bool {
			if e.At < from || e.At > to {
				next, jump = e, true
				return false
			}
			stop = !fn(e)
			return !stop
		}
		if first {
			t.Ascend(visit)
			first = false
		} else {
			t.AscendGreaterOrEqual(pivot, visit)
		}
		if stop || !jump {
			return
		}
		if next.At < from { // a run's entries before from: its first at or after from
			pivot = IndexEntry{Pri: next.Pri, At: from}
			continue
		}
		if next.Pri == math.MinInt64 {
			return
		}
		pivot = IndexEntry{Pri: next.Pri - 1, At: from}
	}
}

func (m *Mem) LastSeq() (uint64, error) { return m.lastSeq, nil }

// PutTask stores t itself: the caller hands it over and must not change it afterwards.
// Apply puts only new records; it changes stored ones in place (EditTask).
func (m *Mem) PutTask(t *Task) error {
	m.tasks[t.ID] = t
	return nil
}

// PutWake stores w itself, like PutTask.
func (m *Mem) PutWake(w *Wake) error {
	m.wakes[w.ID] = w
	return nil
}

func (m *Mem) PutTaskKey(sessionID, key, taskID string) error {
	m.taskKeys[sessionKey{sessionID, key}] = taskID
	return nil
}

func (m *Mem) PutWakeKey(sessionID, key, wakeID string) error {
	m.wakeKeys[sessionKey{sessionID, key}] = wakeID
	return nil
}

func (m *Mem) SetLastSeq(seq uint64) error { m.lastSeq = seq; return nil }

// Len returns the number of tasks and wakes.
func (m *Mem) Len() (tasks, wakes int) { return len(m.tasks), len(m.wakes) }

// Tasks returns copies of all task records, ordered by submission.
func (m *Mem) Tasks() []Task {
	out := make([]Task, 0, len(m.tasks))
	for _, t := range m.tasks {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SubmitSeq < out[j].SubmitSeq })
	return out
}

// Wakes returns copies of all wake records, ordered by creation.
func (m *Mem) Wakes() []Wake {
	out := make([]Wake, 0, len(m.wakes))
	for _, w := range m.wakes {
		out = append(out, *w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RecordSeq < out[j].RecordSeq })
	return out
}

// Diff compares two states and describes every difference, in a stable order: records by
// id and field, keys, index entries, the counts, the session task lists. An empty result means equal.
func (m *Mem) Diff(o *Mem) []string {
	m.BuildIndexes()
	o.BuildIndexes()
	var out []string
	if m.lastSeq != o.lastSeq {
		out = append(out, fmt.Sprintf("last_seq: %d vs %d", m.lastSeq, o.lastSeq))
	}
	out = append(out, diffMaps("task", m.tasks, o.tasks)...)
	out = append(out, diffMaps("wake", m.wakes, o.wakes)...)
	return append(out, m.diffAfterRecords(o)...)
}

// DiffStored is stored.Diff(m) for a stored state too large to hold: stored holds
// everything but the records (keys, indexes, session lists, counts, the retention index,
// the last sequence), and tasks and wakes call their fn with each stored record, in id order
// (bytewise), one at a time — a store's scan, page by page. Only m's records are held, and a
// sorted list of their ids. It says what Diff would, in the same order; an error of tasks or
// wakes (other than fn's, which never fails) is returned as it is.
func (m *Mem) DiffStored(stored *Mem, tasks func(fn func(*Task) error) error, wakes func(fn func(*Wake) error) error) ([]string, error) {
	stored.BuildIndexes()
	m.BuildIndexes()
	var out []string
	if stored.lastSeq != m.lastSeq {
		out = append(out, fmt.Sprintf("last_seq: %d vs %d", stored.lastSeq, m.lastSeq))
	}
	t, err := diffStream("task", m.tasks, func(t *Task) string { return t.ID }, tasks)
	if err != nil {
		return nil, err
	}
	w, err := diffStream("wake", m.wakes, func(w *Wake) string { return w.ID }, wakes)
	if err != nil {
		return nil, err
	}
	out = append(append(out, t...), w...)
	return append(out, stored.diffAfterRecords(m)...), nil
}

// diffStream is diffMaps(what, stored, mine) for stored records read one at a time in id
// order by each: a merge with mine's sorted ids.
func diffStream[T any](what string, mine map[string]*T, id func(*T) string, each func(func(*T) error) error) ([]string, error) {
	ids := make([]string, 0, len(mine))
	for k := range mine {
		ids = append(ids, k)
	}
	sort.Strings(ids)
	var out []string
	i := 0
	err := each(func(x *T) error {
		xid := id(x)
		for ; i < len(ids) && ids[i] < xid; i++ {
			out = append(out, fmt.Sprintf("%s %s: missing on the left", what, ids[i]))
		}
		if i < len(ids) && ids[i] == xid {
			out = append(out, DiffRecords(what+" "+xid, x, mine[xid])...)
			i++
		} else {
			out = append(out, fmt.Sprintf("%s %s: missing on the right", what, xid))
		}
		return nil
	})
	for ; i < len(ids); i++ {
		out = append(out, fmt.Sprintf("%s %s: missing on the left", what, ids[i]))
	}
	return out, err
}

// diffAfterRecords is Diff after the records: keys, indexes, session lists, counts, schedules,
// retention.
func (m *Mem) diffAfterRecords(o *Mem) []string {
	var out []string
	out = append(out, diffKeys("task key", m.taskKeys, o.taskKeys)...)
	out = append(out, diffKeys("wake key", m.wakeKeys, o.wakeKeys)...)
	out = append(out, m.diffIndexes(o)...)
	out = append(out, m.diffKindsSessions(o)...)
	out = append(out, m.diffSchedules(o)...)
	out = append(out, m.diffKindPolicies(o)...)
	if m.pruneKept && o.pruneKept {
		out = append(out, diffPrune(m.prune, o.prune)...)
	}
	return out
}

// Equal reports whether two states are the same.
func (m *Mem) Equal(o *Mem) bool { return len(m.Diff(o)) == 0 }

func diffMaps[T any](what string, a, b map[string]*T) []string {
	var out []string
	ids := make([]string, 0, len(a)+len(b))
	for id := range a {
		ids = append(ids, id)
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		x, y := a[id], b[id]
		switch {
		case x == nil:
			out = append(out, fmt.Sprintf("%s %s: missing on the left", what, id))
		case y == nil:
			out = append(out, fmt.Sprintf("%s %s: missing on the right", what, id))
		default:
			out = append(out, DiffRecords(what+" "+id, x, y)...)
		}
	}
	return out
}

// DiffRecords compares two records of the same type field by field.
func DiffRecords[T any](name string, a, b *T) []string {
	var out []string
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for i := 0; i < va.NumField(); i++ {
		f := va.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		x, y := va.Field(i).Interface(), vb.Field(i).Interface()
		if !reflect.DeepEqual(normalize(x), normalize(y)) {
			sx, sy := show(x), show(y)
			if strings.HasSuffix(f.Name, "Token") {
				sx, sy = redact(x), redact(y)
			}
			out = append(out, fmt.Sprintf("%s: field %s: %v vs %v", name, f.Name, sx, sy))
		}
	}
	return out
}

// normalize makes nil and empty byte slices equal: both encode as an empty msgpack bin.
func normalize(v any) any {
	switch v := v.(type) {
	case []byte:
		if len(v) == 0 {
			return []byte(nil)
		}
	case events.Outcome:
		if len(v.Output) == 0 {
			v.Output = nil
		}
		return v
	}
	return v
}

// redact hides a lease token (LeaseToken, SettledToken, AckedToken): a difference report
// ends up in errors and logs, where tokens must never appear. It still tells none from some.
func redact(v any) any {
	if v == "" {
		return `""`
	}
	return events.Redacted
}

func show(v any) any {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return v
}

func diffKeys(what string, a, b map[sessionKey]string) []string {
	var out []string
	for k, v := range a {
		if b[k] != v {
			out = append(out, fmt.Sprintf("%s (%q, %q): %s vs %q", what, k.session, k.key, v, b[k]))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("%s (%q, %q): missing on the left, right has %s", what, k.session, k.key, v))
		}
	}
	sort.Strings(out)
	return out
}

func diffIndex(what string, a, b *btree.BTreeG[IndexEntry]) []string {
	var out []string
	a.Ascend(func(e IndexEntry) bool {
		if g, ok := b.Get(e); !ok || g.ID != e.ID {
			out = append(out, fmt.Sprintf("%s (%d, %d, %s): missing on the right", what, e.At, e.Seq, e.ID))
		}
		return true
	})
	b.Ascend(func(e IndexEntry) bool {
		if g, ok := a.Get(e); !ok || g.ID != e.ID {
			out = append(out, fmt.Sprintf("%s (%d, %d, %s): missing on the left", what, e.At, e.Seq, e.ID))
		}
		return true
	})
	return out
}

// EditTask returns the stored record itself, for Apply to change in place: no copy, and
// nothing to write back (TaskEdited does nothing).
func (m *Mem) EditTask(id string) (*Task, error) { return m.tasks[id], nil }

// EditWake returns the stored record itself, like EditTask.
func (m *Mem) EditWake(id string) (*Wake, error) { return m.wakes[id], nil }

// TaskEdited does nothing: the record EditTask gave is the stored one.
func (m *Mem) TaskEdited(*Task) error { return nil }

// WakeEdited does nothing, like TaskEdited.
func (m *Mem) WakeEdited(*Wake) error { return nil }

// NewTask returns a zero record for a new task. Records are carved from chunks that grow
// with the state (to maxChunk): a rebuild makes one allocation per chunk, not per task. A
// chunk lives as long as any of its records; Apply never replaces or drops a record of a Mem,
// so none is wasted.
func (m *Mem) NewTask() *Task {
	if len(m.taskChunk) == 0 {
		m.taskChunk = make([]Task, chunkSize(len(m.tasks)))
	}
	t := &m.taskChunk[0]
	m.taskChunk = m.taskChunk[1:]
	return t
}

// NewWake returns a zero record for a new wake, like NewTask.
func (m *Mem) NewWake() *Wake {
	if len(m.wakeChunk) == 0 {
		m.wakeChunk = make([]Wake, chunkSize(len(m.wakes)))
	}
	w := &m.wakeChunk[0]
	m.wakeChunk = m.wakeChunk[1:]
	return w
}

// maxChunk records a chunk: 64 tasks are about 20 KiB.
const maxChunk = 64

func chunkSize(have int) int { return min(max(have/4, 1), maxChunk) }
