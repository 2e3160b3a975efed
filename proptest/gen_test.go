package proptest

import (
	"math/rand"
	"time"
)

// genOp picks a random op that is valid in m. It draws only from r (gopter's seeded source),
// so a seed reproduces the same histories. The weights favour collisions: reused keys with
// the same and with a changed intent, deliveries that are current, stale or forged, clock
// steps that land exactly on and next to lease expiries and schedules.
func genOp(r *rand.Rand, m *model) op {
	type choice struct {
		w int
		f func() op
	}
	claimedTasks := m.claimedTasks()
	claimedWakes := m.claimedWakes()
	choices := []choice{
		{16, func() op { return genSubmit(r, m) }},
		{5, func() op { return genRead(r, m) }},
		{6, func() op { return genCancel(r, m) }},
		{12, func() op { return ClaimOp{Lease: genLease(r), Limit: genLimit(r)} }},
		{7, func() op { return genWake(r, m) }},
		{9, func() op { return ClaimWakesOp{Lease: genLease(r), Limit: genLimit(r)} }},
		{12, func() op { return genAdvance(r, m) }},
		{2, func() op { return InvalidOp{Case: r.Intn(len(invalidCases))} }},
	}
	if len(claimedTasks) > 0 {
		choices = append(choices, choice{16, func() op { return genFinish(r, m, claimedTasks) }})
	} else {
		choices = append(choices, choice{1, func() op { return FinishOp{T: -1, Outcome: r.Intn(len(outcomePool))} }})
	}
	if len(claimedWakes) > 0 {
		choices = append(choices, choice{9, func() op { return genAck(r, m, claimedWakes) }})
	} else {
		choices = append(choices, choice{1, func() op { return AckOp{W: -1} }})
	}
	// Part 2: heartbeats, releases, claims by kind, listings, settle-and-claim steps.
	choices = append(choices,
		choice{5, func() op { return genClaimKinds(r) }},
		choice{5, func() op {
			return ClaimSessionWakesOp{Mask: 1 + r.Intn(1<<len(sessionNames)-1), Dup: r.Intn(8) == 0, Lease: genLease(r), Limit: genLimit(r)}
		}},
		choice{4, func() op { return genTasks(r, m) }},
	)
	if len(claimedTasks) > 0 {
		choices = append(choices,
			choice{8, func() op { return genExtend(r, m, claimedTasks) }},
			choice{7, func() op { return genRelease(r, m, claimedTasks) }},
			choice{4, func() op { return genSettleAndClaim(r, m, claimedTasks) }},
		)
	} else {
		choices = append(choices,
			choice{1, func() op { return ExtendOp{T: -1, Lease: genLease(r)} }},
			choice{1, func() op { return ReleaseOp{T: -1} }},
			choice{1, func() op { return genSettleAndClaim(r, m, nil) }},
		)
	}
	// Part 3: an operator's retry of a finished task.
	choices = append(choices, choice{4, func() op { return genRetry(r, m) }})
	choices = append(choices, choice{4, func() op { return genSubmitMany(r, m) }})
	choices = append(choices, choice{2, func() op { return genSetSchedule(r, m) }}, choice{2, func() op { return genRemoveSchedule(r, m) }})
	if m.inbox {
		choices = append(choices, choice{6, func() op { return genSubmitTx(r, m) }})
	}
	choices = append(choices, choice{2, func() op { return genSetPolicy(r, m) }})
	// Retention: a prune, weighted up when it would remove something.
	if m.prunableNow() > 0 {
		choices = append(choices, choice{6, func() op { return genPrune(r, m) }})
	} else {
		choices = append(choices, choice{1, func() op { return genPrune(r, m) }})
	}
	if m.restartable {
		choices = append(choices, choice{1, func() op { return ReopenOp{} }}, choice{1, func() op { return CrashOp{} }})
	}
	total := 0
	for _, c := range choices {
		total += c.w
	}
	n := r.Intn(total)
	for _, c := range choices {
		if n < c.w {
			return c.f()
		}
		n -= c.w
	}
	panic("unreachable")
}

func (m *model) claimedTasks() []int {
	var out []int
	for h, t := range m.tasks {
		if t.attempts > 0 {
			out = append(out, h)
		}
	}
	return out
}

func (m *model) claimedWakes() []int {
	var out []int
	for h, w := range m.wakes {
		if w.attempts > 0 {
			out = append(out, h)
		}
	}
	return out
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.Intn(len(xs))] }

func genLease(r *rand.Rand) time.Duration {
	return pick(r, 500*time.Millisecond, time.Second, 2*time.Second, 3*time.Second)
}

func genLimit(r *rand.Rand) int { return pick(r, 1, 2, 3, 100, 100, 100) }

// sameClass returns a spelling of the same JSON value as i (maybe i itself).
func sameClass(r *rand.Rand, i int) int {
	var c []int
	for j := range jsonPool {
		if sameJSONClass(i, j) {
			c = append(c, j)
		}
	}
	return pick(r, c...)
}

// otherClass returns a spelling of a different JSON value.
func otherClass(r *rand.Rand, i int) int {
	var c []int
	for j := range jsonPool {
		if !sameJSONClass(i, j) {
			c = append(c, j)
		}
	}
	return pick(r, c...)
}

// genJSON favours the non-null spellings.
func genJSON(r *rand.Rand) int {
	if r.Intn(6) == 0 {
		return pick(r, 4, 5)
	}
	return r.Intn(4)
}

func genRunAt(r *rand.Rand, m *model) (bool, int64) {
	if r.Intn(5) < 3 {
		return false, 0
	}
	d := pick(r, -time.Second, 0, time.Nanosecond, 500*time.Millisecond, time.Second, 2*time.Second, 4*time.Second)
	return true, m.now + int64(d)
}

func genSubmit(r *rand.Rand, m *model) op {
	var keyed []int
	for h, t := range m.tasks {
		if t.key >= 0 {
			keyed = append(keyed, h)
		}
	}
	if len(keyed) > 0 && r.Intn(5) < 2 {
		t := m.tasks[pick(r, keyed...)]
		o := SubmitOp{S: t.sess, Kind: t.kind, Input: sameClass(r, t.input), Key: t.key,
			HasRunAt: t.hasRunAt, RunAt: t.runAt, Wake: t.wake, Pri: t.pri}
		if r.Intn(2) == 0 {
			return o // the same intent, maybe spelled differently
		}
		switch r.Intn(7) {
		case 0:
			o.Kind = 1 - o.Kind
		case 5:
			o.Pri++ // another priority: a conflict naming it
		case 1:
			o.Input = otherClass(r, o.Input)
		case 2:
			if o.HasRunAt {
				o.HasRunAt, o.RunAt = r.Intn(2) == 0, o.RunAt+int64(time.Nanosecond)
			} else {
				o.HasRunAt, o.RunAt = true, t.created // explicit time equal to the immediate one
			}
		case 3:
			o.Wake = !o.Wake
		default:
			o.S = (o.S + 1 + r.Intn(m.nSess-1)) % m.nSess // the same key in another session
		}
		return o
	}
	o := SubmitOp{S: r.Intn(m.nSess), Kind: r.Intn(len(kindNames)), Input: genJSON(r), Key: -1, Wake: r.Intn(2) == 0}
	if r.Intn(10) < 7 {
		o.Key = r.Intn(len(keyNames))
	}
	o.HasRunAt, o.RunAt = genRunAt(r, m)
	o.Pri = []int{0, 0, 0, 1, -1, 7}[r.Intn(6)] // few values: ties keep the time order
	return o
}

// genTarget picks a task handle, or -1 (an unknown id) now and then.
func genTarget(r *rand.Rand, m *model) int {
	if len(m.tasks) == 0 || r.Intn(12) == 0 {
		return -1
	}
	return r.Intn(len(m.tasks))
}

func genRead(r *rand.Rand, m *model) op {
	h := genTarget(r, m)
	s := r.Intn(m.nSess)
	if h >= 0 && r.Intn(10) < 6 {
		s = m.tasks[h].sess
	}
	return ReadOp{S: s, T: h}
}

func genCancel(r *rand.Rand, m *model) op {
	h := genTarget(r, m)
	s := r.Intn(m.nSess)
	if h >= 0 && r.Intn(10) < 7 {
		s = m.tasks[h].sess
	}
	return CancelOp{S: s, T: h}
}

func genFinish(r *rand.Rand, m *model, claimed []int) op {
	if r.Intn(30) == 0 {
		return FinishOp{T: -1, Outcome: r.Intn(len(outcomePool))}
	}
	var running []int
	for _, h := range claimed {
		if m.tasks[h].state == mRunning {
			running = append(running, h)
		}
	}
	var redelivered []int
	for _, h := range claimed {
		if m.tasks[h].attempts > 1 {
			redelivered = append(redelivered, h)
		}
	}
	h := pick(r, claimed...)
	if len(running) > 0 && r.Intn(10) < 7 {
		h = pick(r, running...)
	}
	t := m.tasks[h]
	a := t.attempts
	switch {
	case len(redelivered) > 0 && r.Intn(10) < 3: // an older, superseded delivery
		h = pick(r, redelivered...)
		t = m.tasks[h]
		a = uint32(1 + r.Intn(int(t.attempts)-1))
	case r.Intn(6) == 0:
		a = uint32(1 + r.Intn(int(t.attempts)))
	}
	o := FinishOp{T: h, Attempt: a, Outcome: r.Intn(len(outcomePool)), Forged: r.Intn(14) == 0}
	switch {
	case t.settledBy == a && r.Intn(2) == 0:
		var same []int
		for i := range outcomePool {
			if sameOutcome(i, t.outcome) {
				same = append(same, i)
			}
		}
		o.Outcome = pick(r, same...)
	case t.cancelReq && r.Intn(2) == 0:
		o.Outcome = cancelOutcome
	}
	return o
}

func genWake(r *rand.Rand, m *model) op {
	var keyed []int
	for h, w := range m.wakes {
		if w.direct && w.key >= 0 {
			keyed = append(keyed, h)
		}
	}
	if len(keyed) > 0 && r.Intn(5) < 2 {
		w := m.wakes[pick(r, keyed...)]
		o := WakeOp{S: w.sess, Key: w.key, Payload: sameClass(r, w.payload)}
		switch r.Intn(4) {
		case 0:
			o.Payload = otherClass(r, w.payload)
		case 1:
			o.S = (o.S + 1 + r.Intn(m.nSess-1)) % m.nSess
		}
		return o
	}
	o := WakeOp{S: r.Intn(m.nSess), Key: -1, Payload: genJSON(r)}
	if r.Intn(10) < 6 {
		o.Key = r.Intn(len(keyNames))
	}
	return o
}

func genAck(r *rand.Rand, m *model, claimed []int) op {
	if r.Intn(30) == 0 {
		return AckOp{W: -1}
	}
	var open []int
	for _, h := range claimed {
		if !m.wakes[h].acked {
			open = append(open, h)
		}
	}
	var redelivered []int
	for _, h := range claimed {
		if m.wakes[h].attempts > 1 {
			redelivered = append(redelivered, h)
		}
	}
	h := pick(r, claimed...)
	if len(open) > 0 && r.Intn(10) < 7 {
		h = pick(r, open...)
	}
	w := m.wakes[h]
	a := w.attempts
	switch {
	case len(redelivered) > 0 && r.Intn(10) < 3: // an older, superseded delivery
		h = pick(r, redelivered...)
		w = m.wakes[h]
		a = uint32(1 + r.Intn(int(w.attempts)-1))
	case r.Intn(6) == 0:
		a = uint32(1 + r.Intn(int(w.attempts)))
	}
	return AckOp{W: h, Attempt: a, Forged: r.Intn(14) == 0}
}

// genAdvance moves the clock a little, or to exactly (or one nanosecond around) the next
// lease expiry or schedule.
func genAdvance(r *rand.Rand, m *model) op {
	var marks []int64
	for _, t := range m.tasks {
		switch {
		case t.state == mRunning && t.leaseExp > m.now:
			marks = append(marks, t.leaseExp)
		case t.state == mPending && t.scheduled > m.now:
			marks = append(marks, t.scheduled)
		}
	}
	for _, w := range m.wakes {
		if w.claimed && !w.acked && w.leaseExp > m.now {
			marks = append(marks, w.leaseExp)
		}
	}
	if len(marks) > 0 && r.Intn(10) < 6 {
		d := pick(r, marks...) - m.now + pick(r, int64(-1), 0, 0, 1)
		if d <= 0 {
			d = 1
		}
		return AdvanceOp{D: time.Duration(d)}
	}
	return AdvanceOp{D: pick(r, time.Nanosecond, time.Millisecond, 250*time.Millisecond, 500*time.Millisecond, time.Second, 2*time.Second)}
}

// genDelivery picks a delivery as genFinish does: mostly the current one of a running task,
// sometimes a superseded one, one of a settled or released task, or a forged token.
func genDelivery(r *rand.Rand, m *model, claimed []int) (int, uint32, bool) {
	var running, redelivered []int
	for _, h := range claimed {
		if m.tasks[h].state == mRunning {
			running = append(running, h)
		}
		if m.tasks[h].attempts > 1 {
			redelivered = append(redelivered, h)
		}
	}
	h := pick(r, claimed...)
	if len(running) > 0 && r.Intn(10) < 7 {
		h = pick(r, running...)
	}
	a := m.tasks[h].attempts
	switch {
	case len(redelivered) > 0 && r.Intn(10) < 2:
		h = pick(r, redelivered...)
		a = uint32(1 + r.Intn(int(m.tasks[h].attempts)-1))
	case r.Intn(8) == 0:
		a = uint32(1 + r.Intn(int(m.tasks[h].attempts)))
	}
	return h, a, r.Intn(14) == 0
}

func genExtend(r *rand.Rand, m *model, claimed []int) op {
	if r.Intn(30) == 0 {
		return ExtendOp{T: -1, Lease: genLease(r)}
	}
	h, a, forged := genDelivery(r, m, claimed)
	return ExtendOp{T: h, Attempt: a, Lease: genLease(r), Forged: forged}
}

// genReleaseAt: no RunAt, or one in the past, now, 1ns after, or later.
func genReleaseAt(r *rand.Rand, m *model) (bool, int64) {
	if r.Intn(2) == 0 {
		return false, 0
	}
	d := pick(r, -time.Second, 0, time.Nanosecond, 500*time.Millisecond, time.Second, 3*time.Second)
	return true, m.now + int64(d)
}

func genRelease(r *rand.Rand, m *model, claimed []int) op {
	if r.Intn(30) == 0 {
		return ReleaseOp{T: -1}
	}
	h, a, forged := genDelivery(r, m, claimed)
	has, runAt := genReleaseAt(r, m)
	return ReleaseOp{T: h, Attempt: a, HasRunAt: has, RunAt: runAt, Forged: forged}
}

// genKindMask: one kind, both, or the kind nobody submits.
func genKindMask(r *rand.Rand) int { return pick(r, 1, 1, 2, 2, 3, 4, 5) }

func genClaimKinds(r *rand.Rand) op {
	return ClaimKindsOp{Mask: genKindMask(r), Dup: r.Intn(8) == 0, Lease: genLease(r), Limit: genLimit(r)}
}

func genTasks(r *rand.Rand, m *model) op {
	o := TasksOp{S: r.Intn(m.nSess), After: -1, Limit: pick(r, 1, 2, 3, 100, 100)}
	if len(m.tasks) > 0 && r.Intn(10) < 6 {
		o.S = m.tasks[r.Intn(len(m.tasks))].sess
	}
	if r.Intn(2) == 0 {
		o.States = 1 + r.Intn(31)
	}
	if r.Intn(10) < 4 {
		o.Kinds = genKindMask(r)
	}
	var own, foreign []int
	for h, t := range m.tasks {
		if t.sess == o.S {
			own = append(own, h)
		} else {
			foreign = append(foreign, h)
		}
	}
	switch n := r.Intn(20); {
	case n < 7 && len(own) > 0:
		o.After = pick(r, own...)
	case n < 9 && len(foreign) > 0:
		o.After = pick(r, foreign...)
	case n < 10:
		o.After = -2
	}
	return o
}

func genSettleAndClaim(r *rand.Rand, m *model, claimed []int) op {
	o := SettleAndClaimOp{Lease: genLease(r), Limit: pick(r, 0, 1, 2, 100)}
	if r.Intn(10) < 4 {
		o.Mask = genKindMask(r)
	}
	if len(claimed) == 0 {
		return o
	}
	for n := pick(r, 1, 1, 2, 3); n > 0; n-- {
		h, a, forged := genDelivery(r, m, claimed)
		st := settleSpec{T: h, Attempt: a, Forged: forged}
		if r.Intn(2) == 0 {
			st.Release = true
			st.HasRun, st.RunAt = genReleaseAt(r, m)
		} else {
			st.Outcome = r.Intn(len(outcomePool))
			if m.tasks[h].cancelReq && r.Intn(2) == 0 {
				st.Outcome = cancelOutcome
			}
		}
		o.Settles = append(o.Settles, st)
	}
	return o
}
