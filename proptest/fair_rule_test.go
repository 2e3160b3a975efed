package proptest

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/google/btree"
)

// The fair claim order (KindPolicy.FairSessions), stated twice over one kind's tasks, as
// docs/projection.md §4.8 writes it. No backend claims in this order yet: this file is the
// rule's executable statement and the check that the decide the backends are to run (an
// index walk) takes exactly what the rule takes.
//
//   - fairRule is the rule as written: at every take, every (session, priority) with a due
//     task gets its turn, and the least turn is taken. O(tasks) a take.
//   - fairWalk is the claim's decide over the rule's indexes (the session due index, the
//     session start index and the turn index, kept by fairIndexes as the fold would keep
//     them): a walk of the turn index up to now, then the sessions it took, in the order it
//     took them, round after round. O(limit · log n) plus the sessions it steps over at
//     their MaxRunningPerSession.
//
// A session's turn at priority p is (T, S): T is the later of its oldest due task's due time
// and the start (claim time) of its latest started task of the kind at p still on record; S
// is that start's event seq when the start is at or after the due time, else the due task's
// submit seq. Every seq is a log sequence, so turns are distinct.

// fTask is one task of the kind in the rule's world.
type fTask struct {
	sess    int
	pri     int64
	state   mState // mPending, mRunning, mSucceeded (finished)
	at      int64  // pending: run time; running: lease expiry
	seq     uint64 // submit seq
	started bool
	startAt int64  // the latest claim's time (Task.StartedAt, to be)
	startSq uint64 // the latest claim's event seq (Task.StartedSeq, to be)
	pruned  bool
}

func (t *fTask) dueAt(now int64) bool {
	return !t.pruned && (t.state == mPending || t.state == mRunning) && t.at <= now
}

// fWorld is one kind's tasks and the log's seq; maxPer is MaxRunningPerSession (0: none).
type fWorld struct {
	tasks  []fTask
	seq    uint64
	maxPer int
	ix     *fairIndexes // nil: fairRule's world keeps no index
}

// turn is a (session, priority)'s place: ordered by priority (higher first), then (T, S).
type turn struct {
	pri  int64
	t    int64
	s    uint64
	sess int
}

func (a turn) less(b turn) bool {
	if a.pri != b.pri {
		return a.pri > b.pri
	}
	if a.t != b.t {
		return a.t < b.t
	}
	if a.s != b.s {
		return a.s < b.s
	}
	return a.sess < b.sess
}

// turnOf is the rule's turn of a session at a priority from its oldest due entry (headAt,
// headSeq) and its latest start (ok: it has one).
func turnOf(sess int, pri, headAt int64, headSeq uint64, startAt int64, startSq uint64, started bool) turn {
	if started && startAt >= headAt {
		return turn{pri, startAt, startSq, sess}
	}
	return turn{pri, headAt, headSeq, sess}
}

func (w *fWorld) held(sess int, now int64) int {
	n := 0
	for i := range w.tasks {
		t := &w.tasks[i]
		if !t.pruned && t.sess == sess && t.state == mRunning && t.at > now {
			n++
		}
	}
	return n
}

// change runs fn on task h, keeping the indexes (when kept) as the fold would: the
// session's turn before and after, its task's entries moved.
func (w *fWorld) change(h int, fn func(t *fTask)) {
	if w.ix == nil {
		fn(&w.tasks[h])
		return
	}
	w.ix.remove(w, h)
	fn(&w.tasks[h])
	w.ix.add(w, h)
}

func (w *fWorld) submit(sess int, pri, at int64) int {
	w.seq++
	w.tasks = append(w.tasks, fTask{sess: sess, pri: pri, state: mPending, at: at, seq: w.seq})
	h := len(w.tasks) - 1
	if w.ix != nil {
		w.ix.add(w, h)
	}
	return h
}

// take claims task h at now: a claimed event, so a new seq and a start.
func (w *fWorld) take(h int, now, lease int64) {
	w.seq++
	w.change(h, func(t *fTask) {
		t.state, t.at = mRunning, now+lease
		t.started, t.startAt, t.startSq = true, now, w.seq
	})
}

func (w *fWorld) finish(h int) {
	w.seq++
	w.change(h, func(t *fTask) { t.state = mSucceeded })
}

func (w *fWorld) release(h int, at int64) {
	w.seq++
	w.change(h, func(t *fTask) { t.state, t.at = mPending, at })
}

func (w *fWorld) prune(h int) {
	w.change(h, func(t *fTask) { t.pruned = true })
}

// fairRule claims up to limit tasks at now by the rule as written.
func (w *fWorld) fairRule(now, lease int64, limit int) []int {
	var out []int
	for len(out) < limit {
		best, bh := turn{}, -1
		for sess := range w.sessions() {
			if w.maxPer > 0 && w.held(sess, now) >= w.maxPer {
				continue
			}
			for _, pri := range w.priorities() {
				h := -1
				var st *fTask
				for i := range w.tasks {
					t := &w.tasks[i]
					if t.sess != sess || t.pri != pri || t.pruned {
						continue
					}
					if t.started && (st == nil || t.startAt > st.startAt || t.startAt == st.startAt && t.startSq > st.startSq) {
						st = t
					}
					if t.dueAt(now) && (h < 0 || t.at < w.tasks[h].at || t.at == w.tasks[h].at && t.seq < w.tasks[h].seq) {
						h = i
					}
				}
				if h < 0 {
					continue
				}
				var tu turn
				if st != nil {
					tu = turnOf(sess, pri, w.tasks[h].at, w.tasks[h].seq, st.startAt, st.startSq, true)
				} else {
					tu = turnOf(sess, pri, w.tasks[h].at, w.tasks[h].seq, 0, 0, false)
				}
				if tu.t > now {
					continue // its latest start is after now: not in turn at this claim
				}
				if bh < 0 || tu.less(best) {
					best, bh = tu, h
				}
			}
		}
		if bh < 0 {
			break
		}
		w.take(bh, now, lease)
		out = append(out, bh)
	}
	return out
}

func (w *fWorld) sessions() map[int]bool {
	m := map[int]bool{}
	for i := range w.tasks {
		m[w.tasks[i].sess] = true
	}
	return m
}

func (w *fWorld) priorities() []int64 {
	m := map[int64]bool{}
	var out []int64
	for i := range w.tasks {
		if p := w.tasks[i].pri; !m[p] {
			m[p] = true
			out = append(out, p)
		}
	}
	return out
}

// --- the indexes and the decide ------------------------------------------------------------

// sp names a session's partition at a priority: (kind, session, priority) in a store.
type sp struct {
	sess int
	pri  int64
}

// fEntry is an index entry: (at, seq) and the task.
type fEntry struct {
	at  int64
	seq uint64
	h   int
}

func entryLess(a, b fEntry) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// fairIndexes are the three indexes the rule needs, each a function of the task records:
//   - due: per (session, priority), the entries of its due-index tasks (pending or running)
//     by (due time, submit seq): its oldest due task is the first;
//   - starts: per (session, priority), its started tasks on record by (start, start seq)
//     descending (a store keeps the negated start in the key): the latest is the first;
//   - turns: one entry per (session, priority) with a due-index task, by turn.
type fairIndexes struct {
	due    map[sp]*btree.BTreeG[fEntry]
	starts map[sp]*btree.BTreeG[fEntry]
	turns  *btree.BTreeG[turn]
}

func newFairIndexes() *fairIndexes {
	return &fairIndexes{due: map[sp]*btree.BTreeG[fEntry]{}, starts: map[sp]*btree.BTreeG[fEntry]{},
		turns: btree.NewG(8, turn.less)}
}

func (x *fairIndexes) tree(m map[sp]*btree.BTreeG[fEntry], k sp) *btree.BTreeG[fEntry] {
	t := m[k]
	if t == nil {
		t = btree.NewG(8, entryLess)
		m[k] = t
	}
	return t
}

// turnOf reads a partition's turn from its first due entry and its latest start: two seeks.
func (x *fairIndexes) turnOf(k sp) (turn, bool) {
	d := x.due[k]
	if d == nil || d.Len() == 0 {
		return turn{}, false
	}
	head, _ := d.Min()
	if s := x.starts[k]; s != nil && s.Len() > 0 {
		st, _ := s.Min()
		return turnOf(k.sess, k.pri, head.at, head.seq, -st.at, ^st.seq, true), true
	}
	return turnOf(k.sess, k.pri, head.at, head.seq, 0, 0, false), true
}

func (x *fairIndexes) remove(w *fWorld, h int) {
	t := &w.tasks[h]
	k := sp{t.sess, t.pri}
	if tu, ok := x.turnOf(k); ok {
		x.turns.Delete(tu)
	}
	if !t.pruned && (t.state == mPending || t.state == mRunning) {
		x.tree(x.due, k).Delete(fEntry{t.at, t.seq, h})
	}
	if !t.pruned && t.started {
		x.tree(x.starts, k).Delete(fEntry{-t.startAt, ^t.startSq, h})
	}
}

func (x *fairIndexes) add(w *fWorld, h int) {
	t := &w.tasks[h]
	k := sp{t.sess, t.pri}
	if tu, ok := x.turnOf(k); ok {
		x.turns.Delete(tu)
	}
	if !t.pruned && (t.state == mPending || t.state == mRunning) {
		x.tree(x.due, k).ReplaceOrInsert(fEntry{t.at, t.seq, h})
	}
	if !t.pruned && t.started {
		x.tree(x.starts, k).ReplaceOrInsert(fEntry{-t.startAt, ^t.startSq, h})
	}
	if tu, ok := x.turnOf(k); ok {
		x.turns.ReplaceOrInsert(tu)
	}
}

// fairWalk is the claim's decide: it reads the indexes as they stand before the claim (its
// events are applied after it decides) and returns the tasks it takes, in order, then applies
// the takes. Per priority, from the highest: the turn entries with T <= now in order, then
// the sessions it took in the order it took them, each with its next due entry, round after
// round: a session taken at now has turn (now, the seq of the take's event), after every
// entry the walk read and after every session taken before it.
func (w *fWorld) fairWalk(now, lease int64, limit int) (out []int, visited int) {
	x := w.ix
	held := map[int]int{}
	heldOf := func(sess int) int {
		if n, ok := held[sess]; ok {
			return n
		}
		held[sess] = w.held(sess, now) // LeaseSessions, once a claim
		return held[sess]
	}
	// The turn entries a walk reads, gathered first: the index must not change under it.
	var runs [][]turn
	x.turns.Ascend(func(tu turn) bool {
		if len(runs) == 0 || runs[len(runs)-1][0].pri != tu.pri {
			runs = append(runs, nil)
		}
		runs[len(runs)-1] = append(runs[len(runs)-1], tu)
		return true
	})
	type again struct {
		k    sp
		last fEntry // the entry taken last: the session's next is the first after it
	}
	for _, run := range runs {
		var fifo []again
		for _, tu := range run {
			if len(out) == limit {
				break
			}
			if tu.t > now {
				break // the rest of the run is later
			}
			visited++
			if w.maxPer > 0 && heldOf(tu.sess) >= w.maxPer {
				continue // at its limit: stepped over, not taken again in this claim
			}
			k := sp{tu.sess, tu.pri}
			head, _ := x.due[k].Min()
			out = append(out, head.h)
			held[tu.sess] = heldOf(tu.sess) + 1
			fifo = append(fifo, again{k, head})
		}
		for len(fifo) > 0 && len(out) < limit {
			a := fifo[0]
			fifo = fifo[1:]
			visited++
			if w.maxPer > 0 && heldOf(a.k.sess) >= w.maxPer {
				continue
			}
			var next fEntry
			found := false
			x.due[a.k].AscendGreaterOrEqual(fEntry{a.last.at, a.last.seq + 1, 0}, func(e fEntry) bool {
				next, found = e, true
				return false
			})
			if !found || next.at > now {
				continue // its next task is not due: out of this claim
			}
			out = append(out, next.h)
			held[a.k.sess]++
			fifo = append(fifo, again{a.k, next})
		}
		if len(out) == limit {
			break
		}
	}
	for _, h := range out {
		w.take(h, now, lease)
	}
	return out, visited
}

// --- tests -----------------------------------------------------------------------------------

// TestFairWalkIsTheRule runs random histories on two worlds, one claiming by the rule, one by
// the index walk, and requires the same claims every time: the walk (the decide the backends
// are to run) takes exactly what the rule takes, with priorities, run times, expired leases,
// releases, finishes, prunes, per-session limits and claims whose now is behind an earlier
// claim's (a session started after a claim's now is not in turn for it).
func TestFairWalkIsTheRule(t *testing.T) {
	for run := range 300 {
		rng := rand.New(rand.NewSource(int64(run)))
		maxPer := 0
		if rng.Intn(2) == 0 {
			maxPer = 1 + rng.Intn(3)
		}
		a := &fWorld{maxPer: maxPer}
		b := &fWorld{maxPer: maxPer, ix: newFairIndexes()}
		sessions, pris := 1+rng.Intn(6), 1+rng.Intn(3)
		now := int64(100)
		for step := range 120 {
			now += int64(rng.Intn(3)) // claims often share a now
			if rng.Intn(10) == 0 {
				now -= int64(rng.Intn(8)) // a process whose clock is behind the last claim's
			}
			switch op := rng.Intn(10); {
			case op < 4:
				sess, pri := rng.Intn(sessions), int64(rng.Intn(pris))
				at := now - int64(rng.Intn(50))
				if rng.Intn(4) == 0 {
					at = now + int64(rng.Intn(20)) // scheduled later
				}
				a.submit(sess, pri, at)
				b.submit(sess, pri, at)
			case op < 7:
				lease, limit := int64(1+rng.Intn(30)), 1+rng.Intn(5)
				x := a.fairRule(now, lease, limit)
				y, _ := b.fairWalk(now, lease, limit)
				if fmt.Sprint(x) != fmt.Sprint(y) {
					t.Fatalf("run %d step %d: claim at %d limit %d: the rule takes %v, the walk %v", run, step, now, limit, x, y)
				}
			default:
				if len(a.tasks) == 0 {
					continue
				}
				h := rng.Intn(len(a.tasks))
				tk := a.tasks[h]
				switch {
				case tk.pruned:
				case tk.state == mRunning && rng.Intn(2) == 0:
					a.finish(h)
					b.finish(h)
				case tk.state == mRunning:
					at := now + int64(rng.Intn(10)) - 5
					a.release(h, at)
					b.release(h, at)
				case tk.state == mSucceeded:
					a.prune(h)
					b.prune(h)
				}
			}
		}
	}
}

// TestFairOneTurnPerSessionAhead checks the promise the rule exists for (work-api-4.md): a
// session's due task waits at most one claim per other session. From the claim after a
// session's oldest task falls due (all tasks of one priority, claims at non-decreasing times,
// no per-session limit) until it is taken, no other session is taken twice.
func TestFairOneTurnPerSessionAhead(t *testing.T) {
	for run := range 200 {
		rng := rand.New(rand.NewSource(int64(run)))
		w := &fWorld{ix: newFairIndexes()}
		sessions := 2 + rng.Intn(8)
		now := int64(1000)
		// waiting[s]: since s's oldest due task (head) fell due, the takes of each other session.
		type wait struct {
			head int
			seen map[int]int
		}
		waiting := map[int]*wait{}
		for range 200 {
			now += int64(rng.Intn(3))
			if rng.Intn(3) == 0 {
				s := rng.Intn(sessions)
				for range 1 + rng.Intn(20) {
					w.submit(s, 0, now-int64(rng.Intn(500)))
				}
			}
			for i := range w.tasks {
				tk := &w.tasks[i]
				if tk.state == mRunning && rng.Intn(3) == 0 {
					w.finish(i) // by its worker, even after its lease expired
				}
			}
			for s := range sessions {
				// A head that changed (it finished, or an older task came) starts a new wait.
				if h := w.oldestDue(s, now); h < 0 {
					delete(waiting, s)
				} else if waiting[s] == nil || waiting[s].head != h {
					waiting[s] = &wait{h, map[int]int{}}
				}
			}
			took, _ := w.fairWalk(now, 5, 1+rng.Intn(4))
			for _, h := range took {
				s := w.tasks[h].sess
				delete(waiting, s)
				for o, wt := range waiting {
					wt.seen[s]++
					if wt.seen[s] > 1 {
						t.Fatalf("run %d: session %d taken twice while session %d's task %d waited", run, s, o, wt.head)
					}
				}
			}
		}
	}
}

// oldestDue is the session's oldest due task, -1 if none.
func (w *fWorld) oldestDue(sess int, now int64) int {
	h := -1
	for i := range w.tasks {
		t := &w.tasks[i]
		if t.sess == sess && t.dueAt(now) && (h < 0 || t.at < w.tasks[h].at || t.at == w.tasks[h].at && t.seq < w.tasks[h].seq) {
			h = i
		}
	}
	return h
}

// headOfLine is the scenario: one session with big due tasks, small sessions with one
// each (submitted after it), a runner with slots slots. Each started task finishes after a
// pseudo-random 1 to 4 ticks; each tick the runner claims as many tasks as it has free
// slots. It returns how many tasks were claimed before every small session's task had
// started, and the most turn entries one claim visited.
func headOfLine(fair bool, big, small, slots int) (claims, maxVisited int) {
	w := &fWorld{ix: newFairIndexes()}
	for range big {
		w.submit(0, 0, 0)
	}
	for s := 1; s <= small; s++ {
		w.submit(s, 0, 1)
	}
	rng := rand.New(rand.NewSource(1))
	type running struct {
		h    int
		ends int64
	}
	var busy []running
	started := 0
	for now := int64(2); started < small; now++ {
		kept := busy[:0]
		for _, r := range busy {
			if r.ends <= now {
				w.finish(r.h)
			} else {
				kept = append(kept, r)
			}
		}
		busy = kept
		free := slots - len(busy)
		if free == 0 {
			continue
		}
		var took []int
		if fair {
			var v int
			took, v = w.fairWalk(now, 1<<40, free)
			maxVisited = max(maxVisited, v)
		} else {
			took = w.oldestFirst(now, free)
		}
		for _, h := range took {
			claims++
			if w.tasks[h].sess != 0 {
				started++
			}
			busy = append(busy, running{h, now + 1 + int64(rng.Intn(4))})
		}
	}
	return claims, maxVisited
}

// oldestFirst is part 1's order (no FairSessions) over the same world: due time, then seq.
func (w *fWorld) oldestFirst(now int64, limit int) []int {
	var out []int
	for len(out) < limit {
		h := -1
		for i := range w.tasks {
			t := &w.tasks[i]
			if t.dueAt(now) && (h < 0 || t.at < w.tasks[h].at || t.at == w.tasks[h].at && t.seq < w.tasks[h].seq) {
				h = i
			}
		}
		if h < 0 {
			break
		}
		w.take(h, now, 1<<40)
		out = append(out, h)
	}
	return out
}

// TestFairHeadOfLine is the target, in claims: with one session of 100,000 due tasks
// and 100 sessions of one task each, a runner with 16 slots, every small session's task
// starts within the first 100 + 16 claims; and no claim visits more turn entries than it
// takes tasks plus one (the walk reads no backlog). Part 1's order (oldest first) starts
// them only after the big session's whole backlog, which the test shows on a smaller one.
func TestFairHeadOfLine(t *testing.T) {
	claims, visited := headOfLine(true, 100_000, 100, 16)
	t.Logf("FairSessions: every small task started within %d claims (most turn entries a claim visited: %d)", claims, visited)
	if claims > 100+16 {
		t.Fatalf("FairSessions: the small sessions' tasks took %d claims to start, want <= 116", claims)
	}
	if visited > 16+1 {
		t.Fatalf("a claim visited %d turn entries for at most 16 tasks", visited)
	}
	const big = 2_000 // oldestFirst is O(tasks) a take
	unfair, _ := headOfLine(false, big, 100, 16)
	t.Logf("oldest first: %d claims (the big session's %d tasks first)", unfair, big)
	if unfair < big {
		t.Fatalf("oldest first started the small tasks within %d claims, before the big session's %d", unfair, big)
	}
}
