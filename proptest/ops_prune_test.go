package proptest

import (
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
	"github.com/worklog/worklog/work"
)

// Retention (work-api-2.md "Retention"): Prune as an op of the histories. The model's rule
// is model.prune (model_test.go), restated from the spec. The checks here, besides the
// model's after every step:
//
//   - the result counts: PruneResult.Tasks and Wakes are the model's subjects (completion
//     wakes counted with their tasks), Events is the number of events of those subjects
//     that the harness saw appended (each event's Subject());
//   - nothing unprunable changes: before the prune the harness folds the whole retained log
//     into a projection.Mem and reads every task through the API; after it, it folds the
//     retained log again (across the pruned gaps) and reads again, and every record and
//     snapshot the model did not prune must be exactly what it was;
//   - the log is exactly the retained events, its gaps exactly the pruned events, and its
//     fold (replay's fold: projection.Apply, the last sequence moved across each pruned gap)
//     has exactly the model's unpruned tasks and wakes.

// logged is one event the store acknowledged: its sequence and subject.
type logged struct {
	seq        uint64
	task, wake string
}

// PruneOp prunes what became prunable before Before (absolute model time).
type PruneOp struct{ Before int64 }

func (o PruneOp) String() string { return "prune before=" + showTime(o.Before) }

// valid: every prune is a history's, ticks' tasks included (the model holds a schedule's
// latest tick: model.prunableTask; testdata/regress/schedule-tick-pruned-cursor-lost.json).
func (o PruneOp) valid(*model) bool { return true }
func (o PruneOp) apply(m *model)    { m.prune(o.Before) }

// pruneSnap is what a system looked like just before a prune.
type pruneSnap struct {
	fold  *projection.Mem
	reads map[int]work.Task // every task handle that read back found, by handle
	fails []string
}

func (o PruneOp) exec(s *system, r *result) {
	if !s.failed {
		r.snap = s.snapshot()
	}
	res, err := s.q().Prune(s.ctx, at(o.Before))
	r.prune, r.err = &res, err
}

// snapshot folds the retained log and reads every task back through its session.
func (s *system) snapshot() *pruneSnap {
	sn := &pruneSnap{reads: map[int]work.Task{}}
	sn.fold, sn.fails = s.foldLog("prune", "before the prune")
	for h, id := range s.taskIDs {
		if t, found, err := s.q().Session(s.taskSess[h]).Task(s.ctx, id); err == nil && found {
			sn.reads[h] = t
		}
	}
	return sn
}

func (o PruneOp) check(m *model, r *result) []string {
	s, e := r.sys, m.exp
	if r.err != nil {
		return []string{fmt.Sprintf("[prune] Prune(%s) failed: %v", showTime(o.Before), r.err)}
	}
	if r.snap == nil {
		return []string{"[harness] no snapshot before the prune"}
	}
	fails := append([]string(nil), r.snap.fails...)
	// The events the prune must remove: every retained event of a pruned subject.
	gone := map[string]bool{}
	for _, h := range e.prunedT {
		gone["t"+s.taskID(h)] = true
	}
	for _, h := range e.prunedW {
		gone["w"+s.wakeID(h)] = true
	}
	kept := s.log[:0:0]
	var removed uint64
	for _, l := range s.log {
		if (l.task != "" && gone["t"+l.task]) || (l.wake != "" && gone["w"+l.wake]) {
			s.pruned[l.seq] = true
			removed++
			continue
		}
		kept = append(kept, l)
	}
	s.log = kept
	got := r.prune
	if got.Tasks != len(e.prunedT) || got.Wakes != len(e.prunedW) || got.Events != removed {
		fails = append(fails, fmt.Sprintf("[prune] Prune(%s) removed %d tasks, %d wakes, %d events; want %d tasks %v, %d wakes %v, %d events (theirs in the log)",
			showTime(o.Before), got.Tasks, got.Wakes, got.Events, len(e.prunedT), handles(e.prunedT, taskName),
			len(e.prunedW), handles(e.prunedW, wakeName), removed))
	}
	after, ff := s.foldLog("prune", "after the prune")
	fails = append(fails, ff...)
	if after == nil || r.snap.fold == nil {
		return fails
	}
	fails = append(fails, checkFold(m, s, after, "after the prune")...)
	// Nothing unprunable changes: every record the model keeps is exactly as it was in the
	// fold and through the API; every one it prunes is gone from both.
	for h, id := range s.taskIDs {
		was, _ := r.snap.fold.Task(id)
		now, _ := after.Task(id)
		read, found, err := s.q().Session(s.taskSess[h]).Task(s.ctx, id)
		before, wasFound := r.snap.reads[h]
		switch {
		case err != nil:
			fails = append(fails, fmt.Sprintf("[prune] reading %s after the prune: %v", taskName(h), err))
		case m.tasks[h].pruned:
			if now != nil {
				fails = append(fails, fmt.Sprintf("[prune] %s (%s) was pruned but the fold of the retained log still has it", taskName(h), pruneWhy(m, h, o.Before)))
			}
		case was == nil || !wasFound:
			fails = append(fails, fmt.Sprintf("[harness] %s is not pruned but was absent before the prune (fold %v, read %v)", taskName(h), was != nil, wasFound))
		case now == nil || !found:
			fails = append(fails, fmt.Sprintf("[prune] unprunable %s (%s) is gone after Prune(%s): fold has it %v, read finds it %v",
				taskName(h), pruneWhy(m, h, o.Before), showTime(o.Before), now != nil, found))
		default:
			if d := projection.DiffRecords(taskName(h), was, now); len(d) > 0 {
				fails = append(fails, fmt.Sprintf("[prune] unprunable %s changed in the fold of the retained log: %v", taskName(h), d))
			}
			if !reflect.DeepEqual(before, read) {
				fails = append(fails, fmt.Sprintf("[prune] unprunable %s reads differently after the prune: %s, was %s", taskName(h), s.showTask(read, true), s.showTask(before, true)))
			}
		}
	}
	for h, id := range s.wakeIDs {
		was, _ := r.snap.fold.Wake(id)
		now, _ := after.Wake(id)
		switch {
		case m.wakes[h].pruned:
			if now != nil {
				fails = append(fails, fmt.Sprintf("[prune] %s was pruned but the fold of the retained log still has it", wakeName(h)))
			}
		case was == nil:
			fails = append(fails, fmt.Sprintf("[harness] %s is not pruned but was absent from the fold before the prune", wakeName(h)))
		case now == nil:
			fails = append(fails, fmt.Sprintf("[prune] unprunable %s (acknowledged %v) is gone after Prune(%s)", wakeName(h), m.wakes[h].acked, showTime(o.Before)))
		default:
			if d := projection.DiffRecords(wakeName(h), was, now); len(d) > 0 {
				fails = append(fails, fmt.Sprintf("[prune] unprunable %s changed in the fold of the retained log: %v", wakeName(h), d))
			}
		}
	}
	return fails
}

// checkFold compares replay's fold of the retained log (foldLog) with the model, which
// every step checks against the live queue: exactly the model's unpruned tasks and wakes,
// each in the model's state (attempts, finish and acknowledgment times, leases).
func checkFold(m *model, s *system, mem *projection.Mem, when string) []string {
	var fails []string
	bad := func(format string, args ...any) {
		fails = append(fails, fmt.Sprintf("[replay] %s the fold of the retained log: ", when)+fmt.Sprintf(format, args...))
	}
	nt, nw := mem.Len()
	live := 0
	for h, id := range s.taskIDs {
		t := m.tasks[h]
		r, _ := mem.Task(id)
		switch {
		case t.pruned:
			if r != nil {
				bad("pruned %s is there", taskName(h))
			}
			continue
		case r == nil:
			bad("%s is missing", taskName(h))
			continue
		}
		live++
		if int(r.State) != int(t.state) || r.Attempts != t.attempts || r.SessionID != sessionNames[t.sess] ||
			(t.state.terminal() && r.FinishedAt != at(t.finished).UnixNano()) ||
			(t.state == mRunning && r.LeaseExpiresAt != at(t.leaseExp).UnixNano()) {
			bad("%s is %v attempts=%d finished=%d lease=%d, want %s attempts=%d", taskName(h), r.State, r.Attempts, r.FinishedAt, r.LeaseExpiresAt, t.state, t.attempts)
		}
	}
	if nt != live {
		bad("%d tasks, want %d", nt, live)
	}
	live = 0
	for h, id := range s.wakeIDs {
		w := m.wakes[h]
		r, _ := mem.Wake(id)
		switch {
		case w.pruned:
			if r != nil {
				bad("pruned %s is there", wakeName(h))
			}
			continue
		case r == nil:
			bad("%s is missing", wakeName(h))
			continue
		}
		live++
		if r.Acked != w.acked || r.Attempts != w.attempts || (w.acked && r.AckedAt != at(w.ackedAt).UnixNano()) {
			bad("%s acked=%v at %d attempts=%d, want acked=%v at %s attempts=%d", wakeName(h), r.Acked, r.AckedAt, r.Attempts, w.acked, showTime(w.ackedAt), w.attempts)
		}
	}
	if nw != live {
		bad("%d wakes, want %d", nw, live)
	}
	return fails
}

// pruneWhy says why the model keeps or prunes task h at before, for messages.
func pruneWhy(m *model, h int, before int64) string {
	t := m.tasks[h]
	switch {
	case !t.state.terminal():
		return t.state.String()
	case t.finished >= before:
		return fmt.Sprintf("finished at %s", showTime(t.finished))
	case m.earlierUnacked(h) >= 0:
		return fmt.Sprintf("finished at %s, completion wake %s of an earlier run unacknowledged", showTime(t.finished), wakeName(m.earlierUnacked(h)))
	case t.wake && !m.wakes[t.cwake].acked:
		return fmt.Sprintf("finished at %s, completion wake %s unacknowledged", showTime(t.finished), wakeName(t.cwake))
	case t.wake && m.wakes[t.cwake].ackedAt >= before:
		return fmt.Sprintf("finished at %s, completion wake %s acknowledged at %s", showTime(t.finished), wakeName(t.cwake), showTime(m.wakes[t.cwake].ackedAt))
	}
	return fmt.Sprintf("finished at %s, prunable", showTime(t.finished))
}

func handles(hs []int, name func(int) string) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = name(h)
	}
	return out
}

var errStopFold = errors.New("stop")

// foldLog reads the whole log and folds it as replay does: projection.Apply on a fresh Mem,
// with the last sequence moved across a gap when every sequence of the gap was pruned. It
// checks that the log is exactly the retained events (s.log), that each gap is made of
// pruned events only, and that the fold accepts every event; the callers compare the fold
// with the model (checkFold) and with the fold before a prune. label names the property a
// difference breaks; when says at which point.
func (s *system) foldLog(label, when string) (*projection.Mem, []string) {
	mem := projection.NewMem()
	var fails []string
	i := 0
	err := s.q().ReadLog(s.ctx, 1, func(ev events.Event) error {
		seq := ev.Head().Seq
		if i >= len(s.log) || s.log[i].seq != seq {
			want := "no more events"
			if i < len(s.log) {
				want = fmt.Sprintf("seq %d", s.log[i].seq)
			}
			why := ""
			if s.pruned[seq] {
				why = " (an event of a pruned subject)"
			}
			fails = append(fails, fmt.Sprintf("[%s] %s the log holds seq %d%s where the retained log has %s", label, when, seq, why, want))
			return errStopFold
		}
		i++
		last, _ := mem.LastSeq()
		if seq > last+1 {
			for q := last + 1; q < seq; q++ {
				if !s.pruned[q] {
					fails = append(fails, fmt.Sprintf("[replay] %s the log has a gap at seq %d, which no prune removed", when, q))
					return errStopFold
				}
			}
			_ = mem.SetLastSeq(seq - 1)
		}
		if err := projection.Apply(mem, ev); err != nil {
			fails = append(fails, fmt.Sprintf("[replay] %s the fold of the retained log refuses seq %d (%s): %v", when, seq, ev.Type(), err))
			return errStopFold
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopFold) {
		fails = append(fails, fmt.Sprintf("[%s] %s reading the log: %v", label, when, err))
	}
	if len(fails) > 0 {
		return nil, fails
	}
	if i != len(s.log) {
		var missing []uint64
		for _, l := range s.log[i:] {
			missing = append(missing, l.seq)
		}
		return nil, []string{fmt.Sprintf("[%s] %s the log lacks retained events %v", label, when, missing)}
	}
	return mem, nil
}

// notFoundLabel is the property an ErrTaskNotFound for task h is about.
func notFoundLabel(m *model, h int) string {
	if h >= 0 && m.tasks[h].pruned {
		return "prune"
	}
	return "model"
}

// --- generation --------------------------------------------------------------------------------

// genPrune draws Before at the boundaries that matter: exactly a terminal task's FinishedAt
// or a wake's acknowledgment time (not pruned by it: strictly before), one nanosecond after
// (pruned) or before; now or just after it (everything prunable); far in the past
// (nothing).
func genPrune(r *rand.Rand, m *model) op {
	var marks []int64
	for _, t := range m.tasks {
		if !t.pruned && t.state.terminal() {
			marks = append(marks, t.finished)
		}
	}
	for _, w := range m.wakes {
		if !w.pruned && w.acked {
			marks = append(marks, w.ackedAt)
		}
	}
	if len(marks) > 0 && r.Intn(10) < 7 {
		return PruneOp{Before: pick(r, marks...) + pick(r, int64(-1), 0, 0, 1, 1, 1)}
	}
	return PruneOp{Before: pick(r, m.now, m.now+1, m.now+int64(time.Second), -int64(time.Second))}
}

// prunableNow counts the subjects a prune at now+1 would remove (for generator weights).
func (m *model) prunableNow() int {
	n := 0
	for h := range m.tasks {
		if m.prunableTask(h, m.now+1) {
			n++
		}
	}
	for h := range m.wakes {
		if m.prunableWake(h, m.now+1) {
			n++
		}
	}
	return n
}

// classifyPrune names the cases of a Prune applied to m (giving n).
func classifyPrune(add func(...string), o PruneOp, m, n *model) {
	e := n.exp
	if len(e.prunedT)+len(e.prunedW) == 0 {
		add("prune nothing")
	} else {
		add("prune removes something")
	}
	for _, h := range e.prunedT {
		if m.tasks[h].wake {
			add("prune a task with its completion wake")
		} else {
			add("prune a task without a completion wake")
		}
		if m.tasks[h].key >= 0 {
			add("prune a task with a key")
		}
		if m.tasks[h].finished == o.Before-1 {
			add("prune a task finished 1ns before before")
		}
		for _, w := range m.wakes {
			if !w.direct && w.task == h && w.early {
				add("prune a task retried before its earlier wake was acknowledged")
				break
			}
		}
	}
	for _, h := range e.prunedW {
		if m.wakes[h].direct {
			add("prune a direct wake")
			if m.wakes[h].ackedAt == o.Before-1 {
				add("prune a wake acknowledged 1ns before before")
			}
		}
	}
	for h, t := range m.tasks {
		if t.pruned || !t.state.terminal() {
			continue
		}
		switch {
		case t.finished < o.Before && m.earlierUnacked(h) >= 0:
			add("prune keeps a task whose earlier completion wake is unacknowledged")
		case t.finished == o.Before:
			add("prune keeps a task finished exactly at before")
		case t.finished < o.Before && t.wake && !m.wakes[t.cwake].acked:
			add("prune keeps a task whose completion wake is unacknowledged")
		case t.finished < o.Before && t.wake && m.wakes[t.cwake].ackedAt >= o.Before:
			add("prune keeps a task whose completion wake was acknowledged at or after before")
		}
	}
	for _, w := range m.wakes {
		switch {
		case w.pruned:
		case w.direct && w.acked && w.ackedAt == o.Before:
			add("prune keeps a wake acknowledged exactly at before")
		case w.direct && !w.acked && w.attempts > 0:
			add("prune keeps a claimed unacknowledged wake")
		}
	}
	for _, t := range m.tasks {
		if !t.pruned && !t.state.terminal() {
			add("prune keeps unfinished work")
			break
		}
	}
}

// classifyAfterPrune names the cases of an op that meets a pruned subject.
func classifyAfterPrune(add func(...string), o op, m, n *model) {
	e := n.exp
	pt := func(h int) bool { return h >= 0 && h < len(m.tasks) && m.tasks[h].pruned }
	switch o := o.(type) {
	case SubmitOp:
		if e.newRec && o.Key >= 0 {
			for _, t := range m.tasks {
				if t.pruned && t.sess == o.S && t.key == o.Key {
					add("submit reuses a pruned task's key")
					break
				}
			}
		}
	case WakeOp:
		if e.newRec && o.Key >= 0 {
			for _, w := range m.wakes {
				if w.pruned && w.direct && w.sess == o.S && w.key == o.Key {
					add("wake reuses a pruned wake's key")
					break
				}
			}
		}
	case ReadOp:
		if pt(o.T) {
			add("read pruned")
		}
	case CancelOp:
		if pt(o.T) {
			add("cancel pruned")
		}
	case FinishOp:
		if pt(o.T) {
			add("finish pruned")
		}
	case ExtendOp:
		if pt(o.T) {
			add("extend pruned")
		}
	case ReleaseOp:
		if pt(o.T) {
			add("release pruned")
		}
	case SettleAndClaimOp:
		for _, st := range o.Settles {
			if pt(st.T) {
				add("settle and claim a pruned task")
			}
		}
	case AckOp:
		if o.W >= 0 && m.wakes[o.W].pruned {
			add("ack pruned")
		}
	case TasksOp:
		if pt(o.After) {
			add("tasks after a pruned cursor")
		}
	case ReopenOp, CrashOp:
		for _, t := range m.tasks {
			if t.pruned {
				add("restart after a prune")
				break
			}
		}
	}
}

var pruneCoverageCases = []string{
	"prune nothing", "prune removes something",
	"prune a task with its completion wake", "prune a task without a completion wake",
	"prune a task with a key", "prune a task finished 1ns before before",
	"prune a direct wake", "prune a wake acknowledged 1ns before before",
	"prune keeps a task finished exactly at before",
	"prune keeps a task whose completion wake is unacknowledged",
	"prune keeps a task whose completion wake was acknowledged at or after before",
	"prune keeps a wake acknowledged exactly at before", "prune keeps a claimed unacknowledged wake",
	"prune keeps unfinished work",
	"submit reuses a pruned task's key", "wake reuses a pruned wake's key",
	"read pruned", "cancel pruned", "finish pruned", "extend pruned", "release pruned",
	"settle and claim a pruned task", "ack pruned", "tasks after a pruned cursor",
	"prune keeps a task whose earlier completion wake is unacknowledged",
	"prune a task retried before its earlier wake was acknowledged",
	"restart after a prune",
}
