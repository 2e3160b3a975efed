package work

import (
	"context"
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
// "max_running"; a negative, NaN or infinite Rate names "rate"; a Burst below 1 with a rate,
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
	return nil
}

func policyFrom(p *projection.KindPolicy) KindPolicy {
	return KindPolicy{Paused: p.Paused, MaxRunning: int(p.MaxRunning), Rate: p.Rate, Burst: int(p.Burst)}
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
			MaxRunning: int64(p.MaxRunning), Rate: p.Rate, Burst: int64(p.Burst)})
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
// its whole tokens. A claim takes what fn takes, so it returns fewer tasks rather than break
// a limit.
//
// Cost: reading the policies (one entry per kind with a policy) and, for each limited kind
// the claim may take, its leases under MaxRunning (at most MaxRunning entries). A claim of
// chosen kinds then merges their due indexes as before. A claim of every kind uses the due
// index when no policy limits a kind below the claim's limit; otherwise it merges the due
// indexes of the kinds that have pending or running tasks (read from the counts, one entry
// per kind and state), so a paused or saturated kind's backlog is never read: O(kinds +
// limit·log n).
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
	limited := false
	for k, p := range pols {
		n, err := allowance(tx, p, at)
		if err != nil {
			return err
		}
		if n != unlimited {
			allow[k] = n
			limited = true
		}
	}
	if kinds == nil {
		if !limited {
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
		if !ok {
			return tx.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, maxAt, fn)
		}
		taken := 0
		return tx.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, maxAt, func(e projection.IndexEntry) bool {
			taken++
			return fn(e) && taken < n
		})
	}, at, fn)
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
