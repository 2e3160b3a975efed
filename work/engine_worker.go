package work

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"iter"
	"math"
	"slices"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// The decide code of part 2 of the API (Extend, Release, ClaimKinds, Tasks, Stats,
// SettleAndClaim), shared by every engine like engine.go's, and built from its pieces: a
// delivery owns its task under the one rule Finish checks (projection.Task.OwnedBy), claims
// go through the one claim loop (claimIn, claimTask), and a task that ends records its
// completion wake in one place (settled).

var _ RunningBackend = (*logBackend)(nil)

// ownedTask reads the task of delivery d for a command of its claim's holder (Extend,
// Release): ErrTaskNotFound when there is none, ErrStaleDelivery unless d owns the claim
// (Task.OwnedBy: running, same attempt, same token), a settled task included. Unlike a stale
// Finish, nothing is recorded: a heartbeat or release that lost its claim changes nothing,
// so a late worker's retries cannot grow the log.
func ownedTask(tx txn, d TaskDelivery) (*projection.Task, error, error) {
	t, err := tx.Task(d.Task.ID)
	if err != nil {
		return nil, nil, err
	}
	if t == nil {
		return nil, notFound(d.Task.ID), nil
	}
	if !t.OwnedBy(d.Attempt, d.LeaseToken()) {
		return nil, stale(t.ID), nil
	}
	return t, nil, nil
}

func (b *logBackend) Extend(ctx context.Context, d TaskDelivery, leaseFor time.Duration, now time.Time) (TaskDelivery, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return TaskDelivery{}, verr
	}
	expires, verr := leaseExpiry(at, leaseFor)
	if verr != nil {
		return TaskDelivery{}, verr
	}
	var out TaskDelivery
	var derr error
	err := b.update(ctx, func(tx txn) error {
		out, derr = TaskDelivery{}, nil // fn may run twice (engine.update)
		t, de, err := ownedTask(tx, d)
		if err != nil || de != nil {
			derr = de
			return err
		}
		// The token is not written again: the attempt names the claim, and the fold accepts
		// the event only from the attempt that holds it (Task.HeldBy).
		if err := tx.Append(&events.TaskExtended{
			Header: events.Header{SessionID: t.SessionID, At: at},
			TaskID: t.ID, Attempt: d.Attempt, LeaseExpiresAt: expires,
		}); err != nil {
			return err
		}
		if t, err = mustTask(tx, t.ID); err != nil {
			return err
		}
		out = NewTaskDelivery(b.taskSnapshot(t), d.Attempt, fromNanos(expires), d.LeaseToken())
		return nil
	})
	return result(out, derr, err)
}

// validateRelease checks a ReleaseRequest (ReleaseAt, and each release of SettleAndClaim).
func validateRelease(r *ReleaseRequest) *Error {
	if !r.RunAt.IsZero() {
		if _, err := nanos("run_at", r.RunAt); err != nil {
			return err
		}
	}
	if len(r.Reason) > MaxReasonBytes {
		return invalid("reason", "is longer than 64 KiB")
	}
	return nil
}

// releaseAt is when a release at at makes the task eligible: r.RunAt when that is after at,
// else at. r is valid (validateRelease).
func releaseAt(r *ReleaseRequest, at int64) int64 {
	if r.RunAt.IsZero() {
		return at
	}
	return max(r.RunAt.UnixNano(), at)
}

func (b *logBackend) Release(ctx context.Context, d TaskDelivery, r ReleaseRequest, now time.Time) (Task, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return Task{}, verr
	}
	// A release of work whose cancel was requested ends it, and then its policy may ask for
	// a completion wake: its id is drawn before the command is queued.
	wakeID, idErr := b.ids.id("wake", at)
	if idErr != nil {
		return Task{}, backendErr(idErr)
	}
	var res SettleResult
	err := b.update(ctx, func(tx txn) error {
		var err error
		res, err = b.releaseIn(tx, d, &r, wakeID, at) // fn may run twice: both set afresh
		return err
	})
	return result(res.Task, res.Err, err)
}

// releaseIn decides a Release inside a command (Release, SettleAndClaim), as finishIn does a
// Finish: Seq is the task_released event's.
func (b *logBackend) releaseIn(tx txn, d TaskDelivery, r *ReleaseRequest, wakeID string, at int64) (SettleResult, error) {
	t, derr, err := ownedTask(tx, d)
	if err != nil || derr != nil {
		return SettleResult{Err: derr}, err
	}
	ev := &events.TaskReleased{
		Header: events.Header{SessionID: t.SessionID, At: at},
		TaskID: t.ID, Attempt: d.Attempt, RunAt: releaseAt(r, at), Reason: r.Reason,
	}
	if err := tx.Append(ev); err != nil { // Append sets ev.Seq
		return SettleResult{}, err
	}
	// Pending again; or, if a cancel was requested, canceled, with its completion wake.
	return b.settledBy(tx, t.ID, ev.Seq, wakeID, at)
}

// releaseAgainIn decides a release whose forwarded round's answer was lost (forwardRound):
// the round may have committed it, and a release, unlike a finish, leaves no token behind.
// A delivery of attempt N whose task is no longer claimed, still at N attempts, not settled
// with its token and not retried since, was released: only the holder of attempt N's token
// ends its claim so (an expired lease keeps the claim until the next claim, attempt N+1), and
// the answer is the task as it is. A task claimed again since (more attempts) may have been
// released first or have lost its lease: that is not known, and it is said (ErrBackend),
// with no rejection recorded. Anything else is releaseIn's. A release found committed has
// Seq 0: this command appended nothing.
func (b *logBackend) releaseAgainIn(tx txn, d TaskDelivery, r *ReleaseRequest, wakeID string, at int64) (SettleResult, error) {
	t, err := tx.Task(d.Task.ID)
	if err != nil || t == nil || t.OwnedBy(d.Attempt, d.LeaseToken()) || t.AttemptsAtRetry >= d.Attempt {
		return b.releaseIn(tx, d, r, wakeID, at)
	}
	switch {
	case t.Attempts == d.Attempt && !t.Claimed() && t.SettledToken != d.LeaseToken():
		return SettleResult{Task: b.taskSnapshot(t)}, nil
	case t.Attempts > d.Attempt:
		return SettleResult{Err: backendErr(fmt.Errorf("task %s: the release of attempt %d was sent to the shared writer and its answer lost; "+
			"the task has been claimed again since (attempt %d): whether the release committed first is unknown", t.ID, d.Attempt, t.Attempts))}, nil
	}
	return b.releaseIn(tx, d, r, wakeID, at)
}

func (b *logBackend) ClaimKinds(ctx context.Context, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	if claimed, err, ok := b.forwardClaim(ctx, kinds, now, leaseFor, limit); ok {
		return claimed, err
	}
	return claim(ctx, b, now, leaseFor, limit, kindsScan(kinds), "lease", b.claimTask)
}

// distinct returns kinds without repeats, in their first order: a kind named twice would
// give its entries twice to the merge, and a claim would take a task twice.
func distinct(kinds []string) []string {
	if len(kinds) < 2 {
		return kinds
	}
	seen := make(map[string]struct{}, len(kinds))
	out := make([]string, 0, len(kinds))
	for _, k := range kinds {
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	return out
}

// scanKinds calls fn with the due entries (At <= maxAt) of kinds, distinct, in the due
// index's order (priority descending, then At, then Seq: ClaimDue's claim order), until fn returns false. It is a k-way
// merge of each kind's own index (projection.IndexKindDue), each pulled one entry at a time
// (iter.Pull over the push scan), under a heap of the kinds' next entries: it reads one entry
// per kind to start and one more per entry fn takes, so a claim of limit tasks costs
// O(limit·log n + len(kinds)) index reads (plus a log of len(kinds) per step), whatever the
// due tasks of other kinds. fn must not change the indexes (claimIn collects, then claims).
func scanKinds(r projection.Reader, kinds []string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return mergeScans(r, projection.IndexKindDue, kinds, maxAt, fn)
}

// mergeScans is scanKinds over the partitions names of any partitioned index of r (a kind's
// due index, a session's available wakes).
func mergeScans(r projection.Reader, ix projection.Index, names []string, maxAt int64, fn func(projection.IndexEntry) bool) error {
	return mergeScansOf(names, func(name string, maxAt int64, fn func(projection.IndexEntry) bool) error {
		return r.ScanIndex(ix, name, math.MinInt64, maxAt, fn)
	}, maxAt, fn)
}

// mergeScansOf is mergeScans over the partitions scanOne reads (gatedScan cuts each kind's
// scan at its allowance).
func mergeScansOf(names []string, scanOne func(name string, maxAt int64, fn func(projection.IndexEntry) bool) error, maxAt int64, fn func(projection.IndexEntry) bool) (err error) {
	kinds := names
	if len(kinds) == 1 {
		return scanOne(kinds[0], maxAt, fn)
	}
	all := make([]*kindCursor, 0, len(kinds))
	defer func() {
		for _, c := range all {
			c.stop()
			if err == nil {
				err = c.err
			}
		}
	}()
	h := make(cursorHeap, 0, len(kinds))
	for _, k := range kinds {
		c := &kindCursor{}
		c.next, c.stop = iter.Pull(func(yield func(projection.IndexEntry) bool) {
			c.err = scanOne(k, maxAt, yield)
		})
		all = append(all, c)
		if c.advance() {
			h = append(h, c)
		} else if c.err != nil {
			return c.err
		}
	}
	heap.Init(&h)
	for len(h) > 0 {
		c := h[0]
		if !fn(c.head) {
			return nil
		}
		if c.advance() {
			heap.Fix(&h, 0)
		} else {
			if c.err != nil {
				return c.err
			}
			heap.Pop(&h)
		}
	}
	return nil
}

// kindCursor is one kind's scan in scanKinds: its next entry (head) and the pull iterator.
type kindCursor struct {
	head projection.IndexEntry
	next func() (projection.IndexEntry, bool)
	stop func()
	err  error // the scan's error, once it has returned
}

// advance moves to the kind's next entry and reports whether there is one.
func (c *kindCursor) advance() bool {
	e, ok := c.next()
	c.head = e
	return ok
}

// cursorHeap orders the cursors by their heads, least first (container/heap).
type cursorHeap []*kindCursor

func (h cursorHeap) Len() int           { return len(h) }
func (h cursorHeap) Less(i, j int) bool { return h[i].head.Less(h[j].head) }
func (h cursorHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *cursorHeap) Push(x any)        { *h = append(*h, x.(*kindCursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// Tasks walks the session's task list from the After task's submission (binary search in
// the list), reads each task and keeps those the filter takes, until Limit: its cost is the
// tasks it returns and skips in this session.
func (b *logBackend) Tasks(ctx context.Context, sessionID string, f TaskFilter) ([]Task, error) {
	var states uint8 // a bit per state; 0: every state
	for _, st := range f.States {
		states |= 1 << st
	}
	var out []Task
	var derr error
	err := b.eng.View(ctx, func(r projection.Reader) error {
		out, derr = nil, nil
		var after uint64
		if f.After != "" {
			t, err := r.Task(f.After)
			if err != nil {
				return err
			}
			if t == nil || t.SessionID != sessionID {
				derr = notFound(f.After)
				return nil
			}
			after = t.SubmitSeq
		}
		var readErr error
		err := r.ScanSessionTasks(sessionID, after, func(_ uint64, id string) bool {
			t, err := mustTask(r, id)
			if err != nil {
				readErr = err
				return false
			}
			if states != 0 && states&(1<<t.State) == 0 || len(f.Kinds) > 0 && !slices.Contains(f.Kinds, t.Kind) {
				return true
			}
			out = append(out, b.taskSnapshotOf(t, true))
			return len(out) < f.Limit
		})
		if err != nil {
			return err
		}
		return readErr
	})
	return result(out, derr, err)
}

// Stats reads the counts the fold keeps (Reader.Counts: one entry per kind and state, no
// record read) and walks the due index up to now for DueNow and OldestDueAt: that walk costs
// one index entry per task due now (the backlog a dashboard shows), and nothing for tasks
// scheduled later or running under live leases. A Reader that counts them itself
// (projection.DueSummarizer: PostgreSQL's, in one statement) is asked instead.
func (b *logBackend) Stats(ctx context.Context, now time.Time) (QueueStats, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return QueueStats{}, verr
	}
	var out QueueStats
	err := b.eng.View(ctx, func(r projection.Reader) error {
		out = QueueStats{At: fromNanos(at)}
		err := r.Counts(func(kind string, st events.TaskState, n int64) bool {
			if i := len(out.Kinds) - 1; i < 0 || out.Kinds[i].Kind != kind {
				out.Kinds = append(out.Kinds, KindStats{Kind: kind})
			}
			out.Kinds[len(out.Kinds)-1].add(st, n)
			out.Total.add(st, n)
			return true
		})
		if err != nil {
			return err
		}
		// A reader may give a kind's states apart; merge them, in kind order.
		slices.SortStableFunc(out.Kinds, func(a, b KindStats) int { return cmp.Compare(a.Kind, b.Kind) })
		out.Kinds = mergeKinds(out.Kinds)
		if out.Policies, out.PausedKinds, err = policyStats(r, at); err != nil {
			return err
		}
		if ds, ok := r.(projection.DueSummarizer); ok {
			n, oldest, err := ds.DueSummary(at)
			if err != nil || n == 0 {
				return err
			}
			out.DueNow, out.OldestDueAt, out.OldestDueAge = n, fromNanos(oldest), age(at, oldest)
			return nil
		}
		// The scan is in claim order (priority first): the oldest is the least At of all.
		return r.ScanIndex(projection.IndexDue, "", math.MinInt64, at, func(e projection.IndexEntry) bool {
			if out.DueNow == 0 || e.At < out.OldestDueAt.UnixNano() {
				out.OldestDueAt, out.OldestDueAge = fromNanos(e.At), age(at, e.At)
			}
			out.DueNow++
			return true
		})
	})
	if err != nil {
		return QueueStats{}, backendErr(err)
	}
	return out, nil
}

func (c *StateCounts) add(st events.TaskState, n int64) {
	switch st {
	case events.StatePending:
		c.Pending += n
	case events.StateRunning:
		c.Running += n
	case events.StateSucceeded:
		c.Succeeded += n
	case events.StateFailed:
		c.Failed += n
	case events.StateCanceled:
		c.Canceled += n
	}
}

// mergeKinds merges adjacent entries of one kind (sorted by kind).
func mergeKinds(ks []KindStats) []KindStats {
	out := ks[:0]
	for _, k := range ks {
		if n := len(out); n > 0 && out[n-1].Kind == k.Kind {
			c := &out[n-1].StateCounts
			c.Pending += k.Pending
			c.Running += k.Running
			c.Succeeded += k.Succeeded
			c.Failed += k.Failed
			c.Canceled += k.Canceled
			continue
		}
		out = append(out, k)
	}
	return out
}

// age is now-since as a Duration, saturated at its maximum (the two may be ~584 years apart,
// beyond a Duration's range).
func age(now, since int64) time.Duration {
	if since < 0 && now > math.MaxInt64+since {
		return math.MaxInt64
	}
	return time.Duration(now - since)
}

// settlePlan is one Settle of SettleAndClaim, checked and prepared before the command: its
// validation error, or its outcome (a finish) or release, and the id of the completion wake
// it may record.
type settlePlan struct {
	err     error
	outcome events.Outcome
	release *ReleaseRequest
	wakeID  string
}

// planSettle validates s as FinishAt or ReleaseAt would (an invalid Settle fails only its own
// result) and draws its completion wake's id.
func (b *logBackend) planSettle(s *Settle, at int64, staged bool) settlePlan {
	if err := validateNonBlank("task_id", s.Delivery.Task.ID); err != nil {
		return settlePlan{err: err}
	}
	var p settlePlan
	switch {
	case (s.Outcome == nil) == (s.Release == nil):
		return settlePlan{err: invalid("outcome", "a settle needs exactly one of Outcome and Release")}
	case s.Outcome != nil:
		o := *s.Outcome
		if err := validateOutcome(&o, b.maxValue); err != nil {
			return settlePlan{err: err}
		}
		p.outcome = outcomeToOwned(o, staged)
	default:
		r := *s.Release
		if err := validateRelease(&r); err != nil {
			return settlePlan{err: err}
		}
		p.release = &r
	}
	id, err := b.ids.id("wake", at)
	if err != nil {
		return settlePlan{err: backendErr(err)}
	}
	p.wakeID = id
	return p
}

// SettleAndClaim runs, in one command, each settle as Finish or Release would (finishIn,
// releaseIn: a domain error goes to the settle's own result and the command goes on), then
// the claim loop of ClaimKinds (when kinds are given) or ClaimDue.
func (b *logBackend) SettleAndClaim(ctx context.Context, settles []Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]SettleResult, []TaskDelivery, error) {
	if res, claimed, err, ok := b.forwardRound(ctx, settles, kinds, now, leaseFor, limit); ok {
		return res, claimed, err
	}
	return b.settleAndClaimHere(ctx, settles, kinds, now, leaseFor, limit, false)
}

// settleAndClaimHere runs the round in this process's engine. again: the round was sent to
// the elected process and its answer lost (forwardRound), so its releases may have committed
// there (releaseAgainIn).
func (b *logBackend) settleAndClaimHere(ctx context.Context, settles []Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int, again bool) ([]SettleResult, []TaskDelivery, error) {
	at, verr := nanos("now", now)
	if verr != nil {
		return nil, nil, verr
	}
	var expires int64
	if limit > 0 {
		if expires, verr = leaseExpiry(at, leaseFor); verr != nil {
			return nil, nil, verr
		}
	}
	worker := workerOf(ctx)
	// Large outputs are staged (written to blob files) before the command, and then not
	// copied (ownValue); an invalid settle's staged output is simply never used.
	var outputs [][]byte // only large ones: a settle of small values allocates nothing here
	for i := range settles {
		if o := settles[i].Outcome; o != nil && o.State == TaskSucceeded && len(o.Output) >= stageMin && len(o.Output) <= b.maxValue {
			outputs = append(outputs, o.Output)
		}
	}
	release, staged, serr := b.stage(outputs...)
	if serr != nil {
		return nil, nil, serr
	}
	defer release()
	plans := make([]settlePlan, len(settles))
	for i := range settles {
		plans[i] = b.planSettle(&settles[i], at, staged)
	}
	scan := scanFunc(dueScan)
	if len(kinds) > 0 {
		scan = kindsScan(kinds)
	}
	results := make([]SettleResult, len(settles))
	var claimed []TaskDelivery
	err := b.update(ctx, func(tx txn) error {
		// fn may run twice (engine.update): every result and the claims are set afresh.
		claimed = claimed[:0]
		for i := range plans {
			p := &plans[i]
			var r SettleResult
			var err error
			switch {
			case p.err != nil:
				r.Err = p.err
			case p.release != nil && again:
				r, err = b.releaseAgainIn(tx, settles[i].Delivery, p.release, p.wakeID, at)
			case p.release != nil:
				r, err = b.releaseIn(tx, settles[i].Delivery, p.release, p.wakeID, at)
			default:
				r, err = b.finishIn(tx, settles[i].Delivery, p.outcome, p.wakeID, at)
			}
			if err != nil {
				return err
			}
			results[i] = r
		}
		if limit == 0 {
			return nil
		}
		var err error
		claimed, err = claimIn(tx, b, at, expires, worker, limit, scan, "lease", b.claimTask, claimed)
		return err
	})
	if err != nil {
		return nil, nil, backendErr(err)
	}
	return results, claimed, nil
}
