package proptest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// system is one backend under test plus what the test knows about it: the real ids behind the
// model's handles and every delivery it ever returned, keyed by (handle, attempt), so that
// later ops can present current, stale, repeated and forged deliveries.
//
// Alignment of model and system: ops name records by model handle. A handle is bound to a
// real id in the PostCondition of the op that created it, from what the system returned
// (Submit, Wake) or from the events it appended (completion wakes, read from the log in
// creation order). Deliveries are bound in the PostCondition of a claim, position by position
// against the model's predicted claim list, and only where the ids agree. Once a history
// has failed, later steps are not checked (the property is already false).
type system struct {
	name string
	st   store
	ctx  context.Context
	now  int64 // mirror of the model clock; AdvanceOp moves both

	taskIDs []string
	taskOf  map[string]int
	wakeIDs []string
	wakeOf  map[string]int
	tds     map[dkey]work.TaskDelivery
	wds     map[dkey]work.WakeDelivery

	nextSeq   uint64            // next event sequence to read from the log
	cw        map[string]int    // task id -> completion wakes recorded in the log
	settled   map[int]work.Task // first terminal snapshot of each task handle
	taskLease map[int]leaseSeen // latest task delivery returned, per handle
	wakeLease map[int]leaseSeen // latest wake delivery returned, per handle
	ackedW    map[int]bool      // wake handles whose acknowledgment succeeded
	tokens    map[string]bool   // every lease token returned so far
	taskSess  []string          // the session of each task handle
	// log is every event the store acknowledged and no Prune removed, in order (Prune,
	// ops_prune_test.go, moves the events of the subjects it removes to pruned): the log
	// ReadLog must return, with exactly the pruned sequences as its gaps.
	log    []logged
	pruned map[uint64]bool
	failed bool // a check failed; later steps are not checked
	tr     *trace
}

type dkey struct {
	h       int
	attempt uint32
}

type leaseSeen struct {
	attempt uint32
	until   time.Time
}

func newSystem(name string, st store, tr *trace) *system {
	return &system{
		name: name, st: st, ctx: context.Background(), tr: tr,
		taskOf: map[string]int{}, wakeOf: map[string]int{},
		tds: map[dkey]work.TaskDelivery{}, wds: map[dkey]work.WakeDelivery{},
		nextSeq: 1, cw: map[string]int{}, settled: map[int]work.Task{},
		taskLease: map[int]leaseSeen{}, wakeLease: map[int]leaseSeen{},
		ackedW: map[int]bool{}, tokens: map[string]bool{}, pruned: map[uint64]bool{},
	}
}

func (s *system) q() *work.Queue { return s.st.queue() }
func (s *system) at() time.Time  { return at(s.now) }

func (s *system) restart(crash bool) error {
	if crash {
		return s.st.crash()
	}
	return s.st.reopen()
}

func (s *system) taskID(h int) string {
	if h < 0 || h >= len(s.taskIDs) {
		return unknownTaskID
	}
	return s.taskIDs[h]
}

func (s *system) wakeID(h int) string {
	if h < 0 || h >= len(s.wakeIDs) {
		return unknownWakeID
	}
	return s.wakeIDs[h]
}

func (s *system) bindTask(h int, id, sess string) string {
	if h != len(s.taskIDs) {
		return fmt.Sprintf("[harness] binding task handle %d but %d are bound", h, len(s.taskIDs))
	}
	s.taskIDs = append(s.taskIDs, id)
	s.taskSess = append(s.taskSess, sess)
	s.taskOf[id] = h
	return ""
}

func (s *system) bindWake(h int, id string) string {
	if h != len(s.wakeIDs) {
		return fmt.Sprintf("[harness] binding wake handle %d but %d are bound", h, len(s.wakeIDs))
	}
	if _, dup := s.wakeOf[id]; dup {
		return fmt.Sprintf("[completion-wake] wake id %s recorded twice", id)
	}
	s.wakeIDs = append(s.wakeIDs, id)
	s.wakeOf[id] = h
	return ""
}

func (s *system) nameTask(id string) string {
	if h, ok := s.taskOf[id]; ok {
		return taskName(h)
	}
	if id == unknownTaskID {
		return "<unknown task>"
	}
	return "?" + id
}

func (s *system) nameWake(id string) string {
	if h, ok := s.wakeOf[id]; ok {
		return wakeName(h)
	}
	if id == unknownWakeID {
		return "<unknown wake>"
	}
	return "?" + id
}

// result is what one op did on one system.
type result struct {
	sys       *system
	err       error
	task      work.Task
	found     bool
	wake      work.Wake
	tds       []work.TaskDelivery
	wds       []work.WakeDelivery
	id        string              // the task or wake id the call named
	token     string              // the lease token the call presented
	list      []work.Task         // Session.Tasks
	results   []work.SettleResult // SettleAndClaim
	ids       []string            // SettleAndClaim: the task id each settle named
	tokens    []string            // SettleAndClaim: the token each settle presented
	problem   string              // the op could not run (missing delivery) or panicked
	events    []events.Event
	prune     *work.PruneResult          // Prune
	snap      *pruneSnap                 // Prune: the system just before it
	schedules []string                   // SetSchedule, RemoveSchedule: the session's listing after it
	policies  map[string]work.KindPolicy // SetKindPolicy: KindPolicies after it
}

// execute runs o on s, turning a panic into a result problem.
func (s *system) execute(o op) (r *result) {
	r = &result{sys: s}
	defer func() {
		if p := recover(); p != nil {
			r.problem = fmt.Sprintf("panic: %v", p)
		}
	}()
	o.exec(s, r)
	return r
}

// readNew reads the events appended since the last call.
func (s *system) readNew() ([]events.Event, string) {
	var evs []events.Event
	err := s.q().ReadLog(s.ctx, s.nextSeq, func(e events.Event) error {
		evs = append(evs, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Sprintf("[replay] ReadLog from %d failed: %v", s.nextSeq, err)
	}
	for _, e := range evs {
		if e.Head().Seq != s.nextSeq {
			return evs, fmt.Sprintf("[replay] ReadLog gave seq %d, want %d", e.Head().Seq, s.nextSeq)
		}
		s.nextSeq++
		tid, wid := e.Subject()
		s.log = append(s.log, logged{seq: e.Head().Seq, task: tid, wake: wid})
		if w, ok := e.(*events.WakeRecorded); ok && w.Reason == events.WakeTaskFinished {
			s.cw[w.TaskID]++
		}
	}
	return evs, ""
}

// post checks one step: the op's own expectations, then the invariants that hold after every
// step.
func (s *system) post(o op, m *model, r *result) []string {
	if s.failed {
		return nil
	}
	if r.problem != "" {
		return []string{"[harness] " + r.problem}
	}
	evs, p := s.readNew()
	if p != "" {
		return []string{p}
	}
	r.events = evs
	fails := s.bindTicks(m, r) // before the op's check: a claim may deliver them
	fails = append(fails, o.check(m, r)...)
	fails = append(fails, s.bindCompletionWakes(m, r)...)
	fails = append(fails, s.checkLog(m, r)...)
	fails = append(fails, s.checkCompletionWakes(m)...)
	if !skipVerify {
		if err := s.q().Verify(s.ctx); err != nil {
			fails = append(fails, fmt.Sprintf("[replay] Verify: %v", err))
		}
	}
	fails = append(fails, s.checkAllTasks(m)...)
	fails = append(fails, s.checkStats(m)...)
	return fails
}

// checkStats compares Queue.StatsAt(now) with the model's counts: tasks by state and by kind
// (kinds in name order, only those with tasks), the number due now (pending and scheduled at
// or before now, or running with an expired lease) and the oldest of them.
func (s *system) checkStats(m *model) []string {
	st, err := s.q().StatsAt(s.ctx, s.at())
	if err != nil {
		return []string{fmt.Sprintf("[stats] StatsAt failed: %v", err)}
	}
	var want work.QueueStats
	want.At = s.at()
	byKind := map[string]*work.StateCounts{}
	add := func(c *work.StateCounts, state mState) {
		switch state {
		case mPending:
			c.Pending++
		case mRunning:
			c.Running++
		case mSucceeded:
			c.Succeeded++
		case mFailed:
			c.Failed++
		case mCanceled:
			c.Canceled++
		}
	}
	for _, t := range m.tasks {
		if t.pruned {
			continue
		}
		add(&want.Total, t.state)
		k := kindNames[t.kind]
		if byKind[k] == nil {
			byKind[k] = &work.StateCounts{}
		}
		add(byKind[k], t.state)
	}
	names := make([]string, 0, len(byKind))
	for k := range byKind {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		want.Kinds = append(want.Kinds, work.KindStats{Kind: k, StateCounts: *byKind[k]})
	}
	el := m.eligibleTasks()
	want.DueNow = int64(len(el))
	if len(el) > 0 {
		oldest := el[0].since // el is in claim order, priority first: the oldest is the least
		for _, c := range el {
			oldest = min(oldest, c.since)
		}
		want.OldestDueAt = at(oldest)
		want.OldestDueAge = time.Duration(m.now - oldest)
	}
	show := func(q work.QueueStats) string {
		return fmt.Sprintf("total %+v kinds %+v due %d oldest %s age %v", q.Total, q.Kinds, q.DueNow, showT(q.OldestDueAt), q.OldestDueAge)
	}
	if !st.At.Equal(want.At) || show(st) != show(want) {
		return []string{fmt.Sprintf("[stats] Stats at %s: %s, want %s", showTime(s.now), show(st), show(want))}
	}
	return nil
}

func isAudit(e events.Event) bool {
	t := e.Type()
	return t == events.TypeTaskSettleRejected || t == events.TypeWakeAckRejected || t == events.TypeTaskSubmitRejected
}

// bindCompletionWakes binds the completion wakes the model says this op recorded to the
// WakeRecorded events the system appended, in order.
func (s *system) bindCompletionWakes(m *model, r *result) []string {
	var got []*events.WakeRecorded
	for _, e := range r.events {
		if w, ok := e.(*events.WakeRecorded); ok && w.Reason == events.WakeTaskFinished {
			got = append(got, w)
		}
	}
	var fails []string
	if len(got) != len(m.exp.newCW) {
		var want []string
		for _, w := range m.exp.newCW {
			want = append(want, taskName(m.wakes[w].task))
		}
		var have []string
		for _, w := range got {
			have = append(have, s.nameTask(w.TaskID))
		}
		fails = append(fails, fmt.Sprintf("[completion-wake] the step recorded completion wakes for %v, want for %v", have, want))
	}
	for i, w := range m.exp.newCW {
		if i >= len(got) {
			break
		}
		if tid := s.taskID(m.wakes[w].task); got[i].TaskID != tid {
			fails = append(fails, fmt.Sprintf("[completion-wake] completion wake %s is for %s, want %s", wakeName(w), s.nameTask(got[i].TaskID), taskName(m.wakes[w].task)))
			continue
		}
		if p := s.bindWake(w, got[i].WakeID); p != "" {
			fails = append(fails, p)
		}
	}
	return fails
}

// checkLog compares the events the op appended with the state changes the model made:
// rejected calls store nothing (except one audit record for a stale settlement or
// acknowledgment), and each transition is one event.
func (s *system) checkLog(m *model, r *result) []string {
	var state, audit []string
	for _, e := range r.events {
		if isAudit(e) {
			audit = append(audit, e.Type().String())
		} else {
			state = append(state, e.Type().String())
		}
	}
	var fails []string
	if len(state) != m.exp.events {
		label := "log"
		switch m.exp.err {
		case errConflict:
			label = "idempotency"
		case errStale, errTransition:
			label = "fencing"
		}
		why := ""
		if m.exp.events == 0 {
			why = " (a refused or repeated call must not change the log)"
		}
		fails = append(fails, fmt.Sprintf("[%s] the step appended %d state events %v, want %d%s",
			label, len(state), state, m.exp.events, why))
	}
	allowed := m.exp.audits
	if m.exp.audit {
		allowed = max(allowed, 1)
	}
	if len(audit) > allowed {
		fails = append(fails, fmt.Sprintf("[log] unexpected audit events %v", audit))
	}
	return fails
}

// checkCompletionWakes: a task with WakeOnCompletion has exactly one completion wake once it
// is terminal, whichever way it ended, and none before, for each run (a retry starts a new
// one); other tasks have none.
func (s *system) checkCompletionWakes(m *model) []string {
	var fails []string
	seen := 0
	for h, t := range m.tasks {
		if h >= len(s.taskIDs) {
			break
		}
		want := 0
		if t.wake && t.state.terminal() {
			want = 1
		}
		if t.wake {
			want += t.retries // each retried run ended with its own (acknowledged) wake
		}
		got := s.cw[s.taskIDs[h]]
		seen += got
		if got != want {
			fails = append(fails, fmt.Sprintf("[completion-wake] %s (wake=%v, %s) has %d completion wakes in the log, want %d",
				taskName(h), t.wake, t.state, got, want))
		}
	}
	total := 0
	for _, n := range s.cw {
		total += n
	}
	if total != seen {
		fails = append(fails, fmt.Sprintf("[completion-wake] the log holds %d completion wakes for tasks the model does not know", total-seen))
	}
	return fails
}

// checkAllTasks reads every task back: through its session it equals the model; through
// another session it does not exist; once settled it never changes.
func (s *system) checkAllTasks(m *model) []string {
	var fails []string
	for h := range m.tasks {
		if h >= len(s.taskIDs) {
			return append(fails, fmt.Sprintf("[harness] %s has no id", taskName(h)))
		}
		t := m.tasks[h]
		id := s.taskIDs[h]
		got, found, err := s.q().Session(sessionNames[t.sess]).Task(s.ctx, id)
		if t.pruned {
			if err != nil || found {
				fails = append(fails, fmt.Sprintf("[prune] pruned task %s reads back through its session %s (found=%v, err=%v), want absent",
					taskName(h), sessionNames[t.sess], found, err))
			}
			continue
		}
		switch {
		case err != nil:
			fails = append(fails, fmt.Sprintf("[model] reading %s back failed: %v", taskName(h), err))
			continue
		case !found:
			fails = append(fails, fmt.Sprintf("[model] %s cannot be read back by its session %s", taskName(h), sessionNames[t.sess]))
			continue
		}
		fails = append(fails, compareTask(m, s, h, got, "read back")...)
		other := (t.sess + 1) % m.nSess
		if _, found, err := s.q().Session(sessionNames[other]).Task(s.ctx, id); err != nil || found {
			fails = append(fails, fmt.Sprintf("[isolation] session %s can read %s of session %s (found=%v, err=%v)",
				sessionNames[other], taskName(h), sessionNames[t.sess], found, err))
		}
		if got.State.Terminal() {
			if first, ok := s.settled[h]; !ok {
				s.settled[h] = got
			} else if d := diffTasks(first, got); d != "" {
				fails = append(fails, fmt.Sprintf("[fencing] settled task %s changed: %s", taskName(h), d))
			}
		}
	}
	return fails
}

// checkWholeLog checks after a restart that no acknowledged event was lost or added, and
// that no pruned one came back: the log is exactly the retained events, and the fold of it
// across the pruned gaps is consistent (foldLog).
func (s *system) checkWholeLog(m *model, what string) []string {
	mem, fails := s.foldLog("durability", "after "+what)
	if mem != nil {
		fails = checkFold(m, s, mem, "after "+what)
	}
	return fails
}

// checkTaskDelivery holds for any delivery, whatever the model says: a fresh unique token
// that fmt never prints, no redelivery of a settled task or under a live lease.
func (s *system) checkTaskDelivery(h int, d work.TaskDelivery) []string {
	fails := s.checkToken(d.LeaseToken(), d)
	if h < 0 {
		return fails
	}
	if _, ok := s.settled[h]; ok {
		fails = append(fails, fmt.Sprintf("[fencing] settled task %s was delivered again", taskName(h)))
	}
	if prev, ok := s.taskLease[h]; ok && prev.until.After(s.at()) {
		fails = append(fails, fmt.Sprintf("[fencing] %s delivered again at %s while attempt %d is leased until %s",
			taskName(h), showTime(s.now), prev.attempt, showTime(int64(prev.until.Sub(t0)))))
	}
	return fails
}

func (s *system) noteTaskLease(h int, d work.TaskDelivery) {
	s.taskLease[h] = leaseSeen{d.Attempt, d.LeaseExpiresAt}
}

func (s *system) checkWakeDelivery(h int, d work.WakeDelivery) []string {
	fails := s.checkToken(d.LeaseToken(), d)
	if h < 0 {
		return fails
	}
	if s.ackedW[h] {
		fails = append(fails, fmt.Sprintf("[fencing] acknowledged wake %s was delivered again", wakeName(h)))
	}
	if prev, ok := s.wakeLease[h]; ok && prev.until.After(s.at()) {
		fails = append(fails, fmt.Sprintf("[fencing] %s delivered again at %s while attempt %d is leased until %s",
			wakeName(h), showTime(s.now), prev.attempt, showTime(int64(prev.until.Sub(t0)))))
	}
	return fails
}

func (s *system) noteWakeLease(h int, d work.WakeDelivery) {
	s.wakeLease[h] = leaseSeen{d.Attempt, d.LeaseExpiresAt}
}

func (s *system) checkToken(token string, d any) []string {
	var fails []string
	if token == "" {
		fails = append(fails, "[fencing] a delivery has an empty lease token")
	} else if s.tokens[token] {
		fails = append(fails, "[fencing] a lease token was handed out twice")
	}
	s.tokens[token] = true
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		if token != "" && strings.Contains(fmt.Sprintf(verb, d), token) {
			fails = append(fails, fmt.Sprintf("[redaction] fmt %s of a delivery shows its lease token", verb))
		}
	}
	return fails
}

// --- comparisons ---------------------------------------------------------------------------------

func taskState(s mState) work.TaskState {
	return [...]work.TaskState{work.TaskPending, work.TaskRunning, work.TaskSucceeded, work.TaskFailed, work.TaskCanceled}[s]
}

func wantOutcome(i int) work.Outcome {
	o := outcomePool[i]
	w := work.Outcome{State: taskState(o.state), Summary: o.summary, Error: o.errMsg}
	if o.state == mSucceeded {
		w.Output = []byte(stored(o.output))
	}
	return w
}

func sameOutcomeValue(a, b *work.Outcome) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.State == b.State && a.Summary == b.Summary && a.Error == b.Error && bytes.Equal(a.Output, b.Output)
}

func showOutcomeValue(o *work.Outcome) string {
	if o == nil {
		return "nil"
	}
	return fmt.Sprintf("{%s summary=%q error=%q output=%s}", o.State, o.Summary, o.Error, o.Output)
}

func timeOrZero(ok bool, off int64) time.Time {
	if !ok {
		return time.Time{}
	}
	return at(off)
}

func sameTime(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() && b.IsZero()
	}
	return a.Equal(b)
}

func showT(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return showTime(int64(t.Sub(t0)))
}

// compareTask compares a snapshot the system returned with the model's record of handle h.
func compareTask(m *model, s *system, h int, got work.Task, how string) []string {
	return compareTaskRec(s, h, m.tasks[h], got, how)
}

// compareTaskRec compares a snapshot with t, the model's record of handle h at some point.
func compareTaskRec(s *system, h int, t mTask, got work.Task, how string) []string {
	var fails []string
	bad := func(label, field string, g, w any) {
		fails = append(fails, fmt.Sprintf("[%s] %s task %s: %s is %v, want %v", label, how, taskName(h), field, g, w))
	}
	if got.ID != s.taskID(h) {
		bad("model", "id", s.nameTask(got.ID), taskName(h))
	}
	if got.SessionID != sessionNames[t.sess] {
		bad("isolation", "session", got.SessionID, sessionNames[t.sess])
	}
	if got.Kind != kindNames[t.kind] {
		bad("model", "kind", got.Kind, kindNames[t.kind])
	}
	if string(got.Input) != stored(t.input) {
		bad("model", "input", string(got.Input), stored(t.input))
	}
	if got.State != taskState(t.state) {
		bad("model", "state", got.State, t.state)
	}
	if w := timeOrZero(t.cancelReq, t.cancelAt); !sameTime(got.CancelRequestedAt, w) {
		bad("model", "cancel requested at", showT(got.CancelRequestedAt), showT(w))
	}
	wantKey := ""
	switch {
	case t.isTick:
		wantKey = tickKey(t.sched, t.tick)
	case t.key >= 0:
		wantKey = keyNames[t.key]
	}
	if got.IdempotencyKey != wantKey {
		bad("model", "key", got.IdempotencyKey, wantKey)
	}
	if !sameTime(got.ScheduledAt, at(t.scheduled)) {
		bad("model", "scheduled at", showT(got.ScheduledAt), showTime(t.scheduled))
	}
	if !t.inbox && !sameTime(got.CreatedAt, at(t.created)) { // an inbox task's is the queue's clock at the take-in
		bad("model", "created at", showT(got.CreatedAt), showTime(t.created))
	}
	if got.Attempts != t.attempts {
		bad("attempts", "attempts", got.Attempts, t.attempts)
	}
	if w := timeOrZero(t.state.terminal(), t.finished); !sameTime(got.FinishedAt, w) {
		bad("model", "finished at", showT(got.FinishedAt), showT(w))
	}
	if t.state.terminal() {
		w := wantOutcome(t.outcome)
		if !sameOutcomeValue(got.Outcome, &w) {
			bad("model", "outcome", showOutcomeValue(got.Outcome), showOutcomeValue(&w))
		}
	} else if got.Outcome != nil {
		bad("model", "outcome", showOutcomeValue(got.Outcome), "nil")
	}
	return fails
}

// diffTasks describes how two snapshots of the same task differ, or returns "".
func diffTasks(a, b work.Task) string {
	var d []string
	if a.State != b.State {
		d = append(d, fmt.Sprintf("state %s -> %s", a.State, b.State))
	}
	if a.Attempts != b.Attempts {
		d = append(d, fmt.Sprintf("attempts %d -> %d", a.Attempts, b.Attempts))
	}
	if !sameTime(a.FinishedAt, b.FinishedAt) {
		d = append(d, fmt.Sprintf("finished %s -> %s", showT(a.FinishedAt), showT(b.FinishedAt)))
	}
	if !sameTime(a.CancelRequestedAt, b.CancelRequestedAt) {
		d = append(d, fmt.Sprintf("cancel requested %s -> %s", showT(a.CancelRequestedAt), showT(b.CancelRequestedAt)))
	}
	if !sameOutcomeValue(a.Outcome, b.Outcome) {
		d = append(d, fmt.Sprintf("outcome %s -> %s", showOutcomeValue(a.Outcome), showOutcomeValue(b.Outcome)))
	}
	if !bytes.Equal(a.Input, b.Input) || a.Kind != b.Kind || a.SessionID != b.SessionID ||
		a.IdempotencyKey != b.IdempotencyKey || !sameTime(a.ScheduledAt, b.ScheduledAt) || !sameTime(a.CreatedAt, b.CreatedAt) {
		d = append(d, "request fields changed")
	}
	return strings.Join(d, ", ")
}

// compareWake compares a wake snapshot with the model's record of handle h.
func compareWake(m *model, s *system, h int, got work.Wake) []string {
	w := m.wakes[h]
	var fails []string
	bad := func(label, field string, g, want any) {
		fails = append(fails, fmt.Sprintf("[%s] wake %s: %s is %v, want %v", label, wakeName(h), field, g, want))
	}
	if got.ID != s.wakeID(h) {
		bad("model", "id", s.nameWake(got.ID), wakeName(h))
	}
	if got.SessionID != sessionNames[w.sess] {
		bad("isolation", "session", got.SessionID, sessionNames[w.sess])
	}
	if !sameTime(got.CreatedAt, at(w.created)) {
		bad("model", "created at", showT(got.CreatedAt), showTime(w.created))
	}
	wantKey := ""
	if w.direct && w.key >= 0 {
		wantKey = keyNames[w.key]
	}
	if got.IdempotencyKey != wantKey {
		bad("model", "key", got.IdempotencyKey, wantKey)
	}
	r := got.Reason
	if w.direct {
		if r.Kind != work.WakeRequested || string(r.Payload) != stored(w.payload) || r.TaskID != "" || r.Outcome != nil {
			bad("model", "reason", showReason(s, r), fmt.Sprintf("requested payload=%s", stored(w.payload)))
		}
		return fails
	}
	o := wantOutcome(w.outcome)
	if r.Kind != work.WakeTaskFinished || r.TaskID != s.taskID(w.task) || r.State != o.State ||
		!sameOutcomeValue(r.Outcome, &o) || len(r.Payload) != 0 {
		bad("completion-wake", "reason", showReason(s, r), fmt.Sprintf("task_finished %s %s %s", taskName(w.task), o.State, showOutcomeValue(&o)))
	}
	return fails
}

func showReason(s *system, r work.WakeReason) string {
	if r.Kind == work.WakeRequested {
		return fmt.Sprintf("requested payload=%s", r.Payload)
	}
	return fmt.Sprintf("%s %s %s %s", r.Kind, s.nameTask(r.TaskID), r.State, showOutcomeValue(r.Outcome))
}

// compareClaims compares the handles a claim delivered with the model's prediction and names
// the property each difference breaks.
func compareClaims(what string, want []claimed, got []int, limit int, state func(int) string, extraWhy func(int) (string, string)) []string {
	var fails []string
	inGot := map[int]int{}
	for _, h := range got {
		inGot[h]++
		if inGot[h] == 2 {
			fails = append(fails, fmt.Sprintf("[fencing] one claim delivered %s %s twice", what, state(h)))
		}
	}
	inWant := map[int]bool{}
	for _, c := range want {
		inWant[c.h] = true
		if inGot[c.h] == 0 {
			why := "due"
			if c.expired {
				why = "lease expired"
			}
			fails = append(fails, fmt.Sprintf("[at-least-once] %s %s, eligible since %s (%s), was not delivered by a claim with limit %d (delivered %d)",
				what, name(what, c.h), showTime(c.since), why, limit, len(got)))
		}
	}
	for _, h := range got {
		if !inWant[h] && h >= 0 {
			label, why := extraWhy(h)
			fails = append(fails, fmt.Sprintf("[%s] %s %s was delivered but is not eligible: %s", label, what, state(h), why))
		}
	}
	if len(fails) == 0 {
		for i := range got {
			if got[i] != want[i].h {
				var g, w []string
				for i := range got {
					g = append(g, name(what, got[i]))
					w = append(w, fmt.Sprintf("%s(since %s)", name(what, want[i].h), showTime(want[i].since)))
				}
				fails = append(fails, fmt.Sprintf("[claim-order] delivered %v, want %v: higher priority first, then eligible first, ties by submission order", g, w))
				break
			}
		}
	}
	return fails
}

func name(what string, h int) string {
	if what == "task" {
		return taskName(h)
	}
	return wakeName(h)
}

// describeTaskBefore says why a task the model did not claim must not be delivered (its
// state did not change, so the next state shows it as it was).
func describeTaskBefore(m *model, h int, _ *system) (string, string) {
	t := m.tasks[h]
	if since, ok := t.eligible(m.now); ok {
		return "model", fmt.Sprintf("eligible since %s, but beyond the claim's limit (or out of order)", showTime(since))
	}
	switch t.state {
	case mPending:
		return "at-least-once", fmt.Sprintf("due only at %s", showTime(t.scheduled))
	case mRunning:
		return "fencing", fmt.Sprintf("its lease is live until %s", showTime(t.leaseExp))
	}
	return "fencing", "it is " + t.state.String()
}

func describeWakeBefore(m *model, h int, _ *system) (string, string) {
	w := m.wakes[h]
	if since, ok := w.available(m.now); ok {
		return "model", fmt.Sprintf("available since %s, but beyond the claim's limit (or out of order)", showTime(since))
	}
	if w.acked {
		return "fencing", "it was acknowledged"
	}
	return "fencing", fmt.Sprintf("its lease is live until %s", showTime(w.leaseExp))
}

// --- errors ----------------------------------------------------------------------------------------

var sentinels = []struct {
	kind errKind
	err  error
}{
	{errInvalid, work.ErrInvalidRequest},
	{errNotFound, work.ErrTaskNotFound},
	{errConflict, work.ErrIdempotencyConflict},
	{errStale, work.ErrStaleDelivery},
	{errTransition, work.ErrInvalidTransition},
	{errNone, work.ErrBackend},
}

func isKind(err error, k errKind) bool {
	for _, s := range sentinels {
		if s.kind == k && k != errNone {
			return errors.Is(err, s.err)
		}
	}
	return false
}

// checkErr checks an error against the model's expectation: the kind (exactly one sentinel
// matches), the detail fields, the seed's message, and that no lease token leaks into it.
func checkErr(r *result, want errKind, label string, e expect) []string {
	err := r.err
	if err == nil {
		return []string{fmt.Sprintf("[%s] want %v, got success", label, want)}
	}
	var fails []string
	n := 0
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			n++
		}
	}
	if n != 1 {
		fails = append(fails, fmt.Sprintf("[errors] %q matches %d kind sentinels, want exactly 1", err, n))
	}
	if !isKind(err, want) {
		return append(fails, fmt.Sprintf("[%s] want %v (%s), got %v", label, want, e.why, err))
	}
	var we *work.Error
	if !errors.As(err, &we) {
		return append(fails, fmt.Sprintf("[errors] %v is not a *work.Error", err))
	}
	msg := err.Error()
	switch want {
	case errInvalid:
		if we.Field != e.field {
			fails = append(fails, fmt.Sprintf("[errors] invalid request names field %q, want %q", we.Field, e.field))
		}
		if p := "invalid work request field " + e.field + ": "; !strings.HasPrefix(msg, p) {
			fails = append(fails, fmt.Sprintf("[errors] message %q does not start with %q", msg, p))
		}
	case errNotFound:
		if we.ID != r.id || msg != "task not found: "+r.id {
			fails = append(fails, fmt.Sprintf("[errors] not found names %q (%q), want %s", we.ID, msg, r.sys.nameTask(r.id)))
		}
	case errStale:
		if we.ID != r.id || msg != "delivery no longer owns "+r.id {
			fails = append(fails, fmt.Sprintf("[errors] stale delivery names %q (%q), want the id of the delivery", we.ID, msg))
		}
	case errConflict:
		// The conflict names the key, the first differing field and the existing record.
		id := r.sys.taskID(e.task)
		if e.field == "payload" {
			id = r.sys.wakeID(e.wake)
		}
		want := "idempotency key was reused for different work: " + e.key + " (" + e.field + " differs from " + id + ")"
		if we.Key != e.key || we.Field != e.field || we.ID != id || msg != want {
			fails = append(fails, fmt.Sprintf("[errors] conflict names key %q, field %q, id %q (%q), want %q", we.Key, we.Field, we.ID, msg, want))
		}
	case errTransition:
		if !strings.HasPrefix(msg, "invalid work transition: ") {
			fails = append(fails, fmt.Sprintf("[errors] message %q", msg))
		}
	}
	if r.token != "" && r.token != forgedToken && strings.Contains(fmt.Sprintf("%v %+v", err, err), r.token) {
		fails = append(fails, "[redaction] an error shows the lease token")
	}
	return fails
}

// --- rendering in handle space (trace and differential) -----------------------------------------

func (s *system) showTask(t work.Task, full bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s attempts=%d", s.nameTask(t.ID), t.State, t.Attempts)
	if !t.CancelRequestedAt.IsZero() {
		fmt.Fprintf(&b, " cancel=%s", showT(t.CancelRequestedAt))
	}
	if full {
		fmt.Fprintf(&b, " {%s %s key=%q input=%s scheduled=%s created=%s finished=%s outcome=%s}",
			t.SessionID, t.Kind, t.IdempotencyKey, t.Input, showT(t.ScheduledAt), showT(t.CreatedAt),
			showT(t.FinishedAt), showOutcomeValue(t.Outcome))
	} else if t.Outcome != nil {
		fmt.Fprintf(&b, " %s", showOutcomeValue(t.Outcome))
	}
	return b.String()
}

func (s *system) showWake(w work.Wake) string {
	return fmt.Sprintf("%s{%s key=%q created=%s %s}", s.nameWake(w.ID), w.SessionID, w.IdempotencyKey, showT(w.CreatedAt), showReason(s, w.Reason))
}

func (s *system) showErr(err error) string {
	var we *work.Error
	kind := "?"
	for _, k := range sentinels {
		if errors.Is(err, k.err) {
			kind = k.err.Error()
		}
	}
	msg := err.Error()
	for id, h := range s.taskOf {
		msg = strings.ReplaceAll(msg, id, taskName(h))
	}
	for id, h := range s.wakeOf {
		msg = strings.ReplaceAll(msg, id, wakeName(h))
	}
	if errors.As(err, &we) {
		return fmt.Sprintf("error(%s field=%q key=%q: %s)", kind, we.Field, we.Key, msg)
	}
	return fmt.Sprintf("error(%s: %s)", kind, msg)
}

// render describes a result with ids replaced by handles, so that results of different
// backends compare equal when they behave alike. full adds every field and the events.
func (r *result) render(full bool) string {
	s := r.sys
	if r.problem != "" {
		return "problem: " + r.problem
	}
	var parts []string
	if r.err != nil {
		parts = append(parts, s.showErr(r.err))
	}
	if r.task.ID != "" {
		parts = append(parts, s.showTask(r.task, full))
	}
	if r.found {
		parts = append(parts, "found")
	}
	if r.wake.ID != "" {
		parts = append(parts, s.showWake(r.wake))
	}
	if r.tds != nil {
		var ds []string
		for _, d := range r.tds {
			x := fmt.Sprintf("%s#%d until %s", s.nameTask(d.Task.ID), d.Attempt, showT(d.LeaseExpiresAt))
			if full {
				x += " (" + s.showTask(d.Task, true) + ")"
			}
			ds = append(ds, x)
		}
		parts = append(parts, fmt.Sprintf("delivered [%s]", strings.Join(ds, ", ")))
	}
	if r.wds != nil {
		var ds []string
		for _, d := range r.wds {
			x := fmt.Sprintf("%s#%d until %s", s.nameWake(d.Wake.ID), d.Attempt, showT(d.LeaseExpiresAt))
			if full {
				x += " (" + s.showWake(d.Wake) + ")"
			}
			ds = append(ds, x)
		}
		parts = append(parts, fmt.Sprintf("delivered [%s]", strings.Join(ds, ", ")))
	}
	if r.list != nil {
		var ts []string
		for _, t := range r.list {
			ts = append(ts, s.showTask(t, full))
		}
		parts = append(parts, fmt.Sprintf("listed [%s]", strings.Join(ts, ", ")))
	}
	if r.results != nil {
		var rs []string
		for _, x := range r.results {
			if x.Err != nil {
				rs = append(rs, s.showErr(x.Err))
			} else {
				rs = append(rs, s.showTask(x.Task, full))
			}
		}
		parts = append(parts, fmt.Sprintf("settled [%s]", strings.Join(rs, ", ")))
	}
	if r.prune != nil {
		parts = append(parts, fmt.Sprintf("pruned tasks=%d wakes=%d events=%d", r.prune.Tasks, r.prune.Wakes, r.prune.Events))
	}
	if full {
		var evs []string
		for _, e := range r.events {
			tid, wid := e.Subject()
			subj := s.nameTask(tid)
			if wid != "" {
				subj = s.nameWake(wid)
			}
			evs = append(evs, fmt.Sprintf("%s(%s)", e.Type(), subj))
		}
		parts = append(parts, fmt.Sprintf("events %v", evs))
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, "; ")
}
