package work

import (
	"context"
	"math"

	"github.com/worklog/worklog/projection"
)

// waitTasks is WaitTasks under the kind policies. Without a policy it is the due index's (or
// each kind's) earliest entry, as before. With policies each kind counts from the moment its
// policy would let a claim take a task, at the waiter's now:
//
//   - a paused kind never (until a signal: a kind_policy_set lifts it);
//   - a kind whose MaxRunning slots are all held under unexpired leases from the earliest of
//     those leases' expiries, and at a settle or a release of any task (sigSlots, which
//     only such waiters listen to, so a settle does not wake every waiter);
//   - a kind whose bucket holds less than one token from the moment it will hold one
//     (KindPolicy.NextTokenAt);
//
// and not before its earliest due entry. A kind with MaxRunningPerSession counts from the
// earliest due entry of a session with a free slot, from the earliest lease expiry of a
// session whose slots are all held, and at a settle or a release (sigSlots):
// earliestPerSession. The waiter's timer is the least of these, so a
// waiter on a paused or saturated kind blocks without spinning, and wakes when a slot frees,
// the pause lifts or the rate allows the next claim. A claim by another worker can still
// take the slot first: the waiter then finds nothing and waits again, on the new state.
func (b *logBackend) waitTasks(ctx context.Context, kinds []string) error {
	return b.waitAt(ctx, sigTasks, func(r projection.Reader, now int64, first func(projection.IndexEntry) bool) (uint8, error) {
		// The next tick of a schedule of these kinds: a claim then submits its task (§4.6).
		if err := nextTickOf(r, kinds, now, first); err != nil {
			return 0, err
		}
		pols, err := policiesOf(r)
		if err != nil {
			return 0, err
		}
		if len(pols) == 0 {
			if len(kinds) == 0 {
				return 0, earliestDue(func(maxAt int64, fn func(projection.IndexEntry) bool) error {
					return r.ScanIndex(projection.IndexDue, "", math.MinInt64, maxAt, fn)
				}, first)
			}
			for _, k := range kinds {
				if err := earliestKind(r, k, first); err != nil {
					return 0, err
				}
			}
			return 0, nil
		}
		if len(kinds) == 0 {
			if kinds, err = kindsWithWork(r); err != nil {
				return 0, err
			}
		}
		var also uint8
		for _, k := range kinds {
			p := pols[k]
			if p == nil {
				if err := earliestKind(r, k, first); err != nil {
					return 0, err
				}
				continue
			}
			from, slots, ok, err := claimableFrom(r, p, now)
			if err != nil {
				return 0, err
			}
			if slots {
				also |= sigSlots
			}
			if !ok {
				continue
			}
			later := func(e projection.IndexEntry) bool {
				e.At = max(e.At, from)
				return first(e)
			}
			if p.MaxRunningPerSession > 0 {
				also |= sigSlots
				err = earliestPerSession(r, p, now, later)
			} else {
				err = earliestKind(r, k, later)
			}
			if err != nil {
				return 0, err
			}
		}
		return also, nil
	})
}

func earliestKind(r projection.Reader, kind string, first func(projection.IndexEntry) bool) error {
	return earliestDue(func(maxAt int64, fn func(projection.IndexEntry) bool) error {
		return r.ScanIndex(projection.IndexKindDue, kind, math.MinInt64, maxAt, fn)
	}, first)
}

// claimableFrom is the first moment at or after now from which p lets a claim take a task of
// its kind, as far as the state at now tells (ok false: never, while paused); slots says the
// kind's MaxRunning holds it back (a settle or release may free a slot sooner).
func claimableFrom(r projection.Reader, p *projection.KindPolicy, now int64) (from int64, slots, ok bool, err error) {
	if p.Paused {
		return 0, false, false, nil
	}
	from = now
	if p.MaxRunning > 0 {
		var held int64
		expiry := int64(math.MaxInt64)
		err := projection.ScanLeases(r, p.Kind, now, func(e projection.IndexEntry) bool {
			if held == 0 {
				expiry = e.At // the earliest: the index is in expiry order
			}
			held++
			return held < p.MaxRunning
		})
		if err != nil {
			return 0, false, false, err
		}
		if held >= p.MaxRunning {
			from, slots = expiry, true
		}
	}
	if p.Rate > 0 {
		from = max(from, p.NextTokenAt(now))
	}
	return from, slots, true, nil
}

// earliestPerSession calls first with what a waiter on p's kind (which has
// MaxRunningPerSession) waits for besides sigSlots: the earliest due entry of a session with
// a free slot at now, and, for each session whose slots are all held, its earliest lease's
// expiry (a lease that expires frees its slot with no signal). The walk steps over the due
// entries of the sessions at their limit, as a claim's does (gatedScan).
func earliestPerSession(r projection.Reader, p *projection.KindPolicy, now int64, first func(projection.IndexEntry) bool) error {
	held := map[string]int64{}
	expires := map[string]int64{} // each session's earliest lease expiry after now
	err := projection.LeaseSessions(r, p.Kind, now, func(session string, at int64) bool {
		if held[session] == 0 {
			expires[session] = at // the lease index is in expiry order
		}
		held[session]++
		return true
	})
	if err != nil {
		return err
	}
	for s, n := range held {
		if n >= p.MaxRunningPerSession {
			first(projection.IndexEntry{At: expires[s]})
		}
	}
	return earliestDue(func(maxAt int64, fn func(projection.IndexEntry) bool) error {
		var terr error
		err := r.ScanIndex(projection.IndexKindDue, p.Kind, math.MinInt64, maxAt, func(e projection.IndexEntry) bool {
			var t *projection.Task
			if t, terr = r.Task(e.ID); terr != nil || t == nil {
				return terr == nil // an entry without a record is the claim's to report
			}
			if held[t.SessionID] >= p.MaxRunningPerSession {
				return true
			}
			return fn(e)
		})
		if err != nil {
			return err
		}
		return terr
	}, first)
}
