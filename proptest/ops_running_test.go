package proptest

import (
	"fmt"
	"strings"
	"time"

	"github.com/worklog/worklog/work"
)

// The ops of part 2 of the API (work-api-2.md): Extend, Release, ClaimKinds, Session.Tasks
// and SettleAndClaim. Deliveries are named as for FinishOp: (handle, attempt), T -1 for an
// unknown task id, Forged for a made-up token.

// delivery looks up the delivery (h, attempt) the system recorded, maybe with a forged token;
// h -1 is a delivery of an unknown task id.
func (s *system) delivery(h int, attempt uint32, forged bool) (work.TaskDelivery, string) {
	if h < 0 {
		return work.NewTaskDelivery(work.Task{ID: unknownTaskID}, 1, at(0), forgedToken), ""
	}
	d, ok := s.tds[dkey{h, attempt}]
	if !ok {
		return d, fmt.Sprintf("no delivery %s#%d was recorded", taskName(h), attempt)
	}
	if forged {
		d = work.NewTaskDelivery(d.Task, d.Attempt, d.LeaseExpiresAt, forgedToken)
	}
	return d, ""
}

func deliveryName(h int, attempt uint32, forged bool) string {
	if h < 0 {
		return taskName(h)
	}
	f := ""
	if forged {
		f = " [forged token]"
	}
	return fmt.Sprintf("%s#%d%s", taskName(h), attempt, f)
}

func validDelivery(m *model, h int, attempt uint32) bool {
	return h < 0 || h < len(m.tasks) && attempt >= 1 && attempt <= m.tasks[h].attempts
}

// checkRefusal checks a refused call on a delivery: not found, or stale; a stale call
// changes nothing (the log and every task are checked after the step).
func checkRefusal(r *result, e expect, what, name string) []string {
	switch e.err {
	case errNotFound:
		label := "model"
		if e.task >= 0 {
			label = "prune" // a delivery of a pruned task: the task is unknown now
		}
		return checkErr(r, errNotFound, label, e)
	case errStale:
		if r.err == nil {
			return []string{fmt.Sprintf("[fencing] stale delivery %s (%s) could %s", name, e.why, what)}
		}
		return checkErr(r, errStale, "fencing", e)
	}
	return nil
}

// --- extend --------------------------------------------------------------------------------------

// ExtendOp extends the lease of delivery T#Attempt to now+Lease (a heartbeat).
type ExtendOp struct {
	T       int
	Attempt uint32
	Lease   time.Duration
	Forged  bool
}

func (o ExtendOp) String() string {
	return fmt.Sprintf("extend %s lease=%v", deliveryName(o.T, o.Attempt, o.Forged), o.Lease)
}

func (o ExtendOp) valid(m *model) bool { return o.Lease > 0 && validDelivery(m, o.T, o.Attempt) }
func (o ExtendOp) apply(m *model)      { m.extend(o.T, o.Attempt, int64(o.Lease), o.Forged) }

func (o ExtendOp) exec(s *system, r *result) {
	d, p := s.delivery(o.T, o.Attempt, o.Forged)
	if p != "" {
		r.problem = p
		return
	}
	r.id, r.token = d.Task.ID, d.LeaseToken()
	got, err := s.q().ExtendAt(s.ctx, d, o.Lease, s.at())
	r.err = err
	if err == nil {
		r.tds = []work.TaskDelivery{got}
	} else if got.Task.ID != "" || got.LeaseToken() != "" {
		r.problem = fmt.Sprintf("ExtendAt failed (%v) but returned a delivery of %s", err, s.nameTask(got.Task.ID))
	}
}

func (o ExtendOp) check(m *model, r *result) []string {
	e := m.exp
	name := deliveryName(o.T, o.Attempt, o.Forged)
	if e.err != errNone {
		return checkRefusal(r, e, "extend its lease", name)
	}
	if r.err != nil {
		return []string{fmt.Sprintf("[model] the current delivery %s could not extend its lease: %v", name, r.err)}
	}
	s, d := r.sys, r.tds[0]
	var fails []string
	if d.Task.ID != r.id || d.Attempt != o.Attempt || d.LeaseToken() != r.token {
		fails = append(fails, fmt.Sprintf("[model] extending %s returned %s#%d, not the same delivery (same token)", name, s.nameTask(d.Task.ID), d.Attempt))
	}
	if want := at(e.lease); !d.LeaseExpiresAt.Equal(want) {
		fails = append(fails, fmt.Sprintf("[model] extending %s: lease expires %s, want exactly now+lease %s", name, showT(d.LeaseExpiresAt), showTime(e.lease)))
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		if strings.Contains(fmt.Sprintf(verb, d), r.token) {
			fails = append(fails, fmt.Sprintf("[redaction] fmt %s of an extended delivery shows its lease token", verb))
		}
	}
	fails = append(fails, compareTask(m, s, o.T, d.Task, "extended")...)
	// The lease that fences redelivery is now the new one, earlier or later.
	s.noteTaskLease(o.T, d)
	s.tds[dkey{o.T, o.Attempt}] = d
	return fails
}

// --- release -------------------------------------------------------------------------------------

// ReleaseOp gives delivery T#Attempt back, due again at RunAt (absolute model time) when
// HasRunAt and it is after now, else at once.
type ReleaseOp struct {
	T        int
	Attempt  uint32
	HasRunAt bool
	RunAt    int64
	Forged   bool
}

func (o ReleaseOp) String() string {
	run := ""
	if o.HasRunAt {
		run = " runAt=" + showTime(o.RunAt)
	}
	return fmt.Sprintf("release %s%s", deliveryName(o.T, o.Attempt, o.Forged), run)
}

func (o ReleaseOp) valid(m *model) bool { return validDelivery(m, o.T, o.Attempt) }
func (o ReleaseOp) apply(m *model)      { m.release(o.T, o.Attempt, o.HasRunAt, o.RunAt, o.Forged) }

func (o ReleaseOp) request() work.ReleaseRequest {
	r := work.ReleaseRequest{Reason: "released by the property test"}
	if o.HasRunAt {
		r.RunAt = at(o.RunAt)
	}
	return r
}

func (o ReleaseOp) exec(s *system, r *result) {
	d, p := s.delivery(o.T, o.Attempt, o.Forged)
	if p != "" {
		r.problem = p
		return
	}
	r.id, r.token = d.Task.ID, d.LeaseToken()
	r.task, r.err = s.q().ReleaseAt(s.ctx, d, o.request(), s.at())
}

func (o ReleaseOp) check(m *model, r *result) []string {
	e := m.exp
	name := deliveryName(o.T, o.Attempt, o.Forged)
	if e.err != errNone {
		return checkRefusal(r, e, "release the task", name)
	}
	if r.err != nil {
		return []string{fmt.Sprintf("[model] the current delivery %s could not release the task: %v", name, r.err)}
	}
	// The lease is gone: the task may be claimed again at once.
	delete(r.sys.taskLease, o.T)
	return compareTask(m, r.sys, o.T, r.task, "released")
}

// --- claim by kind -------------------------------------------------------------------------------

// ClaimKindsOp claims due tasks of the kinds in Mask (bit k: claimKindNames[k]); Dup names
// the first of them twice.
type ClaimKindsOp struct {
	Mask  int
	Dup   bool
	Lease time.Duration
	Limit int
}

func (o ClaimKindsOp) kinds() []string {
	var ks []string
	for k, n := range claimKindNames {
		if o.Mask&(1<<k) != 0 {
			ks = append(ks, n)
		}
	}
	if o.Dup && len(ks) > 0 {
		ks = append(ks, ks[0])
	}
	return ks
}

func (o ClaimKindsOp) String() string {
	return fmt.Sprintf("claimKinds %v lease=%v limit=%d", o.kinds(), o.Lease, o.Limit)
}

func (o ClaimKindsOp) valid(*model) bool {
	return o.Mask > 0 && o.Mask < 1<<len(claimKindNames) && o.Lease > 0 && o.Limit > 0
}
func (o ClaimKindsOp) apply(m *model) { m.claimKinds(o.Mask, int64(o.Lease), o.Limit) }

func (o ClaimKindsOp) exec(s *system, r *result) {
	r.tds, r.err = s.q().ClaimKindsAt(s.ctx, o.kinds(), s.at(), o.Lease, o.Limit)
	if r.err == nil && r.tds == nil {
		r.tds = []work.TaskDelivery{}
	}
}

func (o ClaimKindsOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] claim by kind failed: %v", r.err)}
	}
	return append(checkKinds(r, o.kinds()), checkTaskClaims(m, r, o.Limit)...)
}

// checkKinds: a claim restricted to kinds delivered only tasks of those kinds.
func checkKinds(r *result, kinds []string) []string {
	var fails []string
	for _, d := range r.tds {
		if k := strings.Join(kinds, " "); !strings.Contains(" "+k+" ", " "+d.Task.Kind+" ") {
			fails = append(fails, fmt.Sprintf("[claim-kinds] a claim of kinds [%s] delivered %s of kind %s", k, r.sys.nameTask(d.Task.ID), d.Task.Kind))
		}
	}
	return fails
}

// --- a session's tasks ---------------------------------------------------------------------------

// TasksOp lists session S's tasks: states in States (bit per state; 0: all), kinds in Kinds
// (bit per kind; 0: all), after task After (-1: from the first, -2: an unknown id), at most
// Limit.
type TasksOp struct {
	S, States, Kinds, After, Limit int
}

func (o TasksOp) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tasks of %s", sessionNames[o.S])
	if o.States != 0 {
		var st []string
		for i := mPending; i <= mCanceled; i++ {
			if o.States&(1<<i) != 0 {
				st = append(st, i.String())
			}
		}
		fmt.Fprintf(&b, " states=%v", st)
	}
	if o.Kinds != 0 {
		fmt.Fprintf(&b, " kinds=%v", o.filter().Kinds)
	}
	switch {
	case o.After == -2:
		b.WriteString(" after=<unknown task>")
	case o.After >= 0:
		fmt.Fprintf(&b, " after=%s", taskName(o.After))
	}
	fmt.Fprintf(&b, " limit=%d", o.Limit)
	return b.String()
}

func (o TasksOp) valid(m *model) bool {
	return o.S < m.nSess && o.After >= -2 && o.After < len(m.tasks) && o.Limit > 0 &&
		o.States >= 0 && o.States < 1<<5 && o.Kinds >= 0 && o.Kinds < 1<<len(claimKindNames)
}

func (o TasksOp) apply(m *model) { m.list(o.S, o.States, o.Kinds, o.After, o.Limit) }

func (o TasksOp) filter() work.TaskFilter {
	f := work.TaskFilter{Limit: o.Limit}
	for i := mPending; i <= mCanceled; i++ {
		if o.States&(1<<i) != 0 {
			f.States = append(f.States, taskState(i))
		}
	}
	for k, n := range claimKindNames {
		if o.Kinds&(1<<k) != 0 {
			f.Kinds = append(f.Kinds, n)
		}
	}
	return f
}

func (o TasksOp) exec(s *system, r *result) {
	f := o.filter()
	switch {
	case o.After == -2:
		f.After = unknownTaskID
	case o.After >= 0:
		f.After = s.taskID(o.After)
	}
	r.id = f.After
	r.list, r.err = s.q().Session(sessionNames[o.S]).Tasks(s.ctx, f)
	if r.err == nil && r.list == nil {
		r.list = []work.Task{}
	}
}

func (o TasksOp) check(m *model, r *result) []string {
	e := m.exp
	if e.err == errNotFound {
		label := "isolation"
		if o.After >= 0 && m.tasks[o.After].pruned {
			label = "prune"
		}
		if r.err == nil {
			return []string{fmt.Sprintf("[%s] listing after %s, not a task of %s (or pruned), returned %d tasks", label, r.sys.nameTask(r.id), sessionNames[o.S], len(r.list))}
		}
		return checkErr(r, errNotFound, label, e)
	}
	if r.err != nil {
		return []string{fmt.Sprintf("[model] listing failed: %v", r.err)}
	}
	s := r.sys
	var got, want []string
	for _, t := range r.list {
		got = append(got, s.nameTask(t.ID))
	}
	for _, h := range e.listed {
		want = append(want, taskName(h))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		label := "list"
		for _, t := range r.list {
			if h, ok := s.taskOf[t.ID]; ok && m.tasks[h].sess != o.S {
				label = "isolation"
			}
		}
		return []string{fmt.Sprintf("[%s] listed %v, want %v: the session's tasks in submission order, filtered, after the cursor, at most the limit", label, got, want)}
	}
	var fails []string
	for i, t := range r.list {
		fails = append(fails, compareTask(m, s, e.listed[i], t, "listed")...)
	}
	return fails
}

// --- settle and claim ----------------------------------------------------------------------------

// SettleAndClaimOp settles each of Settles (a finish or a release of a delivery), then
// claims up to Limit due tasks of the kinds in Mask (0: all kinds), in one step.
type SettleAndClaimOp struct {
	Settles []settleSpec
	Mask    int
	Lease   time.Duration
	Limit   int
}

func (o SettleAndClaimOp) String() string {
	var parts []string
	for _, st := range o.Settles {
		if st.Release {
			run := ""
			if st.HasRun {
				run = " runAt=" + showTime(st.RunAt)
			}
			parts = append(parts, fmt.Sprintf("release %s%s", deliveryName(st.T, st.Attempt, st.Forged), run))
		} else {
			parts = append(parts, fmt.Sprintf("finish %s %s", deliveryName(st.T, st.Attempt, st.Forged), showOutcome(st.Outcome)))
		}
	}
	kinds := "all"
	if o.Mask != 0 {
		kinds = fmt.Sprint(ClaimKindsOp{Mask: o.Mask}.kinds())
	}
	return fmt.Sprintf("settleAndClaim [%s] kinds=%s lease=%v limit=%d", strings.Join(parts, "; "), kinds, o.Lease, o.Limit)
}

func (o SettleAndClaimOp) valid(m *model) bool {
	for _, st := range o.Settles {
		if !validDelivery(m, st.T, st.Attempt) {
			return false
		}
	}
	return o.Mask >= 0 && o.Mask < 1<<len(claimKindNames) && o.Limit >= 0 && (o.Limit == 0 || o.Lease > 0)
}

func (o SettleAndClaimOp) apply(m *model) {
	m.settleAndClaim(o.Settles, o.Mask, int64(o.Lease), o.Limit)
}

func (o SettleAndClaimOp) exec(s *system, r *result) {
	settles := make([]work.Settle, len(o.Settles))
	for i, st := range o.Settles {
		d, p := s.delivery(st.T, st.Attempt, st.Forged)
		if p != "" {
			r.problem = p
			return
		}
		settles[i].Delivery = d
		if st.Release {
			req := ReleaseOp{HasRunAt: st.HasRun, RunAt: st.RunAt}.request()
			settles[i].Release = &req
		} else {
			out := outcomeValue(st.Outcome)
			settles[i].Outcome = &out
		}
		r.ids = append(r.ids, d.Task.ID)
		r.tokens = append(r.tokens, d.LeaseToken())
	}
	var kinds []string
	if o.Mask != 0 {
		kinds = ClaimKindsOp{Mask: o.Mask}.kinds()
	}
	r.results, r.tds, r.err = s.q().SettleAndClaimAt(s.ctx, settles, kinds, s.at(), o.Lease, o.Limit)
	if r.err == nil {
		if r.tds == nil {
			r.tds = []work.TaskDelivery{}
		}
		if r.results == nil {
			r.results = []work.SettleResult{}
		}
	}
}

func (o SettleAndClaimOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] settle and claim failed: %v", r.err)}
	}
	e := m.exp
	s := r.sys
	if len(r.results) != len(o.Settles) {
		return []string{fmt.Sprintf("[model] settle and claim returned %d results for %d settles", len(r.results), len(o.Settles))}
	}
	var fails []string
	for i, st := range o.Settles {
		sub, res := e.settles[i], r.results[i]
		one := &result{sys: s, err: res.Err, task: res.Task, id: r.ids[i], token: r.tokens[i]}
		name := fmt.Sprintf("settle %d (%s)", i+1, deliveryName(st.T, st.Attempt, st.Forged))
		if sub.err != errNone {
			if sub.err == errTransition && res.Err == nil {
				fails = append(fails, fmt.Sprintf("[fencing] %s, already settled, was settled again with a different outcome", name))
				continue
			}
			for _, f := range checkRefusalOrTransition(one, sub, name) {
				fails = append(fails, f+" in "+name)
			}
			if res.Err != nil && res.Task.ID != "" {
				fails = append(fails, fmt.Sprintf("[model] %s failed but its result has task %s", name, s.nameTask(res.Task.ID)))
			}
			continue
		}
		if res.Err != nil {
			fails = append(fails, fmt.Sprintf("[model] %s failed: %v", name, res.Err))
			continue
		}
		// The task as the settle left it; a released task due now may already be claimed
		// again by the same step, which the result may show instead.
		f := compareTaskRec(s, st.T, e.settled[i], res.Task, "settled")
		if len(f) > 0 && st.Release {
			if g := compareTask(m, s, st.T, res.Task, "settled"); len(g) == 0 {
				f = nil
			}
		}
		fails = append(fails, f...)
		if st.Release {
			delete(s.taskLease, st.T)
		}
	}
	if o.Mask != 0 {
		fails = append(fails, checkKinds(r, ClaimKindsOp{Mask: o.Mask}.kinds())...)
	}
	return append(fails, checkTaskClaims(m, r, o.Limit)...)
}

// checkRefusalOrTransition is checkRefusal, plus a finish repeated with another outcome.
func checkRefusalOrTransition(r *result, e expect, name string) []string {
	if e.err == errTransition {
		return checkErr(r, errTransition, "fencing", e)
	}
	return checkRefusal(r, e, "settle", name)
}
