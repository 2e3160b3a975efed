package proptest

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// This file is the reference model: a deliberately small, independent re-statement of the
// rules of ../../shared/spec/work-api.md and the seed, in terms of pool indexes and integer
// times. It does not import package work and shares no code with it: JSON equality is a
// lookup in a hand-written class table, claim order is a sort of the model's own records.

// --- pools -------------------------------------------------------------------------------

// Small pools make collisions (same key, same session, same payload) frequent.
var (
	sessionNames = []string{"s1", "s2", "s3"}
	kindNames    = []string{"thumb", "index"}
	keyNames     = []string{"k1", "k2", "k3"}
)

// jsonSpelling is one way to write a JSON value. Spellings with the same class are the same
// JSON value (object key order and whitespace do not matter); different classes differ (1 and
// 1.0 differ by the spec: numbers compare by their literal text).
type jsonSpelling struct {
	text  string // "" with isNil: a nil json.RawMessage, stored and returned as null
	isNil bool
	class int
}

var jsonPool = []jsonSpelling{
	{text: `{"a":1,"b":2}`, class: 0},
	{text: `{ "b": 2, "a": 1 }`, class: 0},
	{text: `1`, class: 1},
	{text: `1.0`, class: 2},
	{isNil: true, class: 3},
	{text: `null`, class: 3},
}

// raw is what the test passes to the API.
func raw(i int) json.RawMessage {
	if jsonPool[i].isNil {
		return nil
	}
	return json.RawMessage(jsonPool[i].text)
}

// stored is what the API must return for a value first given as spelling i: the bytes as
// given, null for nil.
func stored(i int) string {
	if jsonPool[i].isNil {
		return "null"
	}
	return jsonPool[i].text
}

func sameJSONClass(a, b int) bool { return jsonPool[a].class == jsonPool[b].class }

func showJSON(i int) string {
	if jsonPool[i].isNil {
		return "nil"
	}
	return jsonPool[i].text
}

// mState is the model's task state.
type mState uint8

const (
	mPending mState = iota
	mRunning
	mSucceeded
	mFailed
	mCanceled
)

func (s mState) terminal() bool { return s >= mSucceeded }

func (s mState) String() string {
	return [...]string{"pending", "running", "succeeded", "failed", "canceled"}[s]
}

// outcomeSpec is one outcome a worker can report.
type outcomeSpec struct {
	state   mState
	summary string
	output  int // jsonPool index for a success, -1 otherwise
	errMsg  string
}

var outcomePool = []outcomeSpec{
	{state: mSucceeded, output: 0},
	{state: mSucceeded, output: 1}, // same value as 0, other spelling
	{state: mSucceeded, output: 2},
	{state: mSucceeded, output: 3},
	{state: mSucceeded, output: 4},
	{state: mSucceeded, summary: "done", output: 2},
	{state: mFailed, output: -1, errMsg: "boom"},
	{state: mFailed, output: -1, errMsg: "oops"},
	{state: mCanceled, output: -1},
}

// cancelOutcome is the outcome of a task canceled while pending.
const cancelOutcome = 8

func sameOutcome(a, b int) bool {
	x, y := outcomePool[a], outcomePool[b]
	return x.state == y.state && x.summary == y.summary && x.errMsg == y.errMsg &&
		(x.state != mSucceeded || sameJSONClass(x.output, y.output))
}

func showOutcome(i int) string {
	o := outcomePool[i]
	switch o.state {
	case mSucceeded:
		if o.summary != "" {
			return fmt.Sprintf("success(summary=%q, %s)", o.summary, showJSON(o.output))
		}
		return fmt.Sprintf("success(%s)", showJSON(o.output))
	case mFailed:
		return fmt.Sprintf("failure(%q)", o.errMsg)
	}
	return "cancellation"
}

// --- time ----------------------------------------------------------------------------------

// t0 is the model's time origin; model times are nanoseconds after it.
var t0 = time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)

func at(off int64) time.Time { return t0.Add(time.Duration(off)) }

func showTime(off int64) string {
	if off < 0 {
		return "-" + time.Duration(-off).String()
	}
	return "+" + time.Duration(off).String()
}

// --- records ---------------------------------------------------------------------------------

type mTask struct {
	sess, kind, input, key int // key -1: no idempotency key
	hasRunAt               bool
	runAt                  int64
	wake                   bool // WakeOnCompletion
	pri                    int  // Priority: claim order among due tasks, higher first
	created, scheduled     int64

	state     mState
	cancelReq bool
	cancelAt  int64
	attempts  uint32 // claims so far; deliveries (handle, 1..attempts) exist
	leaseExp  int64  // while running
	finished  int64
	outcome   int    // outcomePool index once terminal, else -1
	settledBy uint32 // the attempt whose delivery settled it; 0: none (or canceled pending)
	cwake     int    // completion wake handle, -1 if none
	extended  bool   // the current attempt's lease was extended (for coverage only)
	pruned    bool   // removed by a Prune: reads as absent, its key is free
	atRetry   uint32 // attempts when last retried (Task.AttemptsAtRetry)
	retries   int    // how often it was retried
	inbox     bool   // taken in from the inbox (SubmitTxOp) at the queue's clock: created unknown
	isTick    bool   // submitted by a claim for a schedule's tick (ops_schedules_test.go)
	sched     int    // isTick: the schedule's name (scheduleNames)
	tick      int64  // isTick: the tick
}

// eligible reports whether a claim at now may deliver the task, and since when it is eligible.
func (t *mTask) eligible(now int64) (int64, bool) {
	switch t.state {
	case mPending:
		return t.scheduled, t.scheduled <= now
	case mRunning:
		return t.leaseExp, t.leaseExp <= now
	}
	return 0, false
}

type mWake struct {
	sess     int
	direct   bool
	key      int // direct only; -1 none
	payload  int // direct only
	task     int // completion only: task handle
	outcome  int // completion only
	created  int64
	attempts uint32
	claimed  bool // held by a claim (live or expired) that was not acknowledged
	leaseExp int64
	acked    bool
	ackedBy  uint32
	ackedAt  int64 // when the acknowledgment was recorded
	pruned   bool  // removed by a Prune (a completion wake goes with its task)
	detached bool  // a completion wake whose task was retried since: pruned on its own, once acknowledged
	early    bool  // detached while unacknowledged (retried before its acknowledgment)
}

func (w *mWake) available(now int64) (int64, bool) {
	switch {
	case w.acked:
		return 0, false
	case w.claimed:
		return w.leaseExp, w.leaseExp <= now
	}
	return w.created, w.created <= now
}

// --- expectations ------------------------------------------------------------------------------

// errKind is the model's name for the error kinds of the API.
type errKind uint8

const (
	errNone errKind = iota
	errInvalid
	errNotFound
	errConflict
	errStale
	errTransition
)

func (k errKind) String() string {
	return [...]string{"ok", "ErrInvalidRequest", "ErrTaskNotFound", "ErrIdempotencyConflict",
		"ErrStaleDelivery", "ErrInvalidTransition"}[k]
}

type claimed struct {
	h       int
	attempt uint32
	since   int64 // when it became eligible
	expired bool  // redelivery after lease expiry
}

// expect is what the model predicts for the command it just applied; PostCondition reads it
// from the next state.
type expect struct {
	err    errKind
	field  string // errInvalid; errConflict: the first differing field of the intent
	key    string // errConflict
	task   int    // handle the call returns or names; -1 unknown id
	wake   int
	newRec bool // submit/wake created a new record
	found  bool // read
	claims []claimed
	// newCW lists completion wakes this command records, in order.
	newCW []int
	// newTicks lists the tasks of schedule ticks this command submitted, in order.
	newTicks []int
	// events is the number of state-changing events the command appends to the log.
	events int
	// audit: a rejected stale settlement or acknowledgment, which may append one audit event.
	audit bool
	// audits: how many audit events a SettleAndClaim may append (one per stale settle).
	audits int
	// lease is the new lease expiry of an extension.
	lease int64
	// listed is what Session.Tasks must return, in order (task handles).
	listed []int
	// settles holds, for SettleAndClaim, what each settle must return, with the task as
	// that settle left it (settled[i]; a released task may also be claimed in the same step).
	settles []expect
	settled []mTask
	// prunedT and prunedW are the task and wake handles a Prune removes (completion wakes
	// included, with their tasks), in handle order.
	prunedT, prunedW []int
	// why explains a rejection in property terms, for messages.
	why string
}

// --- the model -----------------------------------------------------------------------------------

type model struct {
	nSess       int
	restartable bool // the backend can Reopen and Crash
	inbox       bool // the backend takes SubmitTx submissions (SubmitTxOp)
	now         int64
	tasks       []mTask
	wakes       []mWake
	schedules   []mSchedule // ops_schedules_test.go
	exp         expect
	pols        map[int]*mPolicy // kind policies (ops_kind_policies_test.go)
}

func newModel(nSess int, restartable bool) *model {
	return &model{nSess: nSess, restartable: restartable}
}

func (m *model) clone() *model {
	c := *m
	c.tasks = append([]mTask(nil), m.tasks...)
	c.wakes = append([]mWake(nil), m.wakes...)
	c.schedules = append([]mSchedule(nil), m.schedules...)
	c.exp = expect{task: -1, wake: -1}
	if m.pols != nil {
		c.pols = make(map[int]*mPolicy, len(m.pols))
		for k, p := range m.pols {
			cp := *p
			c.pols[k] = &cp
		}
	}
	return &c
}

func (m *model) String() string {
	return fmt.Sprintf("model{sessions=%d, restartable=%v}", m.nSess, m.restartable)
}

func (m *model) taskByKey(sess, key int) int {
	for h, t := range m.tasks {
		if t.sess == sess && t.key == key && key >= 0 && !t.pruned {
			return h
		}
	}
	return -1
}

func (m *model) wakeByKey(sess, key int) int {
	for h, w := range m.wakes {
		if w.direct && w.sess == sess && w.key == key && key >= 0 && !w.pruned {
			return h
		}
	}
	return -1
}

// complete records the single completion wake of a task that just became terminal.
func (m *model) complete(h int) {
	t := &m.tasks[h]
	if !t.wake {
		return
	}
	w := len(m.wakes)
	m.wakes = append(m.wakes, mWake{sess: t.sess, key: -1, task: h, outcome: t.outcome, created: m.now})
	t.cwake = w
	m.exp.newCW = append(m.exp.newCW, w)
	m.exp.events++
}

// differs is the first field of the intent in which a request differs from t's, in the
// order the conflict names it; "" for the same intent.
func (t *mTask) differs(kind, input int, hasRunAt bool, runAt int64, wake bool, pri int) string {
	switch {
	case t.kind != kind:
		return "kind"
	case t.hasRunAt != hasRunAt || (hasRunAt && t.runAt != runAt):
		return "run_at"
	case t.wake != wake:
		return "wake"
	case t.pri != pri:
		return "priority"
	case !sameJSONClass(t.input, input):
		return "input"
	}
	return ""
}

func (m *model) submit(sess, kind, input, key int, hasRunAt bool, runAt int64, wake bool, pri int) {
	if h := m.taskByKey(sess, key); h >= 0 {
		if field := m.tasks[h].differs(kind, input, hasRunAt, runAt, wake, pri); field != "" {
			m.exp.err, m.exp.key, m.exp.field, m.exp.task = errConflict, keyNames[key], field, h
		} else {
			m.exp.task = h
		}
		return
	}
	sched := m.now
	if hasRunAt {
		sched = runAt
	}
	m.exp.task, m.exp.newRec, m.exp.events = len(m.tasks), true, 1
	m.tasks = append(m.tasks, mTask{
		sess: sess, kind: kind, input: input, key: key, hasRunAt: hasRunAt, runAt: runAt,
		wake: wake, created: m.now, scheduled: sched, outcome: -1, cwake: -1, pri: pri,
	})
}

func (m *model) read(sess, h int) {
	m.exp.task = h
	m.exp.found = h >= 0 && m.tasks[h].sess == sess && !m.tasks[h].pruned
}

func (m *model) cancel(sess, h int) {
	m.exp.task = h
	if h < 0 || m.tasks[h].sess != sess || m.tasks[h].pruned {
		m.exp.err = errNotFound
		return
	}
	t := &m.tasks[h]
	switch t.state {
	case mPending:
		t.cancelReq, t.cancelAt = true, m.now
		t.state, t.finished, t.outcome = mCanceled, m.now, cancelOutcome
		m.exp.events = 1
		m.complete(h)
	case mRunning:
		if !t.cancelReq {
			t.cancelReq, t.cancelAt = true, m.now
			m.exp.events = 1
		}
	}
}

// eligibleTasks lists the tasks a claim at now may deliver, in claim order: higher priority
// first, then by the time they became eligible, ties by submission order.
func (m *model) eligibleTasks() []claimed {
	var out []claimed
	for h := range m.tasks {
		if since, ok := m.tasks[h].eligible(m.now); ok {
			out = append(out, claimed{h: h, since: since, expired: m.tasks[h].state == mRunning})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if pi, pj := m.tasks[out[i].h].pri, m.tasks[out[j].h].pri; pi != pj {
			return pi > pj
		}
		return out[i].since < out[j].since
	})
	return out
}

// claim is ClaimDueAt: the due ticks' tasks first (submitTicks), then the claim.
func (m *model) claim(lease int64, limit int) {
	m.submitTicks()
	m.claimList(m.eligibleTasks(), lease, limit)
}

// claimList claims the first limit of the eligible tasks el, in order.
func (m *model) claimList(el []claimed, lease int64, limit int) {
	el = m.limitClaims(el)
	if len(el) > limit {
		el = el[:limit]
	}
	for i := range el {
		t := &m.tasks[el[i].h]
		t.state, t.extended = mRunning, false
		t.attempts++
		t.leaseExp = m.now + lease
		el[i].attempt = t.attempts
		m.tookToken(t.kind)
	}
	m.exp.claims = el
	m.exp.events += len(el) // after the ticks' (submitTicks)
}

func (m *model) finish(h int, attempt uint32, outcome int, forged bool) {
	m.exp.task = h
	if h < 0 || m.tasks[h].pruned {
		m.exp.err = errNotFound
		if h >= 0 {
			m.exp.why = "the task was pruned"
		}
		return
	}
	t := &m.tasks[h]
	switch {
	case !forged && t.settledBy == attempt:
		if !sameOutcome(t.outcome, outcome) {
			m.exp.err, m.exp.why = errTransition, "repeated with a different outcome"
		}
	case !forged && t.state == mRunning && t.attempts == attempt:
		t.state, t.finished, t.outcome, t.settledBy = outcomePool[outcome].state, m.now, outcome, attempt
		m.exp.events = 1
		m.complete(h)
	default:
		m.exp.err, m.exp.audit = errStale, true
		switch {
		case forged:
			m.exp.why = "forged token"
		case t.state.terminal():
			m.exp.why = "the task is already " + t.state.String()
		case t.state == mPending:
			m.exp.why = fmt.Sprintf("attempt %d released the task", t.attempts)
		default:
			m.exp.why = fmt.Sprintf("superseded by attempt %d", t.attempts)
		}
	}
}

// owns reports whether delivery (h, attempt) holds the task's claim: running, the current
// attempt, the real token. Otherwise it sets the stale expectation, with why.
func (m *model) owns(h int, attempt uint32, forged bool) bool {
	t := &m.tasks[h]
	if !forged && t.state == mRunning && t.attempts == attempt {
		return true
	}
	m.exp.err, m.exp.audit = errStale, true
	switch {
	case forged:
		m.exp.why = "forged token"
	case t.state.terminal():
		m.exp.why = "the task is already " + t.state.String()
	case t.state == mPending:
		m.exp.why = fmt.Sprintf("attempt %d released the task", t.attempts)
	default:
		m.exp.why = fmt.Sprintf("superseded by attempt %d", t.attempts)
	}
	return false
}

// extend is ExtendAt (work-api-2.md, lease extension): the owner's lease expires at exactly
// now+lease, earlier or later than before; expiry itself is not checked.
func (m *model) extend(h int, attempt uint32, lease int64, forged bool) {
	m.exp.task = h
	if h < 0 || m.tasks[h].pruned {
		m.exp.err = errNotFound
		if h >= 0 {
			m.exp.why = "the task was pruned"
		}
		return
	}
	if !m.owns(h, attempt, forged) {
		return
	}
	t := &m.tasks[h]
	t.leaseExp, t.extended = m.now+lease, true
	m.exp.lease, m.exp.events = t.leaseExp, 1
}

// release is ReleaseAt: the owner gives the task back, pending at runAt when that is after
// now, else at now, with its attempts; a task whose cancel was requested is canceled instead,
// as a cancel of pending work is (with its completion wake).
func (m *model) release(h int, attempt uint32, hasRunAt bool, runAt int64, forged bool) {
	m.exp.task = h
	if h < 0 || m.tasks[h].pruned {
		m.exp.err = errNotFound
		if h >= 0 {
			m.exp.why = "the task was pruned"
		}
		return
	}
	if !m.owns(h, attempt, forged) {
		return
	}
	t := &m.tasks[h]
	m.exp.events = 1
	if t.cancelReq {
		t.state, t.finished, t.outcome = mCanceled, m.now, cancelOutcome
		m.complete(h)
		return
	}
	t.state, t.scheduled = mPending, m.now
	if hasRunAt && runAt > m.now {
		t.scheduled = runAt
	}
}

// kindMask has bit k set for kind k of claimKindNames; kind 2 is never submitted.
var claimKindNames = []string{kindNames[0], kindNames[1], "video"}

// claimKinds is ClaimKindsAt: ClaimDue restricted to the kinds in mask, in the same order.
func (m *model) claimKinds(mask int, lease int64, limit int) {
	m.submitTicks()
	var el []claimed
	for _, c := range m.eligibleTasks() {
		if mask&(1<<m.tasks[c.h].kind) != 0 {
			el = append(el, c)
		}
	}
	m.claimList(el, lease, limit)
}

// list is Session.Tasks: the session's tasks in submission order (handle order), after the
// task after (-1: from the first; -2: an unknown id), of the states and kinds in the masks
// (0: all), at most limit.
func (m *model) list(sess, stateMask, kindMask, after, limit int) {
	start := 0
	switch {
	case after == -2:
		m.exp.err, m.exp.task = errNotFound, -1
		return
	case after >= 0:
		if m.tasks[after].sess != sess || m.tasks[after].pruned {
			m.exp.err, m.exp.task = errNotFound, after
			return
		}
		start = after + 1
	}
	m.exp.listed = []int{}
	for h := start; h < len(m.tasks) && len(m.exp.listed) < limit; h++ {
		t := m.tasks[h]
		if t.sess == sess && !t.pruned && (stateMask == 0 || stateMask&(1<<t.state) != 0) && (kindMask == 0 || kindMask&(1<<t.kind) != 0) {
			m.exp.listed = append(m.exp.listed, h)
		}
	}
}

// settleSpec is one settle of a SettleAndClaim.
type settleSpec struct {
	T       int
	Attempt uint32
	Forged  bool
	Release bool  // else Finish with Outcome
	Outcome int   // outcomePool index
	HasRun  bool  // Release: RunAt set
	RunAt   int64 // Release: absolute model time
}

// settleAndClaim is SettleAndClaimAt: each settle as FinishAt or ReleaseAt, one after the
// other, each with its own result, then a claim (of the kinds in mask, or of all kinds when
// mask is 0) with limit (0: none).
func (m *model) settleAndClaim(settles []settleSpec, mask int, lease int64, limit int) {
	var subs []expect
	var after []mTask
	var cws []int
	events, audits := 0, 0
	for _, st := range settles {
		m.exp = expect{task: -1, wake: -1}
		if st.Release {
			m.release(st.T, st.Attempt, st.HasRun, st.RunAt, st.Forged)
		} else {
			m.finish(st.T, st.Attempt, st.Outcome, st.Forged)
		}
		subs = append(subs, m.exp)
		var rec mTask
		if st.T >= 0 {
			rec = m.tasks[st.T]
		}
		after = append(after, rec)
		events += m.exp.events
		cws = append(cws, m.exp.newCW...)
		if m.exp.audit {
			audits++
		}
	}
	m.exp = expect{task: -1, wake: -1}
	switch {
	case limit == 0:
		m.exp.claims = []claimed{}
	case mask == 0:
		m.claim(lease, limit)
	default:
		m.claimKinds(mask, lease, limit)
	}
	m.exp.settles, m.exp.settled = subs, after
	m.exp.events += events
	m.exp.newCW = cws
	m.exp.audits = audits
}

func (m *model) wake(sess, key, payload int) {
	if w := m.wakeByKey(sess, key); w >= 0 {
		m.exp.wake = w
		if !sameJSONClass(m.wakes[w].payload, payload) {
			m.exp.err, m.exp.key, m.exp.field = errConflict, keyNames[key], "payload"
		}
		return
	}
	m.exp.wake, m.exp.newRec, m.exp.events = len(m.wakes), true, 1
	m.wakes = append(m.wakes, mWake{sess: sess, direct: true, key: key, payload: payload, task: -1, outcome: -1, created: m.now})
}

func (m *model) availableWakes() []claimed {
	var out []claimed
	for h := range m.wakes {
		if since, ok := m.wakes[h].available(m.now); ok {
			out = append(out, claimed{h: h, since: since, expired: m.wakes[h].claimed})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].since < out[j].since })
	return out
}

func (m *model) claimWakes(lease int64, limit int) {
	el := m.availableWakes()
	if len(el) > limit {
		el = el[:limit]
	}
	for i := range el {
		w := &m.wakes[el[i].h]
		w.attempts++
		w.claimed, w.leaseExp = true, m.now+lease
		el[i].attempt = w.attempts
	}
	m.exp.claims = el
	m.exp.events += len(el) // after the ticks' (submitTicks)
}

func (m *model) ack(h int, attempt uint32, forged bool) {
	m.exp.wake = h
	if h < 0 {
		m.exp.err, m.exp.why = errStale, "unknown wake"
		return
	}
	if m.wakes[h].pruned {
		m.exp.err, m.exp.why = errStale, "the wake was pruned"
		return
	}
	w := &m.wakes[h]
	switch {
	case !forged && w.acked && w.ackedBy == attempt:
		// a repeated acknowledgment is fine and changes nothing
	case !forged && !w.acked && w.attempts == attempt:
		w.acked, w.ackedBy, w.ackedAt, w.claimed = true, attempt, m.now, false
		m.exp.events = 1
	default:
		m.exp.err, m.exp.audit = errStale, true
		switch {
		case forged:
			m.exp.why = "forged token"
		case w.acked:
			m.exp.why = fmt.Sprintf("already acknowledged by attempt %d", w.ackedBy)
		default:
			m.exp.why = fmt.Sprintf("superseded by attempt %d", w.attempts)
		}
	}
}

// prunable is the rule of work-api-2.md "Retention", restated: a terminal task whose
// FinishedAt is before before, together with its completion wake if it has one, and then
// only if that wake was acknowledged and the acknowledgment was recorded before before.
// (A task with WakeOnCompletion that is terminal always has its completion wake.)
// The task of a schedule's latest tick since it was set is held (docs/design.md §4.6): its
// task_submitted is what moved the schedule's cursor.
func (m *model) prunableTask(h int, before int64) bool {
	t := m.tasks[h]
	if t.pruned || !t.state.terminal() || t.finished >= before {
		return false
	}
	if t.isTick {
		if x := m.schedule(t.sess, t.sched); x != nil && x.latest == h {
			return false
		}
	}
	if m.earlierUnacked(h) >= 0 {
		return false
	}
	if !t.wake || t.cwake < 0 {
		return true
	}
	w := m.wakes[t.cwake]
	return w.acked && w.ackedAt < before
}

// earlierUnacked is a completion wake of an earlier run of task h (detached by a retry) that is
// not acknowledged yet, -1 if none: while there is one, the task is not prunable
// (work-api-4.md, "Retry, whatever the completion wake": retention never prunes a task while
// any of its wakes is unacknowledged).
func (m *model) earlierUnacked(h int) int {
	for i, w := range m.wakes {
		if !w.direct && w.task == h && w.detached && !w.acked {
			return i
		}
	}
	return -1
}

// prunableWake: a requested (direct) wake acknowledged before before. A completion wake is
// pruned on its own only once its task was retried and it is acknowledged: by any prune.
func (m *model) prunableWake(h int, before int64) bool {
	w := m.wakes[h]
	if w.detached { // the earlier wake of a retried task: acknowledged, prunable at once
		return !w.pruned && w.acked
	}
	return !w.pruned && w.direct && w.acked && w.ackedAt < before
}

// prune is Queue.Prune(before): every prunable subject goes; nothing else changes. A pruned
// task reads as absent, its deliveries are ErrTaskNotFound, a pruned wake's are
// ErrStaleDelivery, their keys are free. It appends no event.
func (m *model) prune(before int64) {
	m.exp.prunedT, m.exp.prunedW = []int{}, []int{}
	var ws []int
	for h := range m.tasks {
		if !m.prunableTask(h, before) {
			continue
		}
		m.exp.prunedT = append(m.exp.prunedT, h)
		if m.tasks[h].wake && m.tasks[h].cwake >= 0 {
			ws = append(ws, m.tasks[h].cwake)
		}
	}
	for h := range m.wakes {
		if m.prunableWake(h, before) {
			ws = append(ws, h)
		}
	}
	sort.Ints(ws)
	m.exp.prunedW = ws
	for _, h := range m.exp.prunedT {
		m.tasks[h].pruned = true
	}
	for _, h := range ws {
		m.wakes[h].pruned = true
	}
}

// describe renders the model's view of a task for messages.
func (m *model) describeTask(h int) string {
	t := m.tasks[h]
	var b strings.Builder
	fmt.Fprintf(&b, "T%d(%s %s", h, sessionNames[t.sess], t.state)
	switch t.state {
	case mPending:
		fmt.Fprintf(&b, ", due %s", showTime(t.scheduled))
	case mRunning:
		fmt.Fprintf(&b, ", attempt %d leased until %s", t.attempts, showTime(t.leaseExp))
	}
	b.WriteString(")")
	return b.String()
}
