package projection

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/google/btree"

	"github.com/worklog/worklog/events"
)

// Retention: what may be pruned, decided here once for every backend (docs/design.md,
// "Retention"). A subject is prunable from a time (PruneAt) and is pruned by a call with a
// before later than that time:
//
//   - a terminal task without a completion wake, from its FinishedAt;
//   - a terminal task with its completion wake, once that wake is acknowledged, from the later
//     of FinishedAt and the acknowledgment (the task and its wake go together);
//   - a requested (direct) wake, once acknowledged, from its AckedAt.
//
// Unfinished tasks and unacknowledged wakes are never prunable, nor is a task while a
// completion wake of an earlier run, detached from it by a retry, is unacknowledged
// (Task.UnackedEarlierWakes). A task's current completion wake is no subject of its own: it
// goes with its task; a detached one is, once acknowledged (Wake.DetachedPruneAt). The task of a schedule's latest tick is held
// while it is the latest (PruneHeld, schedules.go): its task_submitted holds the cursor.

// PruneAt is the time from which t is prunable together with w, its completion wake (nil
// when it has none or it is unknown), and whether it is prunable at all.
func (t *Task) PruneAt(w *Wake) (int64, bool) {
	if !t.State.Terminal() || t.UnackedEarlierWakes > 0 {
		return 0, false
	}
	if !t.WakeOnCompletion {
		return t.FinishedAt, true
	}
	if t.CompletionWakeID == "" || w == nil || w.ID != t.CompletionWakeID || !w.Acked {
		return 0, false
	}
	return max(t.FinishedAt, w.AckedAt), true
}

// PruneAt is the time from which a requested wake is prunable (its acknowledgment), and
// whether it is prunable on its own at all: a completion wake is pruned with its task.
func (w *Wake) PruneAt() (int64, bool) {
	if w.Reason != events.WakeRequested || !w.Acked {
		return 0, false
	}
	return w.AckedAt, true
}

// DetachedPruneAt is the time from which a completion wake is prunable on its own, and
// whether it is: when t, its task, no longer names it as its completion wake because the task
// was retried after it was recorded (events.TaskRetried), and once it is acknowledged (until
// then its task counts it, Task.UnackedEarlierWakes, and is not prunable either). Such a wake
// is prunable at once, by any prune (math.MinInt64): retention takes subjects oldest first,
// so it always goes before (or with) its task, whatever times the callers gave, and no
// retained event ever names a pruned task. The task's current completion wake goes with the
// task (Task.PruneAt).
func (w *Wake) DetachedPruneAt(t *Task) (int64, bool) {
	if w.Reason != events.WakeTaskFinished || !w.Acked {
		return 0, false
	}
	if t != nil && t.CompletionWakeID == w.ID {
		return 0, false
	}
	return math.MinInt64, true
}

// PrunableBefore reports whether a subject prunable from at is pruned by a Prune(before):
// strictly before, as the spec says ("finished before before").
func PrunableBefore(at, before int64) bool { return at < before }

// PruneEntry is one entry of the retention index: a subject that became prunable at At.
// Entries are ordered by (At, Seq); Seq is the task's SubmitSeq or the wake's RecordSeq.
type PruneEntry struct {
	At   int64
	Seq  uint64
	ID   string
	Wake bool // a requested wake; false: a task (with its completion wake, if any)
}

func comparePruneEntries(a, b PruneEntry) int {
	return cmp.Or(cmp.Compare(a.At, b.At), cmp.Compare(a.Seq, b.Seq))
}

// PruneIndexer is a State that keeps the retention index. Apply puts a subject's entry when
// it becomes prunable; a State without it (a backend that finds prunable work its own way)
// keeps none. The type assertion costs only where a task ends or a wake is acknowledged.
type PruneIndexer interface {
	PutPrunable(PruneEntry) error
	// DeletePrunable removes an entry: a retried task is no longer prunable.
	DeletePrunable(PruneEntry) error
}

// PruneState is a State that can prune: it reads the retention index and removes records.
// Prune removes a subject through it (PruneSubject), so every backend removes the same keys.
type PruneState interface {
	State
	PruneIndexer
	// ScanPrunable calls fn with the retention index's entries with At < before, in order,
	// until fn returns false, passing over the entries PruneHeld holds (a schedule's latest
	// tick): they stay in the index, but no prune takes them while they are held.
	ScanPrunable(before int64, fn func(PruneEntry) bool) error
	DeleteTask(id string) error
	DeleteWake(id string) error
	DeleteTaskKey(sessionID, key string) error
	DeleteWakeKey(sessionID, key string) error
	DeleteSessionTask(sessionID string, submitSeq uint64) error
}

// indexPrunableTask puts t's entry into the retention index if t is prunable now, with w its
// completion wake (nil when it has none).
func indexPrunableTask(s State, t *Task, w *Wake) error {
	p, ok := s.(PruneIndexer)
	if !ok {
		return nil
	}
	at, ok := t.PruneAt(w)
	if !ok {
		return nil
	}
	return p.PutPrunable(PruneEntry{At: at, Seq: t.SubmitSeq, ID: t.ID})
}

// indexPrunableWake is called when w has just been acknowledged: a requested wake enters the
// index; a completion wake makes its task prunable. A completion wake of an earlier run
// (detached by a retry while unacknowledged: checked by detachedAckRule first) is counted
// off its task and enters the index on its own, and the task enters it once it counts no
// such wake and is otherwise prunable. t is w's task for a completion wake (nil when the
// fold has none: a fold of part of the log).
func indexPrunableWake(s State, w *Wake, t *Task) error {
	if w.Reason == events.WakeTaskFinished && t != nil && t.CompletionWakeID != w.ID {
		t.UnackedEarlierWakes--
		if err := s.TaskEdited(t); err != nil {
			return err
		}
	}
	p, ok := s.(PruneIndexer)
	if !ok {
		return nil
	}
	if at, ok := w.PruneAt(); ok {
		return p.PutPrunable(PruneEntry{At: at, Seq: w.RecordSeq, ID: w.ID, Wake: true})
	}
	if w.Reason != events.WakeTaskFinished || t == nil {
		return nil
	}
	if t.CompletionWakeID == w.ID {
		return indexPrunableTask(s, t, w)
	}
	if at, ok := w.DetachedPruneAt(t); ok {
		if err := p.PutPrunable(PruneEntry{At: at, Seq: w.RecordSeq, ID: w.ID, Wake: true}); err != nil {
			return err
		}
	}
	if t.UnackedEarlierWakes > 0 {
		return nil
	}
	var cw *Wake // the task's current completion wake, if any; read only
	if t.CompletionWakeID != "" {
		var err error
		if cw, err = s.EditWake(t.CompletionWakeID); err != nil {
			return err
		}
	}
	return indexPrunableTask(s, t, cw)
}

// ErrPruneIndex marks a retention index entry that does not match its record: damage, or a
// fold that kept the index wrongly. Prune stops rather than remove the wrong thing.
var ErrPruneIndex = errors.New("projection: retention index entry does not match its record")

// Pruned is what PruneSubject removed: the subject's records, and where its events are.
type Pruned struct {
	SessionID string
	TaskID    string // "" when the subject is a wake
	WakeID    string // the wake, or the task's completion wake; "" when none
	// FirstSeq and LastSeq bound the subject's events: every event of the task and its
	// wake lies in [FirstSeq, LastSeq] (its creation and the last event that changed it).
	FirstSeq, LastSeq uint64
}

// Has reports whether the event with this subject (events.Event.Subject) belongs to p.
func (p *Pruned) Has(taskID, wakeID string) bool {
	return (taskID != "" && taskID == p.TaskID) || (wakeID != "" && wakeID == p.WakeID)
}

// PruneSubject removes the subject of e, which must be prunable before before, from s: its
// records, its idempotency key, its session list entry, its count, its retention entry.
// Terminal tasks and acknowledged wakes are in no eligibility index. The caller removes the
// subject's events (Pruned says where they are).
func PruneSubject(s PruneState, e PruneEntry, before int64) (Pruned, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s (at %d, seq %d): %s", ErrPruneIndex, e.ID, e.At, e.Seq, fmt.Sprintf(format, args...))
	}
	if !PrunableBefore(e.At, before) {
		return Pruned{}, bad("not prunable before %d", before)
	}
	if e.Wake {
		w, err := s.EditWake(e.ID)
		if err != nil {
			return Pruned{}, err
		}
		if w == nil {
			return Pruned{}, bad("no such wake")
		}
		at, ok := w.PruneAt()
		if !ok && w.Reason == events.WakeTaskFinished { // a retried task's earlier completion wake
			t, err := s.EditTask(w.TaskID)
			if err != nil {
				return Pruned{}, err
			}
			at, ok = w.DetachedPruneAt(t)
		}
		if !ok || at != e.At || w.RecordSeq != e.Seq {
			return Pruned{}, bad("the wake is not prunable from then")
		}
		if err := removeWake(s, w); err != nil {
			return Pruned{}, err
		}
		if err := s.DeletePrunable(e); err != nil {
			return Pruned{}, err
		}
		return Pruned{SessionID: w.SessionID, WakeID: w.ID, FirstSeq: w.RecordSeq, LastSeq: w.UpdatedSeq}, nil
	}
	t, err := s.EditTask(e.ID)
	if err != nil {
		return Pruned{}, err
	}
	if t == nil {
		return Pruned{}, bad("no such task")
	}
	var w *Wake
	if t.CompletionWakeID != "" {
		if w, err = s.EditWake(t.CompletionWakeID); err != nil {
			return Pruned{}, err
		}
		if w == nil {
			return Pruned{}, bad("its completion wake %s is missing", t.CompletionWakeID)
		}
	}
	if at, ok := t.PruneAt(w); !ok || at != e.At || t.SubmitSeq != e.Seq {
		return Pruned{}, bad("the task is not prunable from then")
	}
	if err := pruneTick(s, t, bad); err != nil {
		return Pruned{}, err
	}
	p := Pruned{SessionID: t.SessionID, TaskID: t.ID, FirstSeq: t.SubmitSeq, LastSeq: t.UpdatedSeq}
	if t.IdempotencyKey != "" {
		// The key is freed only if it still names this task (it always does: a key is freed
		// only with its task).
		if id, err := s.TaskKey(t.SessionID, t.IdempotencyKey); err != nil {
			return Pruned{}, err
		} else if id == t.ID {
			if err := s.DeleteTaskKey(t.SessionID, t.IdempotencyKey); err != nil {
				return Pruned{}, err
			}
		}
	}
	if err := s.DeleteSessionTask(t.SessionID, t.SubmitSeq); err != nil {
		return Pruned{}, err
	}
	if err := s.AddCount(t.Kind, t.State, -1); err != nil {
		return Pruned{}, err
	}
	if err := s.DeleteTask(t.ID); err != nil {
		return Pruned{}, err
	}
	if w != nil {
		if err := removeWake(s, w); err != nil {
			return Pruned{}, err
		}
		p.WakeID = w.ID
		p.LastSeq = max(p.LastSeq, w.UpdatedSeq)
	}
	if err := s.DeletePrunable(e); err != nil {
		return Pruned{}, err
	}
	return p, nil
}

func removeWake(s PruneState, w *Wake) error {
	if w.Reason == events.WakeRequested && w.IdempotencyKey != "" {
		id, err := s.WakeKey(w.SessionID, w.IdempotencyKey)
		if err != nil {
			return err
		}
		if id == w.ID {
			if err := s.DeleteWakeKey(w.SessionID, w.IdempotencyKey); err != nil {
				return err
			}
		}
	}
	return s.DeleteWake(w.ID)
}

// SeqRange is a closed range of sequence numbers, [From, To].
type SeqRange struct{ From, To uint64 }

// SeqRanges is a set of sequence numbers as sorted, disjoint, coalesced ranges: the pruned
// part of a log. Two ranges never touch (a range ending at n and one starting at n+1 are one).
type SeqRanges []SeqRange

// Add adds [from, to] (from <= to, disjoint from the set) and coalesces it with its
// neighbours.
func (r *SeqRanges) Add(from, to uint64) {
	rs := *r
	i, _ := slices.BinarySearchFunc(rs, from, func(x SeqRange, f uint64) int { return cmp.Compare(x.From, f) })
	// i: the first range starting after from.
	mergeLeft := i > 0 && rs[i-1].To+1 >= from
	mergeRight := i < len(rs) && to+1 >= rs[i].From
	switch {
	case mergeLeft && mergeRight:
		rs[i-1].To = max(rs[i].To, to)
		rs = slices.Delete(rs, i, i+1)
	case mergeLeft:
		rs[i-1].To = max(rs[i-1].To, to)
	case mergeRight:
		rs[i].From = from
		rs[i].To = max(rs[i].To, to)
	default:
		rs = slices.Insert(rs, i, SeqRange{from, to})
	}
	*r = rs
}

// Contains reports whether seq is in the set.
func (r SeqRanges) Contains(seq uint64) bool {
	i, found := slices.BinarySearchFunc(r, seq, func(x SeqRange, s uint64) int { return cmp.Compare(x.From, s) })
	if found {
		return true
	}
	return i > 0 && r[i-1].To >= seq
}

// Count is the number of sequences in the set.
func (r SeqRanges) Count() uint64 {
	var n uint64
	for _, x := range r {
		n += x.To - x.From + 1
	}
	return n
}

// RunsOf turns sorted, distinct sequences into coalesced ranges.
func RunsOf(seqs []uint64) []SeqRange {
	var out []SeqRange
	for _, s := range seqs {
		if n := len(out); n > 0 && out[n-1].To+1 == s {
			out[n-1].To = s
			continue
		}
		out = append(out, SeqRange{s, s})
	}
	return out
}

// Mem's side of retention: a B-tree of entries, derived from the records like every index
// (buildPrune) while indexes are deferred.

func newPruneIndex() *btree.BTreeG[PruneEntry] {
	return btree.NewG(16, func(a, b PruneEntry) bool { return comparePruneEntries(a, b) < 0 })
}

func (m *Mem) PutPrunable(e PruneEntry) error {
	m.pruneKept = true
	if !m.deferred {
		m.prune.ReplaceOrInsert(e)
	}
	return nil
}

func (m *Mem) DeletePrunable(e PruneEntry) error {
	m.pruneKept = true
	if !m.deferred {
		m.prune.Delete(e)
	}
	return nil
}

// ScanPrunable passes over held entries (PruneHeld).
func (m *Mem) ScanPrunable(before int64, fn func(PruneEntry) bool) error {
	m.BuildIndexes()
	var err error
	m.prune.Ascend(func(e PruneEntry) bool {
		if !PrunableBefore(e.At, before) {
			return false
		}
		var held bool
		if t := m.tasks[e.ID]; !e.Wake && t != nil { // PruneHeld without Task's copy
			if _, held, err = LatestTick(m, t); err != nil {
				return false
			}
		}
		return held || fn(e)
	})
	return err
}

func (m *Mem) DeleteTask(id string) error { delete(m.tasks, id); return nil }
func (m *Mem) DeleteWake(id string) error { delete(m.wakes, id); return nil }

func (m *Mem) DeleteTaskKey(sessionID, key string) error {
	delete(m.taskKeys, sessionKey{sessionID, key})
	return nil
}

func (m *Mem) DeleteWakeKey(sessionID, key string) error {
	delete(m.wakeKeys, sessionKey{sessionID, key})
	return nil
}

func (m *Mem) DeleteSessionTask(sessionID string, submitSeq uint64) error {
	if m.deferred {
		return nil
	}
	l := m.sessions[sessionID]
	if l == nil {
		return nil
	}
	i, found := slices.BinarySearchFunc(l.tasks, submitSeq, func(x sessionTask, seq uint64) int { return cmp.Compare(x.seq, seq) })
	if found {
		l.tasks = slices.Delete(l.tasks, i, i+1)
	}
	if len(l.tasks) == 0 {
		delete(m.sessions, sessionID) // memory follows live work: no empty lists left behind
		if m.lastSession == l {
			m.lastSession = nil // the next submit of the session must not append to the dropped list
		}
	}
	return nil
}

// buildPrune derives the retention index from the records (BuildIndexes).
func (m *Mem) buildPrune() {
	var es []PruneEntry
	for _, t := range m.tasks {
		if at, ok := t.PruneAt(m.wakes[t.CompletionWakeID]); ok {
			es = append(es, PruneEntry{At: at, Seq: t.SubmitSeq, ID: t.ID})
		}
	}
	for _, w := range m.wakes {
		at, ok := w.PruneAt()
		if !ok && w.Reason == events.WakeTaskFinished {
			at, ok = w.DetachedPruneAt(m.tasks[w.TaskID])
		}
		if ok {
			es = append(es, PruneEntry{At: at, Seq: w.RecordSeq, ID: w.ID, Wake: true})
		}
	}
	slices.SortFunc(es, comparePruneEntries)
	m.prune, m.pruneKept = newPruneIndex(), true
	for _, e := range es {
		m.prune.ReplaceOrInsert(e)
	}
}

// diffPrune compares two retention indexes.
func diffPrune(a, b *btree.BTreeG[PruneEntry]) []string {
	var out []string
	a.Ascend(func(e PruneEntry) bool {
		if g, ok := b.Get(e); !ok || g != e {
			out = append(out, fmt.Sprintf("retention index (%d, %d, %s): missing on the right", e.At, e.Seq, e.ID))
		}
		return true
	})
	b.Ascend(func(e PruneEntry) bool {
		if g, ok := a.Get(e); !ok || g != e {
			out = append(out, fmt.Sprintf("retention index (%d, %d, %s): missing on the left", e.At, e.Seq, e.ID))
		}
		return true
	})
	return out
}
