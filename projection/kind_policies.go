package projection

import (
	"fmt"
	"math"

	"github.com/worklog/worklog/events"
)

// KindPolicy is a kind's flow-control policy (events.KindPolicySet) and the state of its
// token bucket. The decide code reads it at each claim's now; the fold keeps it: set by
// kind_policy_set, its bucket taking one token at each task_claimed of the kind.
type KindPolicy struct {
	Kind       string
	Paused     bool
	MaxRunning int64
	Rate       float64 // claims per second; 0: no rate limit
	Burst      int64
	// FairSessions and MaxRunningPerSession: the per-session fields (events.KindPolicySet's).
	FairSessions         bool
	MaxRunningPerSession int64
	// The bucket (Rate > 0): Tokens at TokensAt. Set full (Burst) at the policy's event;
	// each claim of the kind refills it to its time and takes one token.
	Tokens   float64
	TokensAt int64
	SetSeq   uint64 // the kind_policy_set event that set the policy
}

// PolicyOf is the policy a kind_policy_set event sets, its bucket full at the event's time.
func PolicyOf(e *events.KindPolicySet) *KindPolicy {
	p := &KindPolicy{Kind: e.Kind, Paused: e.Paused, MaxRunning: e.MaxRunning, Rate: e.Rate,
		Burst: e.Burst, FairSessions: e.FairSessions, MaxRunningPerSession: e.MaxRunningPerSession, SetSeq: e.Seq}
	if p.Rate > 0 {
		p.Tokens, p.TokensAt = float64(p.Burst), e.At
	}
	return p
}

// TokensNow is the bucket's level at now: refilled at Rate per second since TokensAt, at most
// Burst; a now before TokensAt refills nothing. Without a rate it is +Inf. Every backend and
// every replay computes it with this code from the same integers and floats, so they agree
// to the bit (the explicit float64 conversions forbid a fused multiply-add).
func (p *KindPolicy) TokensNow(now int64) float64 {
	if p.Rate <= 0 {
		return math.Inf(1)
	}
	t := p.Tokens
	if now > p.TokensAt {
		t = float64(t + float64(p.Rate*float64(now-p.TokensAt)/1e9))
	}
	return min(t, float64(p.Burst))
}

// RateAllows is how many claims the bucket allows at now (at most limit).
func (p *KindPolicy) RateAllows(now int64, limit int) int {
	t := p.TokensNow(now)
	if t >= float64(limit) {
		return limit
	}
	if t < 1 {
		return 0
	}
	return int(t)
}

// take is the fold's side of a claim at at: the bucket refilled to at, one token taken.
func (p *KindPolicy) take(at int64) {
	if p.Rate <= 0 {
		return
	}
	p.Tokens = p.TokensNow(at) - 1
	p.TokensAt = max(p.TokensAt, at)
}

// NextTokenAt is the first moment at or after now when the bucket holds a whole token: now
// when it does already. Only for a policy with a rate.
func (p *KindPolicy) NextTokenAt(now int64) int64 {
	at := max(now, p.TokensAt)
	lvl := p.TokensNow(at)
	if lvl >= 1 {
		return at
	}
	d := math.Ceil((1 - lvl) / p.Rate * 1e9)
	if d > math.MaxInt64/2 {
		return math.MaxInt64
	}
	at += int64(d)
	for p.TokensNow(at) < 1 { // float rounding: at most a few nanoseconds more
		at++
	}
	return at
}

// LeaseEntry is t's entry in its kind's partition of the lease index (IndexKindLeases):
// running tasks by lease expiry, which counts the tasks of a kind held under unexpired
// leases at a now (ScanLeases).
func (t *Task) LeaseEntry() (IndexEntry, bool) {
	if t.State != events.StateRunning {
		return IndexEntry{}, false
	}
	return IndexEntry{At: t.LeaseExpiresAt, Seq: t.SubmitSeq, ID: t.ID}, true
}

// applyKindPolicySet replaces the kind's policy (removes it when the event's is zero).
func applyKindPolicySet(s State, e *events.KindPolicySet, fail failFunc) error {
	if e.SessionID != "" {
		return fail("a kind policy belongs to no session, event names %q", e.SessionID)
	}
	if e.Kind == "" {
		return fail("a kind policy needs a kind")
	}
	if e.Zero() {
		return s.DeleteKindPolicy(e.Kind)
	}
	return s.PutKindPolicy(PolicyOf(e))
}

// takeToken is the claim's side of a kind's rate: the kind's bucket, if it has a rate, takes
// a token at at.
func takeToken(s State, kind string, at int64) error {
	p, err := s.KindPolicy(kind)
	if err != nil || p == nil || p.Rate <= 0 {
		return err
	}
	p.take(at)
	return s.PutKindPolicy(p)
}

// moveLease moves t's entry in its kind's lease index from old (its entry before the change)
// to its entry now.
func moveLease(s State, old IndexEntry, oldIn bool, t *Task) error {
	e, in := t.LeaseEntry()
	if oldIn {
		if in && old == e {
			return nil
		}
		if err := s.DeleteIndex(IndexKindLeases, t.Kind, old); err != nil {
			return err
		}
	}
	if in {
		return s.PutIndex(IndexKindLeases, t.Kind, e)
	}
	return nil
}

// ScanLeases calls fn with kind's entries of the lease index whose lease expires after now,
// in expiry order, until fn returns false.
func ScanLeases(r Reader, kind string, now int64, fn func(IndexEntry) bool) error {
	if now == math.MaxInt64 {
		return nil
	}
	return r.ScanIndex(IndexKindLeases, kind, now+1, math.MaxInt64, fn)
}

// LeaseSessions calls fn with the session and lease expiry of each of kind's tasks whose
// lease expires after now, in expiry order, until fn returns false: the lease index's entries
// with each entry's task read for its session (a task's session and kind never change). A
// kind's MaxRunningPerSession counts them per session.
func LeaseSessions(r Reader, kind string, now int64, fn func(session string, expires int64) bool) error {
	var err error
	serr := ScanLeases(r, kind, now, func(e IndexEntry) bool {
		var t *Task
		if t, err = r.Task(e.ID); err != nil {
			return false
		}
		if t == nil {
			err = fmt.Errorf("projection: the lease index of kind %q names task %s, which has no record", kind, e.ID)
			return false
		}
		return fn(t.SessionID, e.At)
	})
	if serr != nil {
		return serr
	}
	return err
}
