package proptest

import (
	"fmt"
	"maps"
	"math/rand"

	"github.com/worklog/worklog/work"
)

// --- per-kind flow control (work-api-3.md, "Per-kind flow control") ---------------------------

// SetPolicyOp sets the policy of kindNames[K] (a zero one removes it).
type SetPolicyOp struct {
	K          int
	Paused     bool
	Max        int
	Rate       float64
	Burst      int
	Fair       bool // FairSessions: recorded and shown (the claim order is part 1's)
	PerSession int  // MaxRunningPerSession
}

func (o SetPolicyOp) policy() work.KindPolicy {
	return work.KindPolicy{Paused: o.Paused, MaxRunning: o.Max, Rate: o.Rate, Burst: o.Burst,
		FairSessions: o.Fair, MaxRunningPerSession: o.PerSession}
}

func (o SetPolicyOp) String() string {
	return fmt.Sprintf("setPolicy %s paused=%v max=%d rate=%g burst=%d fair=%v perSession=%d",
		kindNames[o.K], o.Paused, o.Max, o.Rate, o.Burst, o.Fair, o.PerSession)
}

func (o SetPolicyOp) valid(*model) bool { return o.K >= 0 && o.K < len(kindNames) }
func (o SetPolicyOp) apply(m *model)    { m.setPolicy(o.K, o.policy()) }

func (o SetPolicyOp) exec(s *system, r *result) {
	r.err = s.q().SetKindPolicyAt(s.ctx, kindNames[o.K], o.policy(), s.at())
	if r.err == nil {
		r.policies, r.err = s.q().KindPolicies(s.ctx)
	}
}

// check: the set succeeded, and KindPolicies reads back every policy the model holds.
func (o SetPolicyOp) check(m *model, r *result) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("[model] set kind policy failed: %v", r.err)}
	}
	want := map[string]work.KindPolicy{}
	for k, p := range m.pols {
		want[kindNames[k]] = work.KindPolicy{Paused: p.paused, MaxRunning: p.max, Rate: p.rate, Burst: p.burst,
			FairSessions: p.fair, MaxRunningPerSession: p.perSession}
	}
	if !maps.Equal(r.policies, want) {
		return []string{fmt.Sprintf("[model] KindPolicies = %+v, want %+v", r.policies, want)}
	}
	return nil
}

// genSetPolicy draws a small policy: often a limit the claims soon meet, sometimes none.
//
// The per-session fields are drawn from a second stream, seeded by the model's state, so
// that they take nothing from r: the histories drawn before they existed (and the rare cases
// TestGeneratorCoverage finds in them) are drawn as before.
func genSetPolicy(r *rand.Rand, m *model) op {
	o := SetPolicyOp{K: r.Intn(len(kindNames))}
	if r.Intn(4) == 0 {
		return o // removes the policy
	}
	o.Paused = r.Intn(5) == 0
	o.Max = r.Intn(4)
	if r.Intn(2) == 0 {
		o.Rate = []float64{0.5, 1, 4}[r.Intn(3)]
		o.Burst = 1 + r.Intn(3)
	}
	r2 := rand.New(rand.NewSource(m.now ^ int64(len(m.tasks))<<40 ^ int64(o.K)<<56))
	if r2.Intn(2) == 0 {
		o.Fair = r2.Intn(2) == 0
		o.PerSession = r2.Intn(3)
	}
	return o
}

func classifySetPolicy(add func(...string), o SetPolicyOp) {
	if o.policy() == (work.KindPolicy{}) {
		add("set kind policy zero")
	} else {
		add("set kind policy")
	}
	if o.PerSession > 0 {
		add("set kind policy per session")
	}
}

// mPolicy is the model's policy of a kind, with its bucket: the rule of the spec written
// again, apart from the projection's.
type mPolicy struct {
	paused   bool
	max      int
	rate     float64
	burst    int
	tokens   float64
	tokensAt int64
	// fair is FairSessions (kept and read back); perSession is MaxRunningPerSession: at most
	// this many of a session's tasks of the kind under leases unexpired at a claim's now.
	fair       bool
	perSession int
}

func (m *model) setPolicy(k int, p work.KindPolicy) {
	m.exp.events = 1
	if p == (work.KindPolicy{}) {
		delete(m.pols, k)
		return
	}
	if m.pols == nil {
		m.pols = map[int]*mPolicy{}
	}
	m.pols[k] = &mPolicy{paused: p.Paused, max: p.MaxRunning, rate: p.Rate, burst: p.Burst,
		tokens: float64(p.Burst), tokensAt: m.now, fair: p.FairSessions, perSession: p.MaxRunningPerSession}
}

// tokensAt is the bucket at now: refilled at rate per second since tokensAt, at most burst.
func (p *mPolicy) tokensNow(now int64) float64 {
	t := p.tokens
	if now > p.tokensAt {
		t = float64(t + float64(p.rate*float64(now-p.tokensAt)/1e9))
	}
	return min(t, float64(p.burst))
}

// allowance is how many tasks of kind k a claim at now may take (-1: any number): none when
// paused; the free slots of max, counting the kind's tasks whose lease is unexpired at now;
// the whole tokens of the bucket.
func (m *model) allowance(k int, p *mPolicy) int {
	if p.paused {
		return 0
	}
	n := -1
	if p.max > 0 {
		held := 0
		for _, t := range m.tasks {
			if t.kind == k && t.state == mRunning && t.leaseExp > m.now {
				held++
			}
		}
		n = max(p.max-held, 0)
	}
	if p.rate > 0 {
		tok := p.tokensNow(m.now)
		whole := 0
		if tok >= 1 {
			whole = int(tok)
		}
		if n < 0 || whole < n {
			n = whole
		}
	}
	return n
}

// limitClaims keeps of el, in order, what the kinds' policies allow: a kind's allowance,
// and with a per-session limit no task of a session whose tasks of the kind under leases
// unexpired at now, with those kept before it, fill the limit.
func (m *model) limitClaims(el []claimed) []claimed {
	if len(m.pols) == 0 {
		return el
	}
	allow := map[int]int{}
	type kindSess struct{ kind, sess int }
	held := map[kindSess]int{}
	for k, p := range m.pols {
		allow[k] = m.allowance(k, p)
		if p.perSession > 0 {
			for _, t := range m.tasks {
				if t.kind == k && t.state == mRunning && t.leaseExp > m.now {
					held[kindSess{k, t.sess}]++
				}
			}
		}
	}
	var out []claimed
	for _, c := range el {
		t := &m.tasks[c.h]
		k := t.kind
		if n, ok := allow[k]; ok && n >= 0 {
			if n == 0 {
				continue
			}
			if p := m.pols[k]; p.perSession > 0 && held[kindSess{k, t.sess}] >= p.perSession {
				continue
			}
			allow[k] = n - 1
		} else if p := m.pols[k]; p != nil && p.perSession > 0 {
			if held[kindSess{k, t.sess}] >= p.perSession {
				continue
			}
		}
		held[kindSess{k, t.sess}]++
		out = append(out, c)
	}
	return out
}

// tookToken is a claim of a task of kind k at now: its bucket refilled, one token taken.
func (m *model) tookToken(k int) {
	if p := m.pols[k]; p != nil && p.rate > 0 {
		p.tokens = p.tokensNow(m.now) - 1
		p.tokensAt = max(p.tokensAt, m.now)
	}
}

// heldBackBySession reports whether a claim of every kind up to limit at m's now takes fewer
// tasks than it would without the per-session limits (for coverage).
func (m *model) heldBackBySession(limit int) bool {
	el := m.eligibleTasks()
	with := len(m.limitClaims(el))
	saved := map[int]int{}
	for k, p := range m.pols {
		saved[k], p.perSession = p.perSession, 0
	}
	without := len(m.limitClaims(el))
	for k, p := range m.pols {
		p.perSession = saved[k]
	}
	return min(with, limit) < min(without, limit)
}
