package work

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// KindPolicy is a kind's flow control (Queue.SetKindPolicy): a pause, a limit on the tasks
// of the kind held under unexpired leases at once, and a rate of claims with bursts. Every
// claim enforces it at its now, in the decide code, on every backend and across processes.
type KindPolicy struct {
	Paused     bool    // claims skip this kind; running tasks are not touched
	MaxRunning int     // > 0: at most this many tasks of the kind held under unexpired leases at once, across every process; 0: no limit
	Rate       float64 // > 0: at most Rate claims per second of this kind, with bursts up to Burst; 0: no limit
	Burst      int     // >= 1 when Rate > 0; 0 without a rate
	// FairSessions: claims of this kind take from its sessions in turn. Recorded and shown;
	// the claim order it names is not built yet (claims take oldest first, after priority).
	// Both per-session fields are omitted from JSON when zero, so a policy without them
	// renders as before they existed.
	FairSessions         bool `json:",omitempty"`
	MaxRunningPerSession int  `json:",omitempty"` // > 0: at most this many tasks of this kind per session under unexpired leases, across every process
}

// KindPolicyBackend is implemented by a backend that keeps kind policies (Queue.SetKindPolicy,
// Queue.KindPolicies). worklog's own backends implement it; over a custom Backend given to
// New that does not, the calls fail with ErrBackend.
type KindPolicyBackend interface {
	SetKindPolicy(ctx context.Context, kind string, p KindPolicy, now time.Time) error
	KindPolicies(ctx context.Context) (map[string]KindPolicy, error)
}

// SetKindPolicy sets kind's policy at the queue's clock's time.
func (q *Queue) SetKindPolicy(ctx context.Context, kind string, p KindPolicy) error {
	return q.SetKindPolicyAt(ctx, kind, p, q.now())
}

// SetKindPolicyAt replaces kind's whole policy from now on; a zero KindPolicy removes it.
// With a rate the kind's token bucket starts full (Burst claims) at now and refills at Rate
// per second up to Burst. The change is one kind_policy_set event. Tasks already running are
// not touched: a lower MaxRunning only stops new claims until enough leases end.
//
// A blank kind is ErrInvalidRequest naming "kind"; a negative MaxRunning names
// "max_running", a negative MaxRunningPerSession "max_running_per_session"; a negative, NaN or infinite Rate names "rate"; a Burst below 1 with a rate,
// a negative one, or one without a rate names "burst" (a burst is the size of the rate's
// bucket: without a rate it would be recorded nowhere, and the event's decoder refuses it).
func (q *Queue) SetKindPolicyAt(ctx context.Context, kind string, p KindPolicy, now time.Time) error {
	if err := q.begin(ctx); err != nil {
		return err
	}
	if err := validateNonBlank("kind", kind); err != nil {
		return err
	}
	if _, err := nanos("now", now); err != nil {
		return err
	}
	if err := validateKindPolicy(kind, p); err != nil {
		return err
	}
	if q.caps.kindPolicy == nil {
		return unsupported("Queue.SetKindPolicy", "KindPolicyBackend")
	}
	return wrap(q.caps.kindPolicy.SetKindPolicy(ctx, kind, p, now))
}

// KindPolicies returns the policy of every kind that has a non-zero one.
func (q *Queue) KindPolicies(ctx context.Context) (map[string]KindPolicy, error) {
	if err := q.begin(ctx); err != nil {
		return nil, err
	}
	if q.caps.kindPolicy == nil {
		return nil, unsupported("Queue.KindPolicies", "KindPolicyBackend")
	}
	m, err := q.caps.kindPolicy.KindPolicies(ctx)
	return m, wrap(err)
}

// validateKindPolicy checks p by the event's own rule (events.CheckKindPolicy), so nothing
// the API accepts is refused by the decoder.
func validateKindPolicy(kind string, p KindPolicy) *Error {
	if math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0) {
		return invalid("rate", "must be a finite number")
	}
	if field, msg := events.CheckKindPolicy(kind, int64(p.MaxRunning), p.Rate, int64(p.Burst)); field != "" {
		return invalid(field, msg)
	}
	if field, msg := events.CheckKindPolicySession(int64(p.MaxRunningPerSession)); field != "" {
		return invalid(field, msg)
	}
	return nil
}

func policyFrom(p *projection.KindPolicy) KindPolicy {
	return KindPolicy{Paused: p.Paused, MaxRunning: int(p.MaxRunning), Rate: p.Rate, Burst: int(p.Burst),
		FairSessions: p.FairSessions, MaxRunningPerSession: int(p.MaxRunningPerSession)}
}

// SetKindPolicy appends one kind_policy_set event (validated by Queue.SetKindPolicyAt).
func (b *logBackend) SetKindPolicy(ctx context.Context, kind string, p KindPolicy, now time.Time) error {
	at, verr := nanos("now", now)
	if verr != nil {
		return verr
	}
	if err := validateKindPolicy(kind, p); err != nil {
		return err
	}
	err := b.update(ctx, func(tx txn) error {
		return tx.Append(&events.KindPolicySet{Header: events.Header{At: at}, Kind: kind, Paused: p.Paused,
			MaxRunning: int64(p.MaxRunning), Rate: p.Rate, Burst: int64(p.Burst),
			FairSessions: p.FairSessions, MaxRunningPerSession: int64(p.MaxRunningPerSession)})
	})
	return backendErr(err)
}

func (b *logBackend) KindPolicies(ctx context.Context) (map[string]KindPolicy, error) {
	out := map[string]KindPolicy{}
	err := b.eng.View(ctx, func(r projection.Reader) error {
		clear(out)
		return r.KindPolicies(func(p *projection.KindPolicy) bool {
			out[p.Kind] = policyFrom(p)
			return true
		})
	})
	if err != nil {
		return nil, backendErr(err)
	}
	return out, nil
}

// unlimited is the allowance of a kind no policy limits.
const unlimited = math.MaxInt

// allowance is how many tasks of p's kind a claim at at may take: 0 when paused; the free
// slots under MaxRunning (the kind's tasks under leases that expire after at, counted from
// its lease index: at most MaxRunning entries read); at most the whole tokens of its bucket.
func allowance(r projection.Reader, p *projection.KindPolicy, at int64) (int, error) {
	if p.Paused {
		return 0, nil
	}
	n := unlimited
	if p.MaxRunning > 0 {
		held, err := leasesHeld(r, p.Kind, at, p.MaxRunning)
		if err != nil {
			return 0, err
		}
		n = int(max(p.MaxRunning-held, 0))
	}
	if p.Rate > 0 {
		n = p.RateAllows(at, n)
	}
	return n, nil
}

// leasesHeld counts kind's tasks under leases that expire after at, up to most.
func leasesHeld(r projection.Reader, kind string, at, most int64) (int64, error) {
	var held int64
	err := projection.ScanLeases(r, kind, at, func(projection.IndexEntry) bool {
		held++
		return held < most
	})
	return held, err
}

// policiesOf reads every kind policy.
func policiesOf(r projection.Reader) (map[string]*projection.KindPolicy, error) {
	var pols map[string]*projection.KindPolicy
	err := r.KindPolicies(func(p *projection.KindPolicy) bool {
		if pols == nil {
			pols = map[string]*projection.KindPolicy{}
		}
		pols[p.Kind] = p
		return true
	})
	return pols, err
}

// dueScan is the scan of a claim of every kind (ClaimDue, SettleAndClaim without kinds):
// the due index itself while no policy limits a kind at the claim's now, else the merge of
// the kinds' own due indexes, each cut at its allowance (gatedScan).
func dueScan(tx txn, at int64, fn func(projection.IndexEntry) bool) error {
	return gatedScan(tx, nil, at, fn)
}

// kindsScan is the scan of a claim restricted to kinds (ClaimKinds, SettleAndClaim): the
// merge of the kinds' own due indexes (scanKinds), each cut at its allowance.
func kindsScan(kinds []string) scanFunc {
	kinds = distinct(kinds)
	return func(tx txn, at int64, fn func(projection.IndexEntry) bool) error {
		return gatedScan(tx, kinds, at, fn)
	}
}

// gatedScan calls fn with the due entries at at of kinds (every kind when nil) in claim
// order, never more of a kind than its policy allows at at (allowance): a paused kind gives
// none, a kind with MaxRunning no more than its free slots, a kind with a rate no more than
// its whole tokens; and, for a kind with MaxRunningPerSession, no entry of a session whose
// slots are all held (sessionSlots: those the claim takes count as it takes them). A claim
// takes what fn takes, so it returns fewer tasks rather than break a limit.
//
// Cost: reading the policies (one entry per kind with a policy) and, for each limited kind
// the claim may take, its leases under MaxRunning (at most MaxRunning entries). A claim of
// chosen kinds then merges their due indexes as before. A claim of every kind uses the due
// index when no policy limits a kind below the claim's limit; otherwise it merges the due
// indexes of the kinds that have pending or running tasks (read from the counts, one entry
// per kind and state), so a paused or saturated kind's backlog is never read: O(kinds +
// limit·log n). A kind with MaxRunningPerSession adds the read of its tasks under unexpired
// leases with their sessions (LeaseSessions), the record of each due entry it walks (for its
// session), and the due entries of sessions at their limit, which the walk steps over.
func gatedScan(tx txn, kinds []string, at int64, fn func(projection.IndexEntry) bool) error {
	pols, err := policiesOf(tx)
	if err != nil {
		return err
	}
	if len(pols) == 0 {
		if kinds == nil {
			return tx.ScanIndex(projection.IndexDue, "", math.MinInt64, at, fn)
		}
		return scanKinds(tx, kinds, at, fn)
	}
	allow := make(map[string]int, len(pols))
	perSession := map[string]*sessionSlots{}
	for k, p := range pols {
		n, err := allowance(tx, p, at)
		if err != nil {
			return err
		}
		if n != unlimited {
			allow[k] = n
		}
		if p.MaxRunningPerSession > 0 && n > 0 {
			if perSession[k], err = heldBySession(tx, p, at); err != nil {
				return err
			}
		}
	}
	if kinds == nil {
		if len(allow) == 0 && len(perSession) == 0 {
			return tx.ScanIndex(projection.IndexDue, "", math.MinInt64, at, fn)
		}
		if kinds, err = kindsWithWork(tx); err != nil {
			return err
		}
	}
	open := kinds[:0:0]
	for _, k := range kinds {
		if n, ok := allow[k]; !ok || n > 0 {
			open = append(open, k)
		}
	}
	return mergeScansOf(open, func(kind string, maxAt int64, fn func(projection.IndexEntry) bool) error {
		n, ok := allow[kind]
		ss := perSession[kind]
		if !ok && ss == nil {
			return tx.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, maxAt, fn)
		}
		if !ok {
			n = unlimited
		}
		taken := 0
		var terr error
		err := tx.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, maxAt, func(e projection.IndexEntry) bool {
			if ss != nil {
				var free bool
				if free, terr = ss.take(tx, e.ID); terr != nil {
					return false
				}
				if !free {
					return true // its session's slots are all held: step over it
				}
			}
			taken++
			return fn(e) && taken < n
		})
		if err != nil {
			return err
		}
		return terr
	}, at, fn)
}

// sessionSlots is a kind's MaxRunningPerSession at a claim's now: the slots each session
// holds (its tasks of the kind under leases that expire after now), and those the claim
// takes as it takes them.
type sessionSlots struct {
	max  int64
	held map[string]int64
}

// heldBySession counts p's kind's tasks under unexpired leases at at, per session.
func heldBySession(r projection.Reader, p *projection.KindPolicy, at int64) (*sessionSlots, error) {
	ss := &sessionSlots{max: p.MaxRunningPerSession, held: map[string]int64{}}
	err := projection.LeaseSessions(r, p.Kind, at, func(session string, _ int64) bool {
		ss.held[session]++
		return true
	})
	return ss, err
}

// take reports whether the session of task id has a free slot, and if so counts the claim's
// taking of it. A claim's scan gives fn an entry only after it has taken the one before
// (mergeScansOf pulls a kind's next entry once its head is taken), so counting at the
// step is counting what the claim takes.
func (ss *sessionSlots) take(r projection.Reader, id string) (bool, error) {
	t, err := r.Task(id)
	if err != nil {
		return false, err
	}
	if t == nil {
		return false, fmt.Errorf("work: the due index names task %s, which has no record", id)
	}
	if ss.held[t.SessionID] >= ss.max {
		return false, nil
	}
	ss.held[t.SessionID]++
	return true, nil
}

// kindsWithWork lists the kinds with pending or running tasks: those whose due index may
// hold an entry.
func kindsWithWork(r projection.Reader) ([]string, error) {
	var out []string
	err := r.Counts(func(kind string, st events.TaskState, n int64) bool {
		if n > 0 && (st == events.StatePending || st == events.StateRunning) {
			if len(out) == 0 || out[len(out)-1] != kind {
				out = append(out, kind)
			}
		}
		return true
	})
	return distinct(out), err
}

// KindPolicyStats is one kind's policy as QueueStats shows it, at the stats' At.
type KindPolicyStats struct {
	Kind    string
	Policy  KindPolicy
	Running int     // slots in use: the kind's tasks under leases unexpired at At (counted only with MaxRunning > 0)
	Tokens  float64 // the rate's bucket at At (claims it allows now, fractions included); 0 without a rate
	// RunningBySession: the slots in use per session (its tasks of the kind under leases
	// unexpired at At), for the sessions that hold any; counted only with
	// MaxRunningPerSession > 0 (nil otherwise).
	RunningBySession map[string]int `json:",omitempty"`
}

// policyStats reads every policy with its slots in use and its bucket at at.
func policyStats(r projection.Reader, at int64) (ps []KindPolicyStats, paused []string, err error) {
	err = r.KindPolicies(func(p *projection.KindPolicy) bool {
		s := KindPolicyStats{Kind: p.Kind, Policy: policyFrom(p)}
		if p.MaxRunning > 0 {
			var held int64
			if held, err = leasesHeld(r, p.Kind, at, math.MaxInt64); err != nil {
				return false
			}
			s.Running = int(held)
		}
		if p.MaxRunningPerSession > 0 {
			err = projection.LeaseSessions(r, p.Kind, at, func(session string, _ int64) bool {
				if s.RunningBySession == nil {
					s.RunningBySession = map[string]int{}
				}
				s.RunningBySession[session]++
				return true
			})
			if err != nil {
				return false
			}
		}
		if p.Rate > 0 {
			s.Tokens = p.TokensNow(at)
		}
		if p.Paused {
			paused = append(paused, p.Kind)
		}
		ps = append(ps, s)
		return true
	})
	return ps, paused, err
}
