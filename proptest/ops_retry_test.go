package proptest

import (
	"fmt"
	"math/rand"
	"time"
)

// --- retry (work-api-3.md, "retrying a finished task") -------------------------------------------

// RetryOp asks session S to retry task T (-1: an unknown id), due again at RunAt (absolute
// model time) when HasRunAt and it is after now, else at once.
type RetryOp struct {
	S, T     int
	HasRunAt bool
	RunAt    int64
}

func (o RetryOp) String() string {
	run := ""
	if o.HasRunAt {
		run = " runAt=" + showTime(o.RunAt)
	}
	return fmt.Sprintf("retry %s as %s%s", taskName(o.T), sessionNames[o.S], run)
}

func (o RetryOp) valid(m *model) bool { return o.S < m.nSess && o.T < len(m.tasks) }
func (o RetryOp) apply(m *model)      { m.retry(o.S, o.T, o.HasRunAt, o.RunAt) }

func (o RetryOp) exec(s *system, r *result) {
	r.id = s.taskID(o.T)
	var runAt time.Time
	if o.HasRunAt {
		runAt = at(o.RunAt)
	}
	r.task, r.err = s.q().Session(sessionNames[o.S]).RetryAt(s.ctx, r.id, runAt, s.at())
}

func (o RetryOp) check(m *model, r *result) []string {
	e := m.exp
	switch e.err {
	case errNotFound:
		if o.T < 0 {
			return checkErr(r, errNotFound, "model", e)
		}
		if m.tasks[o.T].pruned {
			return checkErr(r, errNotFound, "prune", e)
		}
		if r.err == nil {
			return []string{fmt.Sprintf("[isolation] session %s retried task %s of session %s", sessionNames[o.S], taskName(o.T), sessionNames[m.tasks[o.T].sess])}
		}
		return checkErr(r, errNotFound, "isolation", e)
	case errTransition:
		return checkErr(r, errTransition, "model", e)
	}
	if r.err != nil {
		return []string{fmt.Sprintf("[model] retry failed: %v", r.err)}
	}
	// Its settlement is undone by the retry: it may be delivered and settled again.
	delete(r.sys.settled, o.T)
	delete(r.sys.taskLease, o.T) // its last lease ended with the settlement
	fails := compareTask(m, r.sys, o.T, r.task, "retried")
	if w := m.tasks[o.T].atRetry; r.task.AttemptsAtRetry != w {
		fails = append(fails, fmt.Sprintf("[attempts] retried task %s: AttemptsAtRetry is %d, want %d", taskName(o.T), r.task.AttemptsAtRetry, w))
	}
	return fails
}

// retry is Session.RetryAt: a failed or canceled task of the session, whatever its
// completion wake (work-api-4.md, "Retry, whatever the completion wake"), is pending again at
// runAt when that is after now, else at now, with its request and attempts; outcome, finish,
// cancel request and completion wake are cleared. The earlier completion wake stays, no
// longer the task's, deliverable with its outcome while unacknowledged: it is pruned on its
// own by any prune once acknowledged (prunableWake), and until then the task is not
// prunable (prunableTask).
func (m *model) retry(sess, h int, hasRunAt bool, runAt int64) {
	m.exp.task = h
	if h < 0 || m.tasks[h].sess != sess || m.tasks[h].pruned {
		m.exp.err = errNotFound
		if h >= 0 && m.tasks[h].pruned {
			m.exp.why = "the task was pruned"
		}
		return
	}
	t := &m.tasks[h]
	if t.state != mFailed && t.state != mCanceled {
		m.exp.err, m.exp.why = errTransition, "the task is "+t.state.String()
		return
	}
	if t.cwake >= 0 {
		w := &m.wakes[t.cwake]
		w.detached, w.early = true, !w.acked
	}
	t.state, t.scheduled = mPending, m.now
	if hasRunAt && runAt > m.now {
		t.scheduled = runAt
	}
	t.cancelReq, t.cancelAt, t.finished, t.outcome, t.settledBy, t.cwake = false, 0, 0, -1, 0, -1
	t.atRetry, t.retries = t.attempts, t.retries+1
	m.exp.events = 1
}

// genRetry retries mostly a finished task (failed or canceled, sometimes succeeded), of its
// own session, sometimes at a later time.
func genRetry(r *rand.Rand, m *model) op {
	h := genTarget(r, m)
	if r.Intn(10) < 7 {
		var done []int
		for i, t := range m.tasks {
			if (t.state == mFailed || t.state == mCanceled) && !t.pruned {
				done = append(done, i)
			}
		}
		if len(done) > 0 {
			h = done[r.Intn(len(done))]
		}
	}
	s := r.Intn(m.nSess)
	if h >= 0 && r.Intn(10) < 8 {
		s = m.tasks[h].sess
	}
	o := RetryOp{S: s, T: h}
	if r.Intn(3) == 0 {
		o.HasRunAt, o.RunAt = true, m.now+pick(r, -int64(time.Second), 0, 1, int64(time.Second))
	}
	return o
}

// classifyRetry names the cases of a retry.
func classifyRetry(add func(...string), o RetryOp, m *model, e expect) {
	switch {
	case o.T < 0:
		add("retry unknown")
	case e.err == errNotFound:
		add("retry foreign or pruned")
	case e.err == errTransition:
		add("retry unfinished or succeeded")
	case m.tasks[o.T].state == mFailed:
		add("retry failed")
	default:
		add("retry canceled")
	}
	if e.err == errNone && o.T >= 0 {
		if cw := m.tasks[o.T].cwake; cw >= 0 && !m.wakes[cw].acked {
			add("retry with its completion wake unacknowledged")
		}
		if m.earlierUnacked(o.T) >= 0 {
			add("retry again with an earlier wake still unacknowledged")
		}
	}
}
