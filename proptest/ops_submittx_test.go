package proptest

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// --- submit inside the application's transaction (work-api-3.md, postgres.SubmitTx) -------------

// SubmitTxOp commits (or, when !Commit, rolls back) an application transaction holding a
// submission of session S (postgres.SubmitTx), then waits until the queue has taken it in:
// the inbox is empty. It always carries a key (SubmitTx requires one) and a RunAt: the take-in
// happens at the queue's clock, not the model's, so an immediate task's schedule would be
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
	fmt.Fprintf(&b, "submitTx %s kind=%s input=%s key=%s runAt=%s", sessionNames[o.S], kindNames[o.Kind], showJSON(o.Input),
		keyNames[o.Key], showTime(o.RunAt))
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

// inboxStore is a store whose backend takes submissions committed in the application's
// transaction (PostgreSQL).
type inboxStore interface {
	// submitTx runs postgres.SubmitTx for session in a transaction of its own connection,
	// and commits it or rolls it back.
	submitTx(ctx context.Context, q *work.Queue, session string, r work.TaskRequest, commit bool) error
	// awaitInbox returns once the inbox is empty: every committed submission is taken in
	// (its row goes in the same transaction as its events).
	awaitInbox(ctx context.Context) error
}

func (o SubmitTxOp) exec(s *system, r *result) {
	in, ok := s.st.(inboxStore)
	if !ok {
		r.problem = "the backend has no inbox: SubmitTxOp must not be generated for it"
		return
	}
	if r.err = in.submitTx(s.ctx, s.q(), sessionNames[o.S], o.request(), o.Commit); r.err != nil {
		return
	}
	if r.err = in.awaitInbox(s.ctx); r.err != nil {
		return
	}
	if o.Commit {
		r.task, r.err = s.q().Session(sessionNames[o.S]).TaskByKey(s.ctx, keyNames[o.Key])
	}
}

func (o SubmitTxOp) check(m *model, r *result) []string {
	e := m.exp
	if r.err != nil {
		return []string{fmt.Sprintf("[model] submitTx failed: %v", r.err)}
	}
	var rej []*events.TaskSubmitRejected
	for _, ev := range r.events {
		if x, ok := ev.(*events.TaskSubmitRejected); ok {
			rej = append(rej, x)
		}
	}
	if !o.Commit {
		return nil // checkLog: a rolled-back submission appends nothing, now or later
	}
	if e.field != "" {
		if len(rej) != 1 {
			return []string{fmt.Sprintf("[idempotency] a committed submission of another intent under used key %s (task %s, %s differs) appended %d task_submit_rejected events, want 1",
				e.key, taskName(e.task), e.field, len(rej))}
		}
		x := rej[0]
		if want := r.sys.taskID(e.task); x.TaskID != want || x.Field != e.field || x.IdempotencyKey != e.key ||
			x.Kind != kindNames[o.Kind] || x.SessionID != sessionNames[o.S] {
			return []string{fmt.Sprintf("[idempotency] task_submit_rejected %+v, want task %s (%s), field %s, key %s, kind %s, session %s",
				x, taskName(e.task), want, e.field, e.key, kindNames[o.Kind], sessionNames[o.S])}
		}
	} else if len(rej) > 0 {
		return []string{fmt.Sprintf("[idempotency] a submission under key %s was rejected (%s differs), want it taken in", keyNames[o.Key], rej[0].Field)}
	}
	if e.newRec {
		if h, ok := r.sys.taskOf[r.task.ID]; ok {
			return []string{fmt.Sprintf("[idempotency] a new submission under key %s found existing task %s", keyNames[o.Key], taskName(h))}
		}
		if p := r.sys.bindTask(e.task, r.task.ID, sessionNames[o.S]); p != "" {
			return []string{p}
		}
	} else if r.task.ID != r.sys.taskID(e.task) {
		return []string{fmt.Sprintf("[idempotency] TaskByKey(%s) after the submission is %s, not %s",
			keyNames[o.Key], r.sys.nameTask(r.task.ID), taskName(e.task))}
	}
	return compareTask(m, r.sys, e.task, r.task, "found by key")
}

// submitTx is the take-in of a committed SubmitTx: Submit's rules at that time, except that
// another intent is no error to anyone but an audit event (task_submit_rejected naming the
// task the key names and the first differing field). A rolled-back one is nothing.
func (m *model) submitTx(o SubmitTxOp) {
	if !o.Commit {
		return
	}
	if h := m.taskByKey(o.S, o.Key); h >= 0 {
		m.exp.task = h
		if f := m.tasks[h].differs(o.Kind, o.Input, true, o.RunAt, o.Wake, o.Pri); f != "" {
			m.exp.field, m.exp.key, m.exp.audit = f, keyNames[o.Key], true
		}
		return
	}
	m.exp.task, m.exp.newRec, m.exp.events = len(m.tasks), true, 1
	m.tasks = append(m.tasks, mTask{
		sess: o.S, kind: o.Kind, input: o.Input, key: o.Key, hasRunAt: true, runAt: o.RunAt,
		wake: o.Wake, created: m.now, scheduled: o.RunAt, outcome: -1, cwake: -1, pri: o.Pri, inbox: true,
	})
}

// genSubmitTx is genSubmit's request, always with a key and a RunAt, committed four times
// in five.
func genSubmitTx(r *rand.Rand, m *model) op {
	s := genSubmit(r, m).(SubmitOp)
	if s.Key < 0 {
		s.Key = r.Intn(len(keyNames))
	}
	if !s.HasRunAt {
		s.RunAt = m.now + int64(pick(r, -time.Second, 0, time.Nanosecond, time.Second))
	}
	return SubmitTxOp{S: s.S, Kind: s.Kind, Input: s.Input, Key: s.Key, RunAt: s.RunAt, Wake: s.Wake, Pri: s.Pri, Commit: r.Intn(5) != 0}
}

func classifySubmitTx(add func(...string), o SubmitTxOp, m *model, e expect) {
	switch {
	case !o.Commit:
		add("submit tx rolled back")
	case e.newRec:
		add("submit tx new")
	case e.field != "":
		add("submit tx rejected (other intent)")
	default:
		add("submit tx repeat (same intent)")
	}
}
