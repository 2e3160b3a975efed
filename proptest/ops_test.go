package proptest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/worklog/worklog/work"
)

// An op is one step of a history. Its fields are plain values (indexes into the pools, model
// handles, durations), so that an op means the same thing in every backend and can be
// printed as Go or JSON and replayed. Handles: task Tn is the n-th task the model created,
// wake Wn the n-th wake; a delivery is named by its handle and attempt (T2#1), which is unique
// because every claim adds exactly one attempt.
type op interface {
	// String is the readable form used in failure reports.
	String() string
	// valid is the precondition: every handle and delivery the op names exists in the model.
	valid(m *model) bool
	// apply is the model transition; it sets m.exp, the expected result.
	apply(m *model)
	// exec performs the op on one system under test.
	exec(s *system, r *result)
	// check compares the result of exec with m.exp (m is the state after apply) and binds
	// new ids and deliveries to their handles. It returns failure messages, each starting
	// with the [property] it violates.
	check(m *model, r *result) []string
}

// unknownTaskID and unknownWakeID name records that do not exist.
const (
	unknownTaskID = "task_0000000000000000000000000000dead"
	unknownWakeID = "wake_0000000000000000000000000000dead"
	forgedToken   = "lease_forged00000000000000000000"
)

func taskName(h int) string {
	if h < 0 {
		return "<unknown task>"
	}
	return fmt.Sprintf("T%d", h)
}

func wakeName(h int) string {
	if h < 0 {
		return "<unknown wake>"
	}
	return fmt.Sprintf("W%d", h)
}

// --- submit --------------------------------------------------------------------------------------

// SubmitOp submits a task. RunAt is absolute model time (ns after t0), so that a repeat under
// the same key is the same request whatever the clock says.
type SubmitOp struct {
	S, Kind, Input int
	Key            int // -1: none
	HasRunAt       bool
	RunAt          int64
	Wake           bool
	Pri            int // TaskRequest.Priority
}

func (o SubmitOp) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "submit %s kind=%s input=%s", sessionNames[o.S], kindNames[o.Kind], showJSON(o.Input))
	if o.Key >= 0 {
		fmt.Fprintf(&b, " key=%s", keyNames[o.Key])
	}
	if o.HasRunAt {
		fmt.Fprintf(&b, " runAt=%s", showTime(o.RunAt))
	}
	if o.Wake {
		b.WriteString(" wake=completion")
	}
	if o.Pri != 0 {
		fmt.Fprintf(&b, " priority=%d", o.Pri)
	}
	return b.String()
}

func (o SubmitOp) valid(m *model) bool { return o.S < m.nSess }

func (o SubmitOp) apply(m *model) {
	m.submit(o.S, o.Kind, o.Input, o.Key, o.HasRunAt, o.RunAt, o.Wake, o.Pri)
}

func (o SubmitOp) request() work.TaskRequest {
	r := work.TaskRequest{Kind: kindNames[o.Kind], Input: raw(o.Input), Priority: o.Pri}
	if o.Key >= 0 {
		r.IdempotencyKey = keyNames[o.Key]
	}
	if o.HasRunAt {
		r.RunAt = at(o.RunAt)
	}
	if o.Wake {
		r.Wake = work.WakeOnCompletion
	}
	return r
}

func (o SubmitOp) exec(s *system, r *result) {
	r.task, r.err = s.q().Session(sessionNames[o.S]).SubmitAt(s.ctx, o.request(), s.at())
}

func (o SubmitOp) check(m *model, r *result) []string {
	e := m.exp
	if e.err == errConflict {
		if r.err == nil {
			return []string{fmt.Sprintf("[idempotency] a changed request under used key %s (first used by %s) was accepted, returning %s",
				e.key, taskName(e.task), r.sys.nameTask(r.task.ID))}
		}
		return checkErr(r, errConflict, "idempotency", e)
	}
	if r.err != nil {
		if isKind(r.err, errConflict) {
			if !e.newRec {
				return []string{fmt.Sprintf("[idempotency] an equal request under used key %s was rejected: %v", keyNames[o.Key], r.err)}
			}
			for h, t := range m.tasks[:e.task] {
				if t.key == o.Key && t.sess != o.S {
					return []string{fmt.Sprintf("[isolation] key %s is new in session %s but conflicted with %s of session %s: %v",
						keyNames[o.Key], sessionNames[o.S], taskName(h), sessionNames[t.sess], r.err)}
				}
			}
		}
		return []string{fmt.Sprintf("[model] submit failed: %v", r.err)}
	}
	if e.newRec {
		if h, ok := r.sys.taskOf[r.task.ID]; ok {
			label := "idempotency"
			if m.tasks[h].sess != o.S {
				label = "isolation"
			}
			return []string{fmt.Sprintf("[%s] a new request returned existing task %s of session %s", label, taskName(h), sessionNames[m.tasks[h].sess])}
		}
		if p := r.sys.bindTask(e.task, r.task.ID, sessionNames[o.S]); p != "" {
			return []string{p}
		}
	} else if r.task.ID != r.sys.taskID(e.task) {
		return []string{fmt.Sprintf("[idempotency] an equal request under used key %s returned %s, not %s",
			keyNames[o.Key], r.sys.nameTask(r.task.ID), taskName(e.task))}
	}
	return compareTask(m, r.sys, e.task, r.task, "returned")
}

// --- read ----------------------------------------------------------------------------------------

// ReadOp reads task T (-1: an unknown id) through session S.
type ReadOp struct{ S, T int }

func (o ReadOp) String() string {
	return fmt.Sprintf("read %s as %s", taskName(o.T), sessionNames[o.S])
}

func (o ReadOp) valid(m *model) bool { return o.S < m.nSess && o.T < len(m.tasks) }
func (o ReadOp) apply(m *model)      { m.read(o.S, o.T) }

func (o ReadOp) exec(s *system, r *result) {
	r.id = s.taskID(o.T)
	r.task, r.found, r.err = s.q().Session(sessionNames[o.S]).Task(s.ctx, r.id)
}

func (o ReadOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] read failed: %v", r.err)}
	}
	if !m.exp.found {
		if r.found {
			if o.T >= 0 && m.tasks[o.T].pruned {
				return []string{fmt.Sprintf("[prune] pruned task %s was found by session %s", taskName(o.T), sessionNames[o.S])}
			}
			if o.T >= 0 {
				return []string{fmt.Sprintf("[isolation] session %s read task %s of session %s", sessionNames[o.S], taskName(o.T), sessionNames[m.tasks[o.T].sess])}
			}
			return []string{"[model] an unknown task id was found"}
		}
		return nil
	}
	if !r.found {
		return []string{fmt.Sprintf("[model] session %s could not read its own task %s", sessionNames[o.S], taskName(o.T))}
	}
	return compareTask(m, r.sys, o.T, r.task, "read")
}

// --- cancel --------------------------------------------------------------------------------------

// CancelOp asks session S to cancel task T (-1: an unknown id).
type CancelOp struct{ S, T int }

func (o CancelOp) String() string {
	return fmt.Sprintf("cancel %s as %s", taskName(o.T), sessionNames[o.S])
}

func (o CancelOp) valid(m *model) bool { return o.S < m.nSess && o.T < len(m.tasks) }
func (o CancelOp) apply(m *model)      { m.cancel(o.S, o.T) }

func (o CancelOp) exec(s *system, r *result) {
	r.id = s.taskID(o.T)
	r.task, r.err = s.q().Session(sessionNames[o.S]).CancelAt(s.ctx, r.id, s.at())
}

func (o CancelOp) check(m *model, r *result) []string {
	if m.exp.err == errNotFound {
		if o.T < 0 {
			return checkErr(r, errNotFound, "model", m.exp)
		}
		if m.tasks[o.T].pruned {
			return checkErr(r, errNotFound, "prune", m.exp)
		}
		if r.err == nil {
			return []string{fmt.Sprintf("[isolation] session %s canceled task %s of session %s", sessionNames[o.S], taskName(o.T), sessionNames[m.tasks[o.T].sess])}
		}
		return checkErr(r, errNotFound, "isolation", m.exp)
	}
	if r.err != nil {
		return []string{fmt.Sprintf("[model] cancel failed: %v", r.err)}
	}
	return compareTask(m, r.sys, o.T, r.task, "returned")
}

// --- claim tasks ---------------------------------------------------------------------------------

// ClaimOp claims due tasks.
type ClaimOp struct {
	Lease time.Duration
	Limit int
}

func (o ClaimOp) String() string    { return fmt.Sprintf("claim lease=%v limit=%d", o.Lease, o.Limit) }
func (o ClaimOp) valid(*model) bool { return true }
func (o ClaimOp) apply(m *model)    { m.claim(int64(o.Lease), o.Limit) }

func (o ClaimOp) exec(s *system, r *result) {
	r.tds, r.err = s.q().ClaimDueAt(s.ctx, s.at(), o.Lease, o.Limit)
	if r.err == nil && r.tds == nil {
		r.tds = []work.TaskDelivery{} // render "delivered []"
	}
}

func (o ClaimOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] claim failed: %v", r.err)}
	}
	return checkTaskClaims(m, r, o.Limit)
}

// checkTaskClaims compares the deliveries of a claim (ClaimDue, ClaimKinds, the claims of a
// SettleAndClaim) with the model's prediction and binds each to its (handle, attempt).
func checkTaskClaims(m *model, r *result, limit int) []string {
	s := r.sys
	var fails []string
	got := make([]int, len(r.tds))
	for i, d := range r.tds {
		h, ok := s.taskOf[d.Task.ID]
		if !ok {
			fails = append(fails, fmt.Sprintf("[fencing] claim delivered unknown task %s", d.Task.ID))
			h = -1
		}
		got[i] = h
		fails = append(fails, s.checkTaskDelivery(h, d)...)
	}
	fails = append(fails, compareClaims("task", m.exp.claims, got, limit, func(h int) string {
		if h < 0 {
			return "?"
		}
		return m.describeTask(h)
	}, func(h int) (string, string) { return describeTaskBefore(m, h, r.sys) })...)
	for i, c := range m.exp.claims {
		if i >= len(r.tds) || got[i] != c.h {
			continue
		}
		d := r.tds[i]
		if d.Attempt != c.attempt || d.Task.Attempts != c.attempt {
			fails = append(fails, fmt.Sprintf("[attempts] claim of %s: delivery attempt %d, task attempts %d, want %d (one per claim)",
				taskName(c.h), d.Attempt, d.Task.Attempts, c.attempt))
		}
		if want := at(m.tasks[c.h].leaseExp); !d.LeaseExpiresAt.Equal(want) {
			fails = append(fails, fmt.Sprintf("[model] claim of %s: lease expires %v, want %v", taskName(c.h), d.LeaseExpiresAt, want))
		}
		fails = append(fails, compareTask(m, s, c.h, d.Task, "delivered")...)
		s.tds[dkey{c.h, c.attempt}] = d
		s.noteTaskLease(c.h, d)
	}
	return fails
}

// --- finish --------------------------------------------------------------------------------------

// FinishOp settles delivery T#Attempt with outcome Outcome (an outcomePool index). T -1 finishes
// a delivery of an unknown task id; Forged presents a made-up lease token.
type FinishOp struct {
	T       int
	Attempt uint32
	Outcome int
	Forged  bool
}

func (o FinishOp) String() string {
	f := ""
	if o.Forged {
		f = " [forged token]"
	}
	if o.T < 0 {
		return fmt.Sprintf("finish %s %s", taskName(o.T), showOutcome(o.Outcome))
	}
	return fmt.Sprintf("finish %s#%d%s %s", taskName(o.T), o.Attempt, f, showOutcome(o.Outcome))
}

func (o FinishOp) valid(m *model) bool {
	return o.T < 0 || o.T < len(m.tasks) && o.Attempt >= 1 && o.Attempt <= m.tasks[o.T].attempts
}

func (o FinishOp) apply(m *model) { m.finish(o.T, o.Attempt, o.Outcome, o.Forged) }

func (o FinishOp) exec(s *system, r *result) {
	var d work.TaskDelivery
	if o.T < 0 {
		d = work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken)
	} else {
		var ok bool
		if d, ok = s.tds[dkey{o.T, o.Attempt}]; !ok {
			r.problem = fmt.Sprintf("no delivery %s#%d was recorded", taskName(o.T), o.Attempt)
			return
		}
		if o.Forged {
			d = work.NewTaskDelivery(d.Task, d.Attempt, d.LeaseExpiresAt, forgedToken)
		}
	}
	r.id, r.token = d.Task.ID, d.LeaseToken()
	r.task, r.err = s.q().FinishAt(s.ctx, d, outcomeValue(o.Outcome), s.at())
}

func outcomeValue(i int) work.Outcome {
	o := outcomePool[i]
	switch o.state {
	case mSucceeded:
		if o.summary != "" {
			return work.SuccessWithSummary(o.summary, raw(o.output))
		}
		return work.Success(raw(o.output))
	case mFailed:
		return work.Failure(o.errMsg)
	}
	return work.Cancellation()
}

func (o FinishOp) check(m *model, r *result) []string {
	e := m.exp
	name := fmt.Sprintf("%s#%d", taskName(o.T), o.Attempt)
	switch e.err {
	case errNotFound:
		return checkErr(r, errNotFound, notFoundLabel(m, o.T), e)
	case errStale:
		if r.err == nil {
			return []string{fmt.Sprintf("[fencing] stale delivery %s (%s) settled the task: %s", name, e.why, r.sys.showTask(r.task, false))}
		}
		return checkErr(r, errStale, "fencing", e)
	case errTransition:
		if r.err == nil {
			return []string{fmt.Sprintf("[fencing] %s, already settled, was settled again with a different outcome", name)}
		}
		return checkErr(r, errTransition, "fencing", e)
	}
	if r.err != nil {
		if m.tasks[o.T].settledBy == o.Attempt && m.exp.events == 0 {
			return []string{fmt.Sprintf("[fencing] repeating the settlement of %s with an equal outcome failed: %v", name, r.err)}
		}
		return []string{fmt.Sprintf("[model] the current delivery %s could not settle: %v", name, r.err)}
	}
	return compareTask(m, r.sys, o.T, r.task, "returned")
}

// --- direct wake ---------------------------------------------------------------------------------

// WakeOp records a direct wake for session S.
type WakeOp struct {
	S, Key, Payload int // Key -1: none
}

func (o WakeOp) String() string {
	k := ""
	if o.Key >= 0 {
		k = " key=" + keyNames[o.Key]
	}
	return fmt.Sprintf("wake %s%s payload=%s", sessionNames[o.S], k, showJSON(o.Payload))
}

func (o WakeOp) valid(m *model) bool { return o.S < m.nSess }
func (o WakeOp) apply(m *model)      { m.wake(o.S, o.Key, o.Payload) }

func (o WakeOp) exec(s *system, r *result) {
	req := work.WakeRequest{Payload: raw(o.Payload)}
	if o.Key >= 0 {
		req.IdempotencyKey = keyNames[o.Key]
	}
	r.wake, r.err = s.q().Session(sessionNames[o.S]).WakeAt(s.ctx, req, s.at())
}

func (o WakeOp) check(m *model, r *result) []string {
	e := m.exp
	if e.err == errConflict {
		if r.err == nil {
			return []string{fmt.Sprintf("[idempotency] a wake with another payload under used key %s (first used by %s) was accepted, returning %s",
				e.key, wakeName(e.wake), r.sys.nameWake(r.wake.ID))}
		}
		return checkErr(r, errConflict, "idempotency", e)
	}
	if r.err != nil {
		if isKind(r.err, errConflict) {
			if !e.newRec {
				return []string{fmt.Sprintf("[idempotency] an equal wake under used key %s was rejected: %v", keyNames[o.Key], r.err)}
			}
			for h, w := range m.wakes[:e.wake] {
				if w.direct && w.key == o.Key && w.sess != o.S {
					return []string{fmt.Sprintf("[isolation] wake key %s is new in session %s but conflicted with %s of session %s: %v",
						keyNames[o.Key], sessionNames[o.S], wakeName(h), sessionNames[w.sess], r.err)}
				}
			}
		}
		return []string{fmt.Sprintf("[model] wake failed: %v", r.err)}
	}
	if e.newRec {
		if h, ok := r.sys.wakeOf[r.wake.ID]; ok {
			label := "idempotency"
			if m.wakes[h].sess != o.S {
				label = "isolation"
			}
			return []string{fmt.Sprintf("[%s] a new wake request returned existing wake %s of session %s", label, wakeName(h), sessionNames[m.wakes[h].sess])}
		}
		if p := r.sys.bindWake(e.wake, r.wake.ID); p != "" {
			return []string{p}
		}
	} else if r.wake.ID != r.sys.wakeID(e.wake) {
		return []string{fmt.Sprintf("[idempotency] an equal wake under used key %s returned %s, not %s",
			keyNames[o.Key], r.sys.nameWake(r.wake.ID), wakeName(e.wake))}
	}
	return compareWake(m, r.sys, e.wake, r.wake)
}

// --- claim wakes ---------------------------------------------------------------------------------

// ClaimWakesOp claims available wakes.
type ClaimWakesOp struct {
	Lease time.Duration
	Limit int
}

func (o ClaimWakesOp) String() string {
	return fmt.Sprintf("claimWakes lease=%v limit=%d", o.Lease, o.Limit)
}
func (o ClaimWakesOp) valid(*model) bool { return true }
func (o ClaimWakesOp) apply(m *model)    { m.claimWakes(int64(o.Lease), o.Limit) }

func (o ClaimWakesOp) exec(s *system, r *result) {
	r.wds, r.err = s.q().ClaimWakesAt(s.ctx, s.at(), o.Lease, o.Limit)
	if r.err == nil && r.wds == nil {
		r.wds = []work.WakeDelivery{}
	}
}

func (o ClaimWakesOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] claim of wakes failed: %v", r.err)}
	}
	s := r.sys
	var fails []string
	got := make([]int, len(r.wds))
	for i, d := range r.wds {
		h, ok := s.wakeOf[d.Wake.ID]
		if !ok {
			fails = append(fails, fmt.Sprintf("[fencing] claim delivered a wake the model does not know (%s)", s.showWake(d.Wake)))
			h = -1
		}
		got[i] = h
		fails = append(fails, s.checkWakeDelivery(h, d)...)
	}
	desc := func(h int) string {
		if h < 0 {
			return "?"
		}
		w := m.wakes[h]
		state := "unclaimed"
		switch {
		case w.acked:
			state = fmt.Sprintf("acknowledged by attempt %d", w.ackedBy)
		case w.claimed:
			state = fmt.Sprintf("attempt %d leased until %s", w.attempts, showTime(w.leaseExp))
		}
		return fmt.Sprintf("%s(%s)", wakeName(h), state)
	}
	fails = append(fails, compareClaims("wake", m.exp.claims, got, o.Limit, desc, func(h int) (string, string) { return describeWakeBefore(m, h, s) })...)
	for i, c := range m.exp.claims {
		if i >= len(r.wds) || got[i] != c.h {
			continue
		}
		d := r.wds[i]
		if d.Attempt != c.attempt {
			fails = append(fails, fmt.Sprintf("[attempts] claim of %s: delivery attempt %d, want %d", wakeName(c.h), d.Attempt, c.attempt))
		}
		if want := at(m.wakes[c.h].leaseExp); !d.LeaseExpiresAt.Equal(want) {
			fails = append(fails, fmt.Sprintf("[model] claim of %s: lease expires %v, want %v", wakeName(c.h), d.LeaseExpiresAt, want))
		}
		fails = append(fails, compareWake(m, s, c.h, d.Wake)...)
		s.wds[dkey{c.h, c.attempt}] = d
		s.noteWakeLease(c.h, d)
	}
	return fails
}

// --- acknowledge ---------------------------------------------------------------------------------

// AckOp acknowledges wake delivery W#Attempt (W -1: an unknown wake id).
type AckOp struct {
	W       int
	Attempt uint32
	Forged  bool
}

func (o AckOp) String() string {
	if o.W < 0 {
		return "ack " + wakeName(o.W)
	}
	f := ""
	if o.Forged {
		f = " [forged token]"
	}
	return fmt.Sprintf("ack %s#%d%s", wakeName(o.W), o.Attempt, f)
}

func (o AckOp) valid(m *model) bool {
	return o.W < 0 || o.W < len(m.wakes) && o.Attempt >= 1 && o.Attempt <= m.wakes[o.W].attempts
}

func (o AckOp) apply(m *model) { m.ack(o.W, o.Attempt, o.Forged) }

func (o AckOp) exec(s *system, r *result) {
	var d work.WakeDelivery
	if o.W < 0 {
		d = work.NewWakeDelivery(work.Wake{ID: unknownWakeID}, 1, at(0), forgedToken)
	} else {
		var ok bool
		if d, ok = s.wds[dkey{o.W, o.Attempt}]; !ok {
			r.problem = fmt.Sprintf("no delivery %s#%d was recorded", wakeName(o.W), o.Attempt)
			return
		}
		if o.Forged {
			d = work.NewWakeDelivery(d.Wake, d.Attempt, d.LeaseExpiresAt, forgedToken)
		}
	}
	r.id, r.token = d.Wake.ID, d.LeaseToken()
	r.err = s.q().AckWakeAt(s.ctx, d, s.at())
}

func (o AckOp) check(m *model, r *result) []string {
	e := m.exp
	name := fmt.Sprintf("%s#%d", wakeName(o.W), o.Attempt)
	if e.err == errStale {
		label := "fencing"
		if o.W >= 0 && m.wakes[o.W].pruned {
			label = "prune"
		}
		if r.err == nil {
			return []string{fmt.Sprintf("[%s] stale acknowledgment %s (%s) was accepted", label, name, e.why)}
		}
		return checkErr(r, errStale, label, e)
	}
	if r.err != nil {
		if e.events == 0 {
			return []string{fmt.Sprintf("[fencing] repeating the acknowledgment %s failed: %v", name, r.err)}
		}
		return []string{fmt.Sprintf("[model] the current delivery %s could not acknowledge: %v", name, r.err)}
	}
	r.sys.ackedW[o.W] = true
	return nil
}

// --- clock -----------------------------------------------------------------------------------------

// AdvanceOp moves the clock forward by D.
type AdvanceOp struct{ D time.Duration }

func (o AdvanceOp) String() string                 { return fmt.Sprintf("advance %v", o.D) }
func (o AdvanceOp) valid(*model) bool              { return o.D > 0 }
func (o AdvanceOp) apply(m *model)                 { m.now += int64(o.D) }
func (o AdvanceOp) exec(s *system, r *result)      { s.now += int64(o.D) }
func (o AdvanceOp) check(*model, *result) []string { return nil }

// --- restarts (durable backends only) ------------------------------------------------------------

// ReopenOp closes the store and opens the same directory again.
type ReopenOp struct{}

func (ReopenOp) String() string                     { return "reopen" }
func (ReopenOp) valid(m *model) bool                { return m.restartable }
func (ReopenOp) apply(*model)                       {}
func (ReopenOp) exec(s *system, r *result)          { r.err = s.restart(false) }
func (ReopenOp) check(m *model, r *result) []string { return checkRestart(m, "reopen", r) }

// CrashOp simulates a crash: it opens a clone of the filesystem that holds exactly the data
// synced so far, without closing the store first.
type CrashOp struct{}

func (CrashOp) String() string                     { return "crash" }
func (CrashOp) valid(m *model) bool                { return m.restartable }
func (CrashOp) apply(*model)                       {}
func (CrashOp) exec(s *system, r *result)          { r.err = s.restart(true) }
func (CrashOp) check(m *model, r *result) []string { return checkRestart(m, "crash", r) }

func checkRestart(m *model, what string, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[durability] %s failed: %v", what, r.err)}
	}
	return r.sys.checkWholeLog(m, what)
}

// --- invalid requests ------------------------------------------------------------------------------

// InvalidOp makes a request that validation must refuse with ErrInvalidRequest naming the
// field, storing nothing.
type InvalidOp struct{ Case int }

type invalidCase struct {
	name, field string
	do          func(s *system) error
}

var invalidCases = []invalidCase{
	{"submit with a blank kind", "kind", func(s *system) error {
		_, err := s.q().Session("s1").SubmitAt(s.ctx, work.TaskRequest{Kind: " \t"}, s.at())
		return err
	}},
	{"submit with a whitespace key", "idempotency_key", func(s *system) error {
		_, err := s.q().Session("s1").SubmitAt(s.ctx, work.TaskRequest{Kind: "thumb", IdempotencyKey: "  "}, s.at())
		return err
	}},
	{"submit with invalid JSON input", "input", func(s *system) error {
		_, err := s.q().Session("s1").SubmitAt(s.ctx, work.TaskRequest{Kind: "thumb", Input: json.RawMessage(`{"a":`)}, s.at())
		return err
	}},
	{"submit in a blank session", "session_id", func(s *system) error {
		_, err := s.q().Session(" ").SubmitAt(s.ctx, work.TaskRequest{Kind: "thumb"}, s.at())
		return err
	}},
	{"wake with invalid JSON payload", "payload", func(s *system) error {
		_, err := s.q().Session("s1").WakeAt(s.ctx, work.WakeRequest{Payload: json.RawMessage(`[1,`)}, s.at())
		return err
	}},
	{"wake with a whitespace key", "idempotency_key", func(s *system) error {
		_, err := s.q().Session("s2").WakeAt(s.ctx, work.WakeRequest{IdempotencyKey: "\n"}, s.at())
		return err
	}},
	{"claim with lease 0", "lease_for", func(s *system) error {
		_, err := s.q().ClaimDueAt(s.ctx, s.at(), 0, 10)
		return err
	}},
	{"claim with limit 0", "limit", func(s *system) error {
		_, err := s.q().ClaimDueAt(s.ctx, s.at(), time.Second, 0)
		return err
	}},
	{"claim wakes with a negative lease", "lease_for", func(s *system) error {
		_, err := s.q().ClaimWakesAt(s.ctx, s.at(), -time.Second, 10)
		return err
	}},
	{"claim wakes with limit 0", "limit", func(s *system) error {
		_, err := s.q().ClaimWakesAt(s.ctx, s.at(), time.Second, 0)
		return err
	}},
	{"finish with a non-terminal outcome", "outcome", func(s *system) error {
		d := work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken)
		_, err := s.q().FinishAt(s.ctx, d, work.Outcome{State: work.TaskRunning}, s.at())
		return err
	}},
	{"finish with a failure that carries output", "outcome", func(s *system) error {
		d := work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken)
		_, err := s.q().FinishAt(s.ctx, d, work.Outcome{State: work.TaskFailed, Error: "x", Output: json.RawMessage(`1`)}, s.at())
		return err
	}},
	{"finish with invalid JSON output", "output", func(s *system) error {
		d := work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken)
		_, err := s.q().FinishAt(s.ctx, d, work.Success(json.RawMessage(`{`)), s.at())
		return err
	}},
	{"read a blank task id", "task_id", func(s *system) error {
		_, _, err := s.q().Session("s1").Task(s.ctx, " ")
		return err
	}},
	{"cancel an empty task id", "task_id", func(s *system) error {
		_, err := s.q().Session("s1").CancelAt(s.ctx, "", s.at())
		return err
	}},
	// Part 2 (work-api-2.md); appended, so that saved histories keep their cases.
	{"extend with lease 0", "lease_for", func(s *system) error {
		d := work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken)
		_, err := s.q().ExtendAt(s.ctx, d, 0, s.at())
		return err
	}},
	{"extend a blank task id", "task_id", func(s *system) error {
		d := work.NewTaskDelivery(work.Task{ID: " "}, 1, at(0), forgedToken)
		_, err := s.q().ExtendAt(s.ctx, d, time.Second, s.at())
		return err
	}},
	{"release with RunAt out of range", "run_at", func(s *system) error {
		d := work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken)
		_, err := s.q().ReleaseAt(s.ctx, d, work.ReleaseRequest{RunAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)}, s.at())
		return err
	}},
	{"release with a reason over 64 KiB", "reason", func(s *system) error {
		d := work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken)
		_, err := s.q().ReleaseAt(s.ctx, d, work.ReleaseRequest{Reason: strings.Repeat("r", work.MaxReasonBytes+1)}, s.at())
		return err
	}},
	{"claim kinds with no kinds", "kinds", func(s *system) error {
		_, err := s.q().ClaimKindsAt(s.ctx, nil, s.at(), time.Second, 10)
		return err
	}},
	{"claim kinds with a blank kind", "kind", func(s *system) error {
		_, err := s.q().ClaimKindsAt(s.ctx, []string{"thumb", " "}, s.at(), time.Second, 10)
		return err
	}},
	{"tasks with limit 0", "limit", func(s *system) error {
		_, err := s.q().Session("s1").Tasks(s.ctx, work.TaskFilter{})
		return err
	}},
	{"settle and claim with a negative limit", "limit", func(s *system) error {
		_, _, err := s.q().SettleAndClaimAt(s.ctx, nil, nil, s.at(), time.Second, -1)
		return err
	}},
	// Retention; appended like part 2's.
	{"prune with before out of range", "before", func(s *system) error {
		_, err := s.q().Prune(s.ctx, time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC))
		return err
	}},
}

func (o InvalidOp) String() string    { return "invalid: " + invalidCases[o.Case].name }
func (o InvalidOp) valid(*model) bool { return o.Case >= 0 && o.Case < len(invalidCases) }
func (o InvalidOp) apply(m *model) {
	m.exp.err, m.exp.field = errInvalid, invalidCases[o.Case].field
}
func (o InvalidOp) exec(s *system, r *result) { r.err = invalidCases[o.Case].do(s) }
func (o InvalidOp) check(m *model, r *result) []string {
	if r.err == nil {
		return []string{fmt.Sprintf("[errors] %s was accepted", invalidCases[o.Case].name)}
	}
	return checkErr(r, errInvalid, "errors", m.exp)
}
