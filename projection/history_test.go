package projection

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/worklog/worklog/events"
)

// sim draws a random valid history the way the work layer would: each step reads the state,
// picks a command and appends the events it causes. Every event must be accepted.
type sim struct {
	t      testing.TB
	r      *rand.Rand
	m      *Mem
	evs    []events.Event
	now    int64
	n      int
	check  bool // check the invariants after every tenth event
	counts map[events.Type]int
}

var (
	sessions = []string{"s1", "s2", "s3"}
	kinds    = []string{"k", "mail", "thumb"}
)

func newSim(t testing.TB, seed uint64) *sim {
	return &sim{t: t, r: rand.New(rand.NewPCG(seed, seed^0x5eed)), m: NewMem(), counts: map[events.Type]int{}}
}

func (s *sim) apply(ev events.Event) {
	s.t.Helper()
	ev.Head().Seq = uint64(len(s.evs) + 1)
	if err := Apply(s.m, ev); err != nil {
		s.t.Fatalf("sim: event %d rejected: %v", len(s.evs)+1, err)
	}
	s.evs = append(s.evs, ev)
	s.counts[ev.Type()]++
	if s.check && len(s.evs)%10 == 0 {
		checkInvariants(s.t, s.m)
	}
}

func (s *sim) id(prefix string) string { s.n++; return fmt.Sprintf("%s%05d", prefix, s.n) }
func (s *sim) token() string           { return fmt.Sprintf("tok%08x", s.r.Uint32()) }
func (s *sim) h(session string) events.Header {
	return events.Header{SessionID: session, At: s.now}
}

// pick returns a random element of xs that satisfies ok, if there is one.
func pick[T any](r *rand.Rand, xs []T, ok func(*T) bool) (*T, bool) {
	var cands []*T
	for i := range xs {
		if ok(&xs[i]) {
			cands = append(cands, &xs[i])
		}
	}
	if len(cands) == 0 {
		return nil, false
	}
	return cands[r.IntN(len(cands))], true
}

func (s *sim) completionWake(id string) {
	x := task(s.t, s.m, id)
	if x.WakeOnCompletion && x.State.Terminal() {
		s.apply(&events.WakeRecorded{Header: s.h(x.SessionID), WakeID: s.id("w"), Reason: events.WakeTaskFinished,
			TaskID: x.ID, Outcome: x.Outcome})
	}
}

func (s *sim) step() {
	s.now += int64(s.r.IntN(8))
	r := s.r
	switch k := r.IntN(128); {
	case k < 25: // submit
		sess := sessions[r.IntN(len(sessions))]
		e := &events.TaskSubmitted{Header: s.h(sess), TaskID: s.id("t"), Kind: kinds[r.IntN(len(kinds))], Input: []byte(`{}`),
			WakeOnCompletion: r.IntN(2) == 0}
		if r.IntN(3) == 0 {
			e.HasRunAt, e.RunAt = true, s.now+int64(r.IntN(60))-10
		}
		if r.IntN(3) == 0 {
			key := fmt.Sprintf("key%d", r.IntN(30))
			if id, _ := s.m.TaskKey(sess, key); id == "" {
				e.IdempotencyKey = key
			} else if r.IntN(2) == 0 { // the key is taken: an inbox submission with another intent
				s.apply(&events.TaskSubmitRejected{Header: s.h(sess), TaskID: id, IdempotencyKey: key, Field: "input", Kind: e.Kind})
				return
			}
		}
		s.apply(e)
	case k < 45: // claim due tasks
		var ids []string
		_ = s.m.ScanIndex(IndexDue, "", math.MinInt64, s.now, func(e IndexEntry) bool { ids = append(ids, e.ID); return len(ids) < 1+r.IntN(4) })
		for _, id := range ids {
			x := task(s.t, s.m, id)
			s.apply(&events.TaskClaimed{Header: s.h(x.SessionID), TaskID: id, Attempt: x.Attempts + 1,
				LeaseToken: s.token(), LeaseExpiresAt: s.now + 1 + int64(r.IntN(40))})
		}
	case k < 60: // settle a running task by its owner
		x, ok := pick(r, s.m.Tasks(), func(x *Task) bool { return x.State == events.StateRunning })
		if !ok {
			return
		}
		o := events.Outcome{State: events.StateSucceeded + events.TaskState(r.IntN(3)), Summary: "s", Output: []byte(`1`)}
		s.apply(&events.TaskSettled{Header: s.h(x.SessionID), TaskID: x.ID, Attempt: x.Attempts, LeaseToken: x.LeaseToken, Outcome: o})
		s.completionWake(x.ID)
	case k < 65: // a stale settlement, recorded
		x, ok := pick(r, s.m.Tasks(), func(x *Task) bool { return x.Attempts > x.RejectedAttempt })
		if !ok {
			return
		}
		a := x.RejectedAttempt + 1 + uint32(r.IntN(int(x.Attempts-x.RejectedAttempt)))
		s.apply(&events.TaskSettleRejected{Header: s.h(x.SessionID), TaskID: x.ID, Attempt: a, Reason: events.RejectSuperseded})
	case k < 72: // cancel
		x, ok := pick(r, s.m.Tasks(), func(x *Task) bool { return !x.State.Terminal() })
		if !ok {
			return
		}
		s.apply(&events.TaskCancelRequested{Header: s.h(x.SessionID), TaskID: x.ID})
		s.completionWake(x.ID)
	case k < 80: // a direct wake
		sess := sessions[r.IntN(len(sessions))]
		e := &events.WakeRecorded{Header: s.h(sess), WakeID: s.id("w"), Reason: events.WakeRequested, Payload: []byte(`"p"`)}
		if r.IntN(3) == 0 {
			key := fmt.Sprintf("key%d", r.IntN(30))
			if id, _ := s.m.WakeKey(sess, key); id == "" {
				e.IdempotencyKey = key
			}
		}
		s.apply(e)
	case k < 88: // claim available wakes
		var ids []string
		_ = s.m.ScanIndex(IndexWakes, "", math.MinInt64, s.now, func(e IndexEntry) bool { ids = append(ids, e.ID); return len(ids) < 1+r.IntN(4) })
		for _, id := range ids {
			w := wakeRec(s.t, s.m, id)
			s.apply(&events.WakeClaimed{Header: s.h(w.SessionID), WakeID: id, Attempt: w.Attempts + 1,
				LeaseToken: s.token(), LeaseExpiresAt: s.now + 1 + int64(r.IntN(40))})
		}
	case k < 96: // ack by the owner
		w, ok := pick(r, s.m.Wakes(), func(w *Wake) bool { return !w.Acked && w.Claimed() })
		if !ok {
			return
		}
		s.apply(&events.WakeAcked{Header: s.h(w.SessionID), WakeID: w.ID, Attempt: w.Attempts, LeaseToken: w.LeaseToken})
	case k < 100: // a stale ack, recorded
		w, ok := pick(r, s.m.Wakes(), func(w *Wake) bool { return w.Attempts > w.RejectedAttempt })
		if !ok {
			return
		}
		s.apply(&events.WakeAckRejected{Header: s.h(w.SessionID), WakeID: w.ID, Attempt: w.RejectedAttempt + 1,
			Reason: events.RejectTokenMismatch})
	case k < 106: // a heartbeat: the lease moves, earlier or later
		x, ok := pick(r, s.m.Tasks(), func(x *Task) bool { return x.State == events.StateRunning })
		if !ok {
			return
		}
		s.apply(&events.TaskExtended{Header: s.h(x.SessionID), TaskID: x.ID, Attempt: x.Attempts,
			LeaseExpiresAt: s.now + 1 + int64(r.IntN(40))})
	case k < 112: // a release: pending again (at once or later), or canceled if a cancel was requested
		x, ok := pick(r, s.m.Tasks(), func(x *Task) bool { return x.State == events.StateRunning })
		if !ok {
			return
		}
		s.apply(&events.TaskReleased{Header: s.h(x.SessionID), TaskID: x.ID, Attempt: x.Attempts,
			RunAt: s.now + int64(r.IntN(3)*r.IntN(20)), Reason: "retry"})
		s.completionWake(x.ID)
	case k >= 124: // a kind's policy: set (its bucket starts full), changed or removed
		e := &events.KindPolicySet{Header: s.h(""), Kind: kinds[r.IntN(len(kinds))]}
		if r.IntN(4) != 0 {
			e.Paused = r.IntN(4) == 0
			e.MaxRunning = int64(r.IntN(4))
			if r.IntN(2) == 0 {
				e.Rate, e.Burst = float64(1+r.IntN(8))/4, int64(1+r.IntN(3))
			}
		}
		s.apply(e)
	case k >= 116: // a schedule: set, removed, or its due tick submitted
		s.scheduleStep()
	default: // an operator's retry of a failed or canceled task: pending again, attempts kept
		x, ok := pick(r, s.m.Tasks(), func(x *Task) bool {
			if !x.Retryable() {
				return false
			}
			w, _ := s.m.Wake(x.CompletionWakeID)
			return x.CompletionWakeID == "" || w != nil && w.Acked
		})
		if !ok {
			return
		}
		s.apply(&events.TaskRetried{Header: s.h(x.SessionID), TaskID: x.ID, Attempts: x.Attempts,
			RunAt: s.now + int64(r.IntN(2)*r.IntN(20))})
	}
}

// scheduleStep sets or removes a schedule ("@every 10" nanoseconds, as the decide code would
// have computed it), or submits a due tick's task.
func (s *sim) scheduleStep() {
	r := s.r
	sess, name := sessions[r.IntN(len(sessions))], fmt.Sprintf("sc%d", r.IntN(3))
	old, _ := s.m.Schedule(sess, name)
	switch r.IntN(4) {
	case 0:
		from := s.now
		if old != nil {
			from = max(from, old.Cursor)
		}
		s.apply(&events.ScheduleSet{Header: s.h(sess), Name: name, Cron: "@every 10ns", Catchup: uint8(r.IntN(2)),
			Kind: kinds[r.IntN(len(kinds))], Input: []byte(`{}`), Priority: int64(r.IntN(3)), From: from, Next: from + 10})
	case 1:
		if old != nil && !old.Removed {
			s.apply(&events.ScheduleRemoved{Header: s.h(sess), Name: name})
		}
	default:
		var due []ScheduleEntry
		_ = s.m.ScanScheduleDue(s.now, func(e ScheduleEntry) bool { due = append(due, e); return true })
		for _, e := range due {
			sc, _ := s.m.Schedule(e.SessionID, e.Name)
			tick := sc.Next
			if sc.Catchup == 0 {
				tick += (s.now - tick) / 10 * 10
			}
			s.apply(&events.TaskSubmitted{Header: s.h(e.SessionID), TaskID: s.id("t"), Kind: sc.Kind, Input: sc.Input,
				HasRunAt: true, RunAt: tick, IdempotencyKey: fmt.Sprintf("schedule:%s:%d", e.Name, tick),
				Priority: sc.Priority, Schedule: e.Name, Tick: tick, ScheduleNext: tick + 10})
		}
	}
}

func history(t testing.TB, seed uint64, n int, check bool) *sim {
	s := newSim(t, seed)
	s.check = check
	for len(s.evs) < n {
		s.step()
	}
	return s
}

// TestFoldDeterministic: folding the same history twice, directly or through the wire
// encoding, gives equal states, equal to the one built live.
func TestFoldDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		s := history(t, seed, 1500, seed == 1)
		t.Logf("seed %d: %v", seed, s.counts)
		for _, typ := range events.AllTypes() {
			if s.counts[typ] == 0 {
				t.Errorf("seed %d: the history has no %s", seed, typ)
			}
		}
		a, b := fold(t, s.evs), fold(t, s.evs)
		if d := a.Diff(b); len(d) > 0 {
			t.Fatalf("seed %d: two folds differ:\n%q", seed, d)
		}
		if d := a.Diff(s.m); len(d) > 0 {
			t.Fatalf("seed %d: the fold differs from the live state:\n%q", seed, d)
		}
		c := NewMem()
		var buf []byte
		for i, ev := range s.evs {
			var err error
			if buf, err = events.Append(buf[:0], ev); err != nil {
				t.Fatal(err)
			}
			dec, err := events.Decode(buf, uint64(i+1))
			if err != nil {
				t.Fatal(err)
			}
			if err := Apply(c, dec); err != nil {
				t.Fatal(err)
			}
		}
		if !c.Equal(a) {
			t.Fatalf("seed %d: the fold of the decoded events differs:\n%q", seed, c.Diff(a))
		}
		checkInvariants(t, c)
	}
}

// TestRejectionsWriteNothing: along a random valid history, variants of the next event that
// break one rule are rejected without a single write, and the state stays equal to the
// prefix's.
func TestRejectionsWriteNothing(t *testing.T) {
	s := history(t, 99, 1200, false)
	m := NewMem()
	rejected, accepted := 0, 0
	r := rand.New(rand.NewPCG(5, 6))
	for i, ev := range s.evs {
		for _, bad := range mutants(r, ev) {
			sp := &spy{State: m}
			if err := Apply(sp, bad); err == nil {
				// Some variants are valid events too (a later time, another token for a
				// claim): undo by refolding.
				accepted++
				m = fold(t, s.evs[:i])
				continue
			} else if !isInconsistent(err) {
				t.Fatalf("seq %d variant %#v: %v", i+1, bad, err)
			}
			rejected++
			if sp.writes != 0 {
				t.Fatalf("seq %d: rejected variant %#v made %d writes", i+1, bad, sp.writes)
			}
		}
		if err := Apply(m, ev); err != nil {
			t.Fatal(err)
		}
	}
	if d := m.Diff(s.m); len(d) > 0 {
		t.Fatalf("after the rejections the state differs:\n%q", d)
	}
	t.Logf("%d variants rejected, %d accepted, over %d events", rejected, accepted, len(s.evs))
	if rejected < 5*len(s.evs) {
		t.Errorf("only %d variants rejected (%d accepted)", rejected, accepted)
	}
}

func isInconsistent(err error) bool {
	var ae *ApplyError
	return errors.As(err, &ae) && errors.Is(err, ErrInconsistent)
}

// mutants returns variants of ev that each break, or may break, one rule.
func mutants(r *rand.Rand, ev events.Event) []events.Event {
	var out []events.Event
	clone := func(fn func(e events.Event)) {
		c := cloneEvent(ev)
		fn(c)
		out = append(out, c)
	}
	clone(func(e events.Event) { e.Head().Seq++ })
	clone(func(e events.Event) { e.Head().Seq-- })
	clone(func(e events.Event) { e.Head().Seq = 0 })
	if w, ok := ev.(*events.WakeRecorded); !ok && ev.Type() != events.TypeTaskSubmitted || ok && w.Reason == events.WakeTaskFinished {
		clone(func(e events.Event) { e.Head().SessionID = "other" }) // not the subject's session
	}
	if ev.Type() == events.TypeTaskClaimed || ev.Type() == events.TypeWakeClaimed {
		clone(func(e events.Event) { e.Head().At = math.MinInt64 }) // before it is eligible
	}
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		clone(func(c events.Event) { c.(*events.TaskSubmitted).TaskID = "t00001" })
		clone(func(c events.Event) { c.(*events.TaskSubmitted).Kind = "" })
	case *events.TaskClaimed:
		clone(func(c events.Event) { c.(*events.TaskClaimed).Attempt++ })
		clone(func(c events.Event) { c.(*events.TaskClaimed).Attempt-- })
		clone(func(c events.Event) { c.(*events.TaskClaimed).LeaseToken = "" })
		clone(func(c events.Event) { c.(*events.TaskClaimed).LeaseExpiresAt = e.At })
		clone(func(c events.Event) { c.(*events.TaskClaimed).TaskID += "x" })
	case *events.TaskSettled:
		clone(func(c events.Event) { c.(*events.TaskSettled).Attempt += 1 + uint32(r.IntN(2)) })
		clone(func(c events.Event) { c.(*events.TaskSettled).Attempt-- })
		clone(func(c events.Event) { c.(*events.TaskSettled).LeaseToken += "x" })
	case *events.TaskCancelRequested:
		clone(func(c events.Event) { c.(*events.TaskCancelRequested).TaskID = "nope" })
	case *events.TaskSettleRejected:
		clone(func(c events.Event) { c.(*events.TaskSettleRejected).Attempt = 0 })
		clone(func(c events.Event) { c.(*events.TaskSettleRejected).Attempt += 1 << 20 })
	case *events.WakeRecorded:
		clone(func(c events.Event) { c.(*events.WakeRecorded).WakeID = "" })
		clone(func(c events.Event) { c.(*events.WakeRecorded).Reason = 9 })
		if e.Reason == events.WakeTaskFinished {
			clone(func(c events.Event) { c.(*events.WakeRecorded).Outcome.State = events.StatePending })
			clone(func(c events.Event) { c.(*events.WakeRecorded).TaskID = "nope" })
		}
	case *events.WakeClaimed:
		clone(func(c events.Event) { c.(*events.WakeClaimed).Attempt++ })
		clone(func(c events.Event) { c.(*events.WakeClaimed).LeaseToken = "" })
		clone(func(c events.Event) { c.(*events.WakeClaimed).LeaseExpiresAt = e.At - 1 })
	case *events.WakeAcked:
		clone(func(c events.Event) { c.(*events.WakeAcked).Attempt++ })
		clone(func(c events.Event) { c.(*events.WakeAcked).LeaseToken = "" })
		clone(func(c events.Event) { c.(*events.WakeAcked).Attempt, c.(*events.WakeAcked).LeaseToken = 0, "" })
	case *events.TaskSubmitRejected:
		clone(func(c events.Event) { c.(*events.TaskSubmitRejected).TaskID = "nope" })
		clone(func(c events.Event) { c.(*events.TaskSubmitRejected).IdempotencyKey += "x" })
		clone(func(c events.Event) { c.(*events.TaskSubmitRejected).SessionID += "x" })
	case *events.WakeAckRejected:
		clone(func(c events.Event) { c.(*events.WakeAckRejected).Attempt = 0 })
		clone(func(c events.Event) { c.(*events.WakeAckRejected).Attempt += 1 << 20 })
	case *events.TaskExtended:
		clone(func(c events.Event) { c.(*events.TaskExtended).Attempt++ })
		clone(func(c events.Event) { c.(*events.TaskExtended).Attempt-- })
		clone(func(c events.Event) { c.(*events.TaskExtended).LeaseExpiresAt = e.At })
		clone(func(c events.Event) { c.(*events.TaskExtended).TaskID = "nope" })
	case *events.TaskReleased:
		clone(func(c events.Event) { c.(*events.TaskReleased).Attempt++ })
		clone(func(c events.Event) { c.(*events.TaskReleased).Attempt-- })
		clone(func(c events.Event) { c.(*events.TaskReleased).RunAt = e.At - 1 })
		clone(func(c events.Event) { c.(*events.TaskReleased).TaskID = "nope" })
	case *events.TaskRetried:
		clone(func(c events.Event) { c.(*events.TaskRetried).Attempts++ })
		clone(func(c events.Event) { c.(*events.TaskRetried).RunAt = e.At - 1 })
		clone(func(c events.Event) { c.(*events.TaskRetried).TaskID = "nope" })
	case *events.ScheduleSet:
		clone(func(c events.Event) { c.(*events.ScheduleSet).Next = e.From })
	case *events.ScheduleRemoved:
		clone(func(c events.Event) { c.(*events.ScheduleRemoved).Name = "nope" })
	case *events.KindPolicySet:
		clone(func(c events.Event) { c.(*events.KindPolicySet).Kind = "" })
	}
	if e, ok := ev.(*events.TaskSubmitted); ok && e.Schedule != "" {
		clone(func(c events.Event) { c.(*events.TaskSubmitted).Schedule = "nope" })
		clone(func(c events.Event) { c.(*events.TaskSubmitted).Tick = e.Tick - 1 })
	}
	return out
}

func cloneEvent(ev events.Event) events.Event {
	switch e := ev.(type) {
	case *events.TaskSubmitted:
		c := *e
		return &c
	case *events.TaskClaimed:
		c := *e
		return &c
	case *events.TaskSettled:
		c := *e
		return &c
	case *events.TaskCancelRequested:
		c := *e
		return &c
	case *events.WakeRecorded:
		c := *e
		return &c
	case *events.WakeClaimed:
		c := *e
		return &c
	case *events.WakeAcked:
		c := *e
		return &c
	case *events.TaskSettleRejected:
		c := *e
		return &c
	case *events.WakeAckRejected:
		c := *e
		return &c
	case *events.TaskExtended:
		c := *e
		return &c
	case *events.TaskReleased:
		c := *e
		return &c
	case *events.TaskRetried:
		c := *e
		return &c
	case *events.ScheduleSet:
		c := *e
		return &c
	case *events.ScheduleRemoved:
		c := *e
		return &c
	case *events.TaskSubmitRejected:
		c := *e
		return &c
	case *events.KindPolicySet:
		c := *e
		return &c
	}
	panic(fmt.Sprintf("cloneEvent: %T", ev))
}

// TestDeferredIndexes: folding with the indexes deferred and built at the end gives the same
// state, index entries included, as keeping them all along, both with records changed in
// place and through copies; and a state whose indexes were built goes on like one that never
// deferred them.
func TestDeferredIndexes(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		s := history(t, seed, 1500, false)
		for cut := 0; cut <= len(s.evs); cut += 250 {
			eager, fast, slow := NewMem(), NewMem(), NewMem()
			fast.DeferIndexes()
			slow.DeferIndexes()
			for _, ev := range s.evs[:cut] {
				for _, st := range []State{eager, fast, copying{slow}} {
					if err := Apply(st, ev); err != nil {
						t.Fatal(err)
					}
				}
			}
			for name, m := range map[string]*Mem{"in place": fast, "through copies": slow} {
				if d := eager.Diff(m); len(d) > 0 {
					t.Fatalf("seed %d, %d events, %s: deferred indexes differ:\n%q", seed, cut, name, d)
				}
				if a, b := dueOf(t, eager), dueOf(t, m); !slices.Equal(a, b) {
					t.Fatalf("seed %d, %d events, %s: due index %v, want %v", seed, cut, name, b, a)
				}
				if a, b := wakesOf(t, eager), wakesOf(t, m); !slices.Equal(a, b) {
					t.Fatalf("seed %d, %d events, %s: wake index %v, want %v", seed, cut, name, b, a)
				}
			}
			// Built (by the Diff above), fast keeps its indexes up to date again.
			for _, ev := range s.evs[cut:] {
				if err := Apply(eager, ev); err != nil {
					t.Fatal(err)
				}
				if err := Apply(fast, ev); err != nil {
					t.Fatal(err)
				}
			}
			if fast.deferred {
				t.Fatal("still deferred after BuildIndexes")
			}
			if d := eager.Diff(fast); len(d) > 0 {
				t.Fatalf("seed %d, cut %d: after the rest of the log:\n%q", seed, cut, d)
			}
			checkInvariants(t, fast)
		}
	}
}
