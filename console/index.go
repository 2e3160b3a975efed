package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// noState marks an event that is not about a task (a wake's), or a task state not known.
const noState = events.TaskState(255)

// nStates is the number of task states (pending, running, succeeded, failed, canceled).
const nStates = 5

// checkpointEvery is how many events apart the index keeps a copy of the counts, so that the
// counts at any past seq are a copy plus at most this many steps.
const checkpointEvery = 4096

// evRec is what the index keeps of one event: no values, no tokens, only where it sits,
// whose it is and the task state it left behind.
type evRec struct {
	seq     uint64
	at      int64
	maxAt   int64 // the largest At of this event and every one before it (for ?at=TIME)
	task    int32 // index into index.tasks, -1 for a wake's event not tied to a task
	typ     events.Type
	before  events.TaskState // the task's state before the event (noState: none yet)
	after   events.TaskState
	attempt uint32 // a claim's attempt (retries: attempt > 1)
}

type taskRec struct {
	id, session, kind string
	key               string           // its idempotency key ("" when none)
	state             events.TaskState // its state after the index's last event
	seqs              []uint64         // every event about it, its completion wake's included
}

// schedRec is one schedule of one session: its record after each event that changed it
// (schedule_set, schedule_removed, each tick's task_submitted), so that the schedules page
// reads any past seq without reading the log.
type schedRec struct {
	session, name string
	vers          []schedVer
}

type schedVer struct {
	seq uint64
	sc  projection.Schedule // Input and Headers left out
}

// polVer is a kind's policy from one kind_policy_set on.
type polVer struct {
	seq uint64
	ev  events.KindPolicySet
}

type sessRec struct {
	id       string
	firstSeq uint64
	tasks    []int32
	seqs     []uint64
}

type countsCk struct {
	pos    int // counts after evs[pos-1]
	counts map[string]*[nStates]int64
	types  [256]int64 // events by type up to here
}

type failure struct {
	seq    uint64
	at     int64
	task   int32
	reason string
}

// index is the console's own fold of the queue's log, kept up to date by reading the log
// from where it stopped (catchUp, once per request: one read of nothing when nothing is new).
// It answers what the queue's API does not: which session a task id belongs to, each task's
// and session's events, the state of every task after every event (so counts at a past seq
// are a checkpoint plus a few steps), and the recent window the charts draw. The fold is
// projection.Apply itself, into a projection.Mem: the same rules as the store.
type index struct {
	mu         sync.RWMutex
	q          *work.Queue
	mem        *projection.Mem
	sf         seqFree
	evs        []evRec
	tasks      []taskRec
	byID       map[string]int32
	byKey      map[string][]int32   // idempotency key → the tasks (of any session) submitted with it
	byKind     map[string][]int32   // kind → its tasks, in submission order
	scheds     map[string]*schedRec // session + "\x00" + name
	schedKs    []string             // the keys of scheds, sorted; rebuilt when schedDirty
	schedDirty bool
	pols       map[string][]polVer // kind → its policies, oldest first
	wakeOf     map[string]int32    // completion wake id → its task
	sess       map[string]*sessRec
	sorted     []string // session ids, sorted; rebuilt when dirty
	dirty      bool
	counts     map[string]*[nStates]int64
	cks        []countsCk
	types      map[events.Type]int64
	fails      []failure // newest last, at most maxFailures
	kinds      []string
	lastSeq    uint64
	err        error // a fold failure: the index stops there and says so

	// The fold's due indexes are built (projection.Mem.BuildIndexes) only once a page that
	// counts due tasks by kind is asked for (wantDue), at the next catchUp; they are kept up
	// from then on (dueBuilt).
	wantDue, dueBuilt atomic.Bool
}

const maxFailures = 200

func newIndex(q *work.Queue) *index {
	ix := &index{
		q: q, mem: projection.NewMem(),
		byID: map[string]int32{}, byKey: map[string][]int32{}, byKind: map[string][]int32{},
		scheds: map[string]*schedRec{}, pols: map[string][]polVer{}, wakeOf: map[string]int32{}, sess: map[string]*sessRec{},
		counts: map[string]*[nStates]int64{}, types: map[events.Type]int64{},
	}
	ix.mem.DeferIndexes()
	ix.sf.Mem = ix.mem
	return ix
}

// seqFree lets Apply fold events that are not contiguous in the global sequence (a pruned
// range, or one task's or session's events): it tells Apply that the event about to be
// applied follows the last one. Every rule reads only the records of the event's own subject
// and session, so a subset folds into exactly that subset's part of the full state.
type seqFree struct {
	*projection.Mem
	next uint64
}

func (s *seqFree) LastSeq() (uint64, error) { return s.next - 1, nil }

var errStop = errors.New("stop")

// catchUp folds every event committed since the last call.
func (ix *index) catchUp(ctx context.Context) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.err != nil {
		return ix.err
	}
	err := ix.q.ReadLog(ctx, ix.lastSeq+1, func(ev events.Event) error {
		return ix.add(ev)
	})
	if ix.wantDue.Load() && !ix.dueBuilt.Load() {
		ix.mem.BuildIndexes()
		ix.dueBuilt.Store(true)
	}
	if err != nil {
		var fe *foldError
		if errors.As(err, &fe) {
			ix.err = err
		}
		return err
	}
	return nil
}

type foldError struct {
	seq uint64
	err error
}

func (e *foldError) Error() string {
	return fmt.Sprintf("the console's fold refused event %d: %v (run replay verify)", e.seq, e.err)
}
func (e *foldError) Unwrap() error { return e.err }

func (ix *index) add(ev events.Event) error {
	h := ev.Head()
	if h.Seq <= ix.lastSeq {
		return nil
	}
	taskID, wakeID := ev.Subject()
	ti := int32(-1)
	if taskID != "" {
		if i, ok := ix.byID[taskID]; ok {
			ti = i
		}
	} else if i, ok := ix.wakeOf[wakeID]; ok {
		ti = i
	}
	if wr, ok := ev.(*events.WakeRecorded); ok && wr.Reason == events.WakeTaskFinished {
		if i, ok := ix.byID[wr.TaskID]; ok {
			ti = i
			ix.wakeOf[wr.WakeID] = i
		}
	}
	before := noState
	if taskID != "" {
		if t, _ := ix.mem.Task(taskID); t != nil {
			before = t.State
		}
	}
	ix.sf.next = h.Seq
	if err := projection.Apply(&ix.sf, ev); err != nil {
		return &foldError{seq: h.Seq, err: err}
	}
	after := before
	if taskID != "" {
		t, _ := ix.mem.Task(taskID)
		if t == nil {
			return &foldError{seq: h.Seq, err: errors.New("no task after the event")}
		}
		after = t.State
		if ti < 0 {
			ti = int32(len(ix.tasks))
			ix.tasks = append(ix.tasks, taskRec{id: taskID, session: h.SessionID, kind: t.Kind, key: t.IdempotencyKey})
			ix.byID[taskID] = ti
			ix.byKind[t.Kind] = append(ix.byKind[t.Kind], ti)
			if t.IdempotencyKey != "" {
				ix.byKey[t.IdempotencyKey] = append(ix.byKey[t.IdempotencyKey], ti)
			}
			if _, seen := ix.counts[t.Kind]; !seen {
				ix.counts[t.Kind] = new([nStates]int64)
				ix.kinds = append(ix.kinds, t.Kind)
				slices.Sort(ix.kinds)
			}
		}
	}
	// A session is what a session's event names; an event about a kind as a whole
	// (kind_policy_set) has no session (its SessionID is "") and makes none. A schedule's
	// events belong to their session and count as it.
	if info, _ := ev.Type().Info(); h.SessionID != "" && info.Subject != events.SubjectKind {
		s := ix.sess[h.SessionID]
		if s == nil {
			s = &sessRec{id: h.SessionID, firstSeq: h.Seq}
			ix.sess[h.SessionID] = s
			ix.dirty = true
		}
		s.seqs = append(s.seqs, h.Seq)
		if ev.Type() == events.TypeTaskSubmitted && ti >= 0 {
			s.tasks = append(s.tasks, ti)
		}
	}
	r := evRec{seq: h.Seq, at: h.At, maxAt: h.At, task: ti, typ: ev.Type(), before: before, after: after}
	if n := len(ix.evs); n > 0 {
		r.maxAt = max(r.maxAt, ix.evs[n-1].maxAt)
	}
	if c, ok := ev.(*events.TaskClaimed); ok {
		r.attempt = c.Attempt
	}
	if err := ix.addSchedPol(ev); err != nil {
		return &foldError{seq: h.Seq, err: err}
	}
	if ti >= 0 {
		tr := &ix.tasks[ti]
		tr.seqs = append(tr.seqs, h.Seq)
		if after != noState {
			tr.state = after
		}
		if before != after {
			c := ix.counts[tr.kind]
			if before != noState {
				c[before]--
			}
			c[after]++
		}
	}
	if st, ok := ev.(*events.TaskSettled); ok && st.Outcome.State == events.StateFailed && ti >= 0 {
		ix.fails = append(ix.fails, failure{seq: h.Seq, at: h.At, task: ti, reason: clip(st.Outcome.Error, 500)})
		if len(ix.fails) > maxFailures {
			ix.fails = slices.Delete(ix.fails, 0, len(ix.fails)-maxFailures)
		}
	}
	ix.types[ev.Type()]++
	ix.evs = append(ix.evs, r)
	ix.lastSeq = h.Seq
	if len(ix.evs)%checkpointEvery == 0 {
		ck := countsCk{pos: len(ix.evs), counts: copyCounts(ix.counts)}
		for t, n := range ix.types {
			ck.types[t] = n
		}
		ix.cks = append(ix.cks, ck)
	}
	return nil
}

func copyCounts(m map[string]*[nStates]int64) map[string]*[nStates]int64 {
	c := make(map[string]*[nStates]int64, len(m))
	for k, v := range m {
		vv := *v
		c[k] = &vv
	}
	return c
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8Start(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// pos is the number of retained events with seq <= seq (the position just after it).
func (ix *index) pos(seq uint64) int {
	i, found := slices.BinarySearchFunc(ix.evs, seq, func(r evRec, s uint64) int { return cmp.Compare(r.seq, s) })
	if found {
		return i + 1
	}
	return i
}

// countsAt is the number of tasks by kind and state after the first p retained events.
func (ix *index) countsAt(p int) map[string]*[nStates]int64 {
	if p >= len(ix.evs) {
		return copyCounts(ix.counts)
	}
	var c map[string]*[nStates]int64
	start := 0
	// The newest checkpoint at or before p.
	i, _ := slices.BinarySearchFunc(ix.cks, p, func(ck countsCk, p int) int { return cmp.Compare(ck.pos, p) })
	if i < len(ix.cks) && ix.cks[i].pos == p {
		return copyCounts(ix.cks[i].counts)
	}
	if i > 0 {
		c, start = copyCounts(ix.cks[i-1].counts), ix.cks[i-1].pos
	} else {
		c = map[string]*[nStates]int64{}
	}
	for _, r := range ix.evs[start:p] {
		if r.task < 0 || r.before == r.after {
			continue
		}
		k := ix.tasks[r.task].kind
		v := c[k]
		if v == nil {
			v = new([nStates]int64)
			c[k] = v
		}
		if r.before != noState {
			v[r.before]--
		}
		v[r.after]++
	}
	return c
}

// typesAt is the number of events of each type among the first p retained events: the
// newest checkpoint at or before p plus at most checkpointEvery steps.
func (ix *index) typesAt(p int) map[events.Type]int64 {
	out := map[events.Type]int64{}
	start := 0
	i, _ := slices.BinarySearchFunc(ix.cks, p+1, func(ck countsCk, p int) int { return cmp.Compare(ck.pos, p) })
	if i > 0 {
		ck := &ix.cks[i-1]
		start = ck.pos
		for t, n := range ck.types {
			if n != 0 {
				out[events.Type(t)] = n
			}
		}
	}
	for _, r := range ix.evs[start:p] {
		out[r.typ]++
	}
	return out
}

// seqAtTime is the last seq of the longest prefix of the log whose events are all stamped at
// or before at (replay's --at rule); 0 when even the first is later.
func (ix *index) seqAtTime(at int64) uint64 {
	i, _ := slices.BinarySearchFunc(ix.evs, at, func(r evRec, at int64) int {
		if r.maxAt <= at {
			return -1
		}
		return 1
	})
	if i == 0 {
		return 0
	}
	return ix.evs[i-1].seq
}

// sessionIDs is every session id, sorted.
func (ix *index) sessionIDs() []string {
	if ix.dirty {
		ix.sorted = ix.sorted[:0]
		for id := range ix.sess {
			ix.sorted = append(ix.sorted, id)
		}
		slices.Sort(ix.sorted)
		ix.dirty = false
	}
	return ix.sorted
}

// sessionsPage lists up to limit sessions whose id starts with prefix, after the id after,
// that existed at seq upTo.
func (ix *index) sessionsPage(prefix, after string, upTo uint64, limit int) (page []*sessRec, more bool) {
	ids := ix.sessionIDs()
	start, _ := slices.BinarySearch(ids, max(prefix, after))
	for _, id := range ids[start:] {
		if !strings.HasPrefix(id, prefix) {
			break
		}
		if id == after {
			continue
		}
		s := ix.sess[id]
		if s.firstSeq > upTo {
			continue
		}
		if len(page) == limit {
			return page, true
		}
		page = append(page, s)
	}
	return page, false
}

// addSchedPol keeps the history of schedules and kind policies (called after the fold).
func (ix *index) addSchedPol(ev events.Event) error {
	var session, name string
	switch e := ev.(type) {
	case *events.KindPolicySet:
		ix.pols[e.Kind] = append(ix.pols[e.Kind], polVer{seq: e.Seq, ev: *e})
		return nil
	case *events.ScheduleSet:
		session, name = e.SessionID, e.Name
	case *events.ScheduleRemoved:
		session, name = e.SessionID, e.Name
	case *events.TaskSubmitted:
		if e.Schedule == "" {
			return nil
		}
		session, name = e.SessionID, e.Schedule
	default:
		return nil
	}
	sc, err := ix.mem.Schedule(session, name)
	if err != nil || sc == nil {
		return err
	}
	k := session + "\x00" + name
	r := ix.scheds[k]
	if r == nil {
		r = &schedRec{session: session, name: name}
		ix.scheds[k] = r
		ix.schedDirty = true
	}
	v := *sc
	v.Input, v.Headers = nil, nil
	r.vers = append(r.vers, schedVer{seq: ev.Head().Seq, sc: v})
	return nil
}

// schedules is every schedule ever set, by session then name.
func (ix *index) schedules() []*schedRec {
	if ix.schedDirty {
		ix.schedKs = ix.schedKs[:0]
		for k := range ix.scheds {
			ix.schedKs = append(ix.schedKs, k)
		}
		slices.Sort(ix.schedKs)
		ix.schedDirty = false
	}
	out := make([]*schedRec, len(ix.schedKs))
	for i, k := range ix.schedKs {
		out[i] = ix.scheds[k]
	}
	return out
}

// at is the schedule's record at seq (nil: not set yet).
func (r *schedRec) at(seq uint64) *projection.Schedule {
	i, _ := slices.BinarySearchFunc(r.vers, seq+1, func(v schedVer, s uint64) int { return cmp.Compare(v.seq, s) })
	if i == 0 {
		return nil
	}
	return &r.vers[i-1].sc
}

// policyAt is kind's policy event in force at seq (nil: none ever set by then).
func (ix *index) policyAt(kind string, seq uint64) *events.KindPolicySet {
	vs := ix.pols[kind]
	i, _ := slices.BinarySearchFunc(vs, seq+1, func(v polVer, s uint64) int { return cmp.Compare(v.seq, s) })
	if i == 0 {
		return nil
	}
	return &vs[i-1].ev
}

// stateAt is task ti's state after event seq (noState: not submitted by then). The live
// state is kept; a past one is the last of its own events at or before seq.
func (ix *index) stateAt(ti int32, seq uint64) events.TaskState {
	tr := &ix.tasks[ti]
	if seq >= ix.lastSeq {
		return tr.state
	}
	n, _ := slices.BinarySearch(tr.seqs, seq+1)
	for i := n - 1; i >= 0; i-- {
		p := ix.pos(tr.seqs[i])
		if p == 0 || ix.evs[p-1].seq != tr.seqs[i] {
			continue // pruned
		}
		if a := ix.evs[p-1].after; a != noState {
			return a
		}
	}
	return noState
}

// lastChange is the seq and time of the last event about task ti at or before seq.
func (ix *index) lastChange(ti int32, seq uint64) (uint64, int64) {
	tr := &ix.tasks[ti]
	n, _ := slices.BinarySearch(tr.seqs, seq+1)
	for i := n - 1; i >= 0; i-- {
		if p := ix.pos(tr.seqs[i]); p > 0 && ix.evs[p-1].seq == tr.seqs[i] {
			return tr.seqs[i], ix.evs[p-1].at
		}
	}
	return 0, 0
}

// readEvents reads the events at seqs (ascending); a pruned one is left out.
func readEvents(ctx context.Context, q *work.Queue, seqs []uint64) ([]events.Event, error) {
	out := make([]events.Event, 0, len(seqs))
	for i := 0; i < len(seqs); {
		// A run of consecutive seqs is one read.
		j := i + 1
		for j < len(seqs) && seqs[j] == seqs[j-1]+1 {
			j++
		}
		want := seqs[i:j]
		k := 0
		err := q.ReadLog(ctx, want[0], func(ev events.Event) error {
			s := ev.Head().Seq
			for k < len(want) && want[k] < s {
				k++
			}
			if k == len(want) {
				return errStop
			}
			if want[k] == s {
				out = append(out, ev)
				k++
			}
			if k == len(want) {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			return nil, err
		}
		i = j
	}
	return out, nil
}
