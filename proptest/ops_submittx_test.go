package proptest

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"time"

	"github.com/worklog/worklog/work"
)

// --- submit inside the application's transaction (work-api-3.md, postgres.SubmitTx) -------------

// SubmitTxOp runs postgres.SubmitTx in an application transaction and commits it (or, when
// !Commit, rolls it back), then reads the answered task from the queue at once: SubmitTx
// answers inside the transaction what Submit would answer at the commit, and from the commit
// every reader sees the task. The key is optional (Key < 0: none). It always carries a RunAt:
// SubmitTx takes the queue's clock, not the model's, so an immediate task's schedule would be
// unknown (its CreatedAt is, see mTask.inbox).
type SubmitTxOp struct {
	S, Kind, Input, Key int
	RunAt               int64
	Wake                bool
	Pri                 int
	Commit              bool
}

func (o SubmitTxOp) String() string {
	var b strings.Builder
	key := "none"
	if o.Key >= 0 {
		key = keyNames[o.Key]
	}
	fmt.Fprintf(&b, "submitTx %s kind=%s input=%s key=%s runAt=%s", sessionNames[o.S], kindNames[o.Kind], showJSON(o.Input),
		key, showTime(o.RunAt))
	if o.Wake {
		b.WriteString(" wake=completion")
	}
	if o.Pri != 0 {
		fmt.Fprintf(&b, " priority=%d", o.Pri)
	}
	if !o.Commit {
		b.WriteString(" ROLLBACK")
	}
	return b.String()
}

func (o SubmitTxOp) valid(m *model) bool { return o.S < m.nSess && m.inbox }
func (o SubmitTxOp) apply(m *model)      { m.submitTx(o) }

func (o SubmitTxOp) request() work.TaskRequest {
	return SubmitOp{S: o.S, Kind: o.Kind, Input: o.Input, Key: o.Key, HasRunAt: true, RunAt: o.RunAt, Wake: o.Wake, Pri: o.Pri}.request()
}

// inboxStore is a store whose backend has SubmitTx (PostgreSQL).
type inboxStore interface {
	// submitTx runs postgres.SubmitTx for session in a transaction of its own connection,
	// and commits it or rolls it back (always, when SubmitTx failed), returning its answer.
	submitTx(ctx context.Context, q *work.Queue, session string, r work.TaskRequest, commit bool) (work.Task, error)
}

func (o SubmitTxOp) exec(s *system, r *result) {
	in, ok := s.st.(inboxStore)
	if !ok {
		r.problem = "the backend has no inbox: SubmitTxOp must not be generated for it"
		return
	}
	r.task, r.err = in.submitTx(s.ctx, s.q(), sessionNames[o.S], o.request(), o.Commit)
	if r.err != nil || !o.Commit {
		return
	}
	// Read at once, by id: the committed task, as SubmitTx answered it.
	got, found, err := s.q().Session(sessionNames[o.S]).Task(s.ctx, r.task.ID)
	switch {
	case err != nil:
		r.err = err
	case !found:
		r.problem = fmt.Sprintf("[visibility] the task %s SubmitTx answered is not found right after the commit", r.task.ID)
	case !reflect.DeepEqual(got, r.task):
		r.problem = fmt.Sprintf("[visibility] read right after the commit:\n%+v\nSubmitTx answered:\n%+v", got, r.task)
	}
}

func (o SubmitTxOp) check(m *model, r *result) []string {
	e := m.exp
	if e.err == errConflict {
		if r.err == nil {
			return []string{fmt.Sprintf("[idempotency] SubmitTx of a changed request under used key %s (first used by %s) was accepted, returning %s",
				e.key, taskName(e.task), r.sys.nameTask(r.task.ID))}
		}
		return checkErr(r, errConflict, "idempotency", e)
	}
	if r.err != nil {
		return []string{fmt.Sprintf("[model] submitTx failed: %v", r.err)}
	}
	if e.task < 0 { // a new task, rolled back: answered, never stored (checkLog: nothing appended)
		if h, ok := r.sys.taskOf[r.task.ID]; ok || r.task.ID == "" || r.task.State != work.TaskPending {
			return []string{fmt.Sprintf("[idempotency] a new submission answered %+v (existing: %v %s)", r.task, ok, taskName(h))}
		}
		return nil
	}
	if e.newRec {
		if h, ok := r.sys.taskOf[r.task.ID]; ok {
			return []string{fmt.Sprintf("[idempotency] a new submission answered existing task %s", taskName(h))}
		}
		if p := r.sys.bindTask(e.task, r.task.ID, sessionNames[o.S]); p != "" {
			return []string{p}
		}
	} else if r.task.ID != r.sys.taskID(e.task) {
		return []string{fmt.Sprintf("[idempotency] SubmitTx of an equal request under used key %s answered %s, not %s",
			keyNames[o.Key], r.sys.nameTask(r.task.ID), taskName(e.task))}
	}
	return compareTask(m, r.sys, e.task, r.task, "answered by SubmitTx")
}

// submitTx is Submit's rule, answered inside the transaction: the task the key names, or the
// conflict, whether the transaction then commits or not; a new task only when it commits (a
// rolled-back one is answered, and nothing).
func (m *model) submitTx(o SubmitTxOp) {
	if h := m.taskByKey(o.S, o.Key); h >= 0 {
		if f := m.tasks[h].differs(o.Kind, o.Input, true, o.RunAt, o.Wake, o.Pri); f != "" {
			m.exp.err, m.exp.key, m.exp.field, m.exp.task = errConflict, keyNames[o.Key], f, h
		} else {
			m.exp.task = h
		}
		return
	}
	if !o.Commit {
		m.exp.task = -1
		return
	}
	m.exp.task, m.exp.newRec, m.exp.events = len(m.tasks), true, 1
	m.tasks = append(m.tasks, mTask{
		sess: o.S, kind: o.Kind, input: o.Input, key: o.Key, hasRunAt: true, runAt: o.RunAt,
		wake: o.Wake, created: m.now, scheduled: o.RunAt, outcome: -1, cwake: -1, pri: o.Pri, inbox: true,
	})
}

// genSubmitTx is genSubmit's request, always with a RunAt, committed four times in five; a
// keyless one of genSubmit gets a key one time in two.
func genSubmitTx(r *rand.Rand, m *model) op {
	s := genSubmit(r, m).(SubmitOp)
	if s.Key < 0 {
		// One draw, as when SubmitTx required a key and this drew it: another draw moves the
		// generator's stream off the rarest coverage case its seed reaches
		// (TestGeneratorCoverage).
		if k := r.Intn(len(keyNames) + 1); k < len(keyNames) {
			s.Key = k
		}
	}
	if !s.HasRunAt {
		s.RunAt = m.now + int64(pick(r, -time.Second, 0, time.Nanosecond, time.Second))
	}
	return SubmitTxOp{S: s.S, Kind: s.Kind, Input: s.Input, Key: s.Key, RunAt: s.RunAt, Wake: s.Wake, Pri: s.Pri, Commit: r.Intn(5) != 0}
}

func classifySubmitTx(add func(...string), o SubmitTxOp, m *model, e expect) {
	switch {
	case e.err == errConflict:
		add("submit tx conflict (other intent)")
	case !o.Commit && o.Key < 0:
		add("submit tx keyless rolled back")
	case !o.Commit:
		add("submit tx rolled back")
	case e.newRec && o.Key < 0:
		add("submit tx keyless")
	case e.newRec:
		add("submit tx new")
	default:
		add("submit tx repeat (same intent)")
	}
}
