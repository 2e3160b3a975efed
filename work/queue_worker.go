package work

import (
	"context"
	"slices"
	"time"

	"github.com/worklog/worklog/events"
)

// RunningBackend is what a Backend implements for the methods of part 2 of the API (lease
// extension, release, claims by kind, a session's task list and the queue's counts).
// worklog's own backends implement it; a custom Backend given to New that does not makes
// those methods fail with ErrBackend.
type RunningBackend interface {
	Extend(ctx context.Context, d TaskDelivery, leaseFor time.Duration, now time.Time) (TaskDelivery, error)
	Release(ctx context.Context, d TaskDelivery, r ReleaseRequest, now time.Time) (Task, error)
	ClaimKinds(ctx context.Context, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error)
	Tasks(ctx context.Context, sessionID string, f TaskFilter) ([]Task, error)
	Stats(ctx context.Context, now time.Time) (QueueStats, error)
	SettleAndClaim(ctx context.Context, settles []Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]SettleResult, []TaskDelivery, error)
}

// running is the backend's RunningBackend, or the ErrBackend error naming it.
func (q *Queue) running() (RunningBackend, error) {
	if q.caps.running == nil {
		return nil, unsupported("this method", "RunningBackend")
	}
	return q.caps.running, nil
}

// ReleaseRequest gives a claimed task back (Queue.Release).
type ReleaseRequest struct {
	RunAt  time.Time // zero or not after now: eligible at once
	Reason string    // optional; recorded in the log (e.g. the error that made the worker give up)
}

// MaxReasonBytes is the longest ReleaseRequest.Reason accepted: the limit the event codec
// checks when it decodes a task_released event.
const MaxReasonBytes = events.MaxReleaseReason

// TaskFilter selects a session's tasks (Session.Tasks).
type TaskFilter struct {
	States []TaskState // empty: every state
	// Phases, when not empty, lists only the pending tasks in one of these phases at the
	// listing's time (Task.PhaseAt), with the tasks of States' other states: States
	// {TaskPending} with Phases {PhaseRetrying} lists the tasks waiting for a retry.
	Phases []Phase
	Kinds  []string // empty: every kind
	After  string   // a task id: list only tasks submitted after it (cursor); "" from the first
	Limit  int      // at most this many; must be > 0
}

// StateCounts is a number of tasks in each state.
type StateCounts struct {
	Pending, Running, Succeeded, Failed, Canceled int64
}

// KindStats is the number of tasks of one kind in each state.
type KindStats struct {
	Kind string
	StateCounts
}

// QueueStats describes a queue's tasks at one time (Queue.Stats), for dashboards and
// metrics. The counts are kept by the fold as tasks change state; they are not a scan.
type QueueStats struct {
	At     time.Time   // the time the due figures are for
	Total  StateCounts // every task, by state
	Kinds  []KindStats // by kind, in kind order; kinds with no tasks are left out
	DueNow int64       // tasks claimable at At: pending and scheduled at or before At, or running with an expired lease
	// OldestDueAt is when the task that has waited longest among those due became eligible
	// (its ScheduledAt or its lease expiry); zero when nothing is due.
	OldestDueAt time.Time
	// OldestDueAge is At minus OldestDueAt; zero when nothing is due.
	OldestDueAge time.Duration
	// Policies are the kinds with a policy (Queue.SetKindPolicy), in kind order, with their
	// slots in use and their rate's bucket at At; PausedKinds the paused ones among them.
	Policies    []KindPolicyStats
	PausedKinds []string
}

// Extend extends a claim's lease at the queue's clock's time (a heartbeat).
func (q *Queue) Extend(ctx context.Context, d TaskDelivery, leaseFor time.Duration) (TaskDelivery, error) {
	return q.ExtendAt(ctx, d, leaseFor, q.now())
}

// ExtendAt makes the lease of delivery d expire at exactly now+leaseFor (earlier or later
// than before); the task is claimable again from then, in the claim order of ClaimDue. The
// delivery must own the claim (the task running, same attempt and token), else
// ErrStaleDelivery, a settled task included; as with Finish, expiry is not checked: only a
// re-claim fences a late worker. It returns the same delivery with the new LeaseExpiresAt and
// the current task, so a worker sees Task.CancelRequestedAt on its heartbeat.
func (q *Queue) ExtendAt(ctx context.Context, d TaskDelivery, leaseFor time.Duration, now time.Time) (TaskDelivery, error) {
	if err := q.begin(ctx); err != nil {
		return TaskDelivery{}, err
	}
	if leaseFor <= 0 {
		return TaskDelivery{}, invalid("lease_for", "must be positive")
	}
	if err := validateNonBlank("task_id", d.Task.ID); err != nil {
		return TaskDelivery{}, err
	}
	n, err := nanos("now", now)
	if err != nil {
		return TaskDelivery{}, err
	}
	if _, err := leaseExpiry(n, leaseFor); err != nil {
		return TaskDelivery{}, err
	}
	rb, rerr := q.running()
	if rerr != nil {
		return TaskDelivery{}, rerr
	}
	out, berr := rb.Extend(ctx, d, leaseFor, now)
	return out, wrap(berr)
}

// Release gives a claimed task back at the queue's clock's time.
func (q *Queue) Release(ctx context.Context, d TaskDelivery, r ReleaseRequest) (Task, error) {
	return q.ReleaseAt(ctx, d, r, q.now())
}

// ReleaseAt makes the task of delivery d pending again, with no claim, scheduled at r.RunAt
// when that is after now, else at now; its attempts are unchanged (the next claim is attempt
// Attempts+1), and so are its kind, input, key and wake policy. If a cancel was requested,
// the task is settled as canceled at now instead (with its completion wake when it has
// WakeOnCompletion), as a cancel of pending work is. The delivery must own the claim, else
// ErrStaleDelivery: a repeated Release with the same delivery is stale, the lease is gone.
func (q *Queue) ReleaseAt(ctx context.Context, d TaskDelivery, r ReleaseRequest, now time.Time) (Task, error) {
	if err := q.begin(ctx); err != nil {
		return Task{}, err
	}
	if err := validateNonBlank("task_id", d.Task.ID); err != nil {
		return Task{}, err
	}
	if err := validateRelease(&r); err != nil {
		return Task{}, err
	}
	if _, err := nanos("now", now); err != nil {
		return Task{}, err
	}
	rb, rerr := q.running()
	if rerr != nil {
		return Task{}, rerr
	}
	t, err := rb.Release(ctx, d, r, now)
	return t, wrap(err)
}

// ClaimKinds claims due work of the given kinds at the queue's clock's time.
func (q *Queue) ClaimKinds(ctx context.Context, kinds []string, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	return q.ClaimKindsAt(ctx, kinds, q.now(), leaseFor, limit)
}

// ClaimKindsAt is ClaimDueAt restricted to tasks whose Kind is one of kinds, in the same
// claim order among them. Its cost does not depend on the due tasks of other kinds:
// O(limit · log n + len(kinds)).
func (q *Queue) ClaimKindsAt(ctx context.Context, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]TaskDelivery, error) {
	if err := q.begin(ctx); err != nil {
		return nil, err
	}
	if len(kinds) == 0 {
		return nil, invalid("kinds", "must name at least one kind")
	}
	for _, k := range kinds {
		if err := validateNonBlank("kind", k); err != nil {
			return nil, err
		}
	}
	if err := validateClaim(leaseFor, limit); err != nil {
		return nil, err
	}
	if err := validateWorker(ctx); err != nil {
		return nil, err
	}
	rb, rerr := q.running()
	if rerr != nil {
		return nil, rerr
	}
	d, err := rb.ClaimKinds(ctx, kinds, now, leaseFor, limit)
	return d, wrap(err)
}

// Stats reports the queue's counts at the queue's clock's time.
func (q *Queue) Stats(ctx context.Context) (QueueStats, error) {
	return q.StatsAt(ctx, q.now())
}

// StatsAt reports the number of tasks by state and kind, the number due at now and the age
// of the oldest due task.
func (q *Queue) StatsAt(ctx context.Context, now time.Time) (QueueStats, error) {
	if err := q.begin(ctx); err != nil {
		return QueueStats{}, err
	}
	if _, err := nanos("now", now); err != nil {
		return QueueStats{}, err
	}
	rb, rerr := q.running()
	if rerr != nil {
		return QueueStats{}, rerr
	}
	s, err := rb.Stats(ctx, now)
	return s, wrap(err)
}

// Tasks lists this session's tasks in submission order, filtered by f: only the given states
// and kinds (empty: all), after the task f.After (a cursor: the last id of the previous page),
// at most f.Limit of them. Its cost is proportional to the tasks it returns and skips in this
// session, never to other sessions. An After that is not one of this session's tasks is
// ErrTaskNotFound.
func (s *Session) Tasks(ctx context.Context, f TaskFilter) ([]Task, error) {
	if err := s.q.begin(ctx); err != nil {
		return nil, err
	}
	if err := validateNonBlank("session_id", s.id); err != nil {
		return nil, err
	}
	if f.Limit <= 0 {
		return nil, invalid("limit", "must be positive")
	}
	for _, k := range f.Kinds {
		if err := validateNonBlank("kind", k); err != nil {
			return nil, err
		}
	}
	for _, st := range f.States {
		if st < TaskPending || st > TaskCanceled {
			return nil, invalid("states", "names an unknown task state")
		}
	}
	for _, p := range f.Phases {
		if !validPhase(p) {
			return nil, invalid("phases", "names an unknown phase: "+string(p))
		}
	}
	rb, rerr := s.q.running()
	if rerr != nil {
		return nil, rerr
	}
	if len(f.Phases) == 0 {
		ts, err := rb.Tasks(ctx, s.id, f)
		return ts, wrap(err)
	}
	return s.tasksInPhases(ctx, rb, f, s.q.now())
}

// tasksInPhases is Tasks with f.Phases: a phase is derived from a time, so no backend
// indexes it; the session's tasks are read page after page, in the listing's order, and
// the pending ones outside the phases passed over until Limit tasks are found.
func (s *Session) tasksInPhases(ctx context.Context, rb RunningBackend, f TaskFilter, now time.Time) ([]Task, error) {
	var out []Task
	page := f
	page.Phases = nil
	for {
		ts, err := rb.Tasks(ctx, s.id, page)
		if err != nil {
			return nil, wrap(err)
		}
		for _, t := range ts {
			if t.State == TaskPending && !slices.Contains(f.Phases, t.PhaseAt(now)) {
				continue
			}
			out = append(out, t)
			if len(out) == f.Limit {
				return out, nil
			}
		}
		if len(ts) < page.Limit {
			return out, nil
		}
		page.After = ts[len(ts)-1].ID
	}
}

// Settle is one finished delivery for SettleAndClaim: exactly one of Outcome and Release.
type Settle struct {
	Delivery TaskDelivery
	Outcome  *Outcome        // settle the task with this outcome, as FinishAt
	Release  *ReleaseRequest // or give it back, as ReleaseAt
}

// SettleResult is what one Settle did: the task afterwards, or the error FinishAt or
// ReleaseAt would have returned for it.
type SettleResult struct {
	Task Task
	Err  error
	// Seq is the sequence number of the event the settle appended to record its result:
	// the task_settled of an Outcome, the task_released of a Release. It is 0 when the
	// settle recorded no result: Err is set (a rejected settle reports 0, even when the log
	// records the rejection as a task_settle_rejected event), or the settle repeated one
	// already recorded (the same delivery settled again with the same outcome, or a round
	// run again after the shared writer's answer was lost) and appended nothing. worklog's
	// backends fill it; a custom Backend's SettleAndClaim may leave it 0.
	Seq uint64
}

// SettleAndClaim settles and claims at the queue's clock's time.
func (q *Queue) SettleAndClaim(ctx context.Context, settles []Settle, kinds []string, leaseFor time.Duration, limit int) ([]SettleResult, []TaskDelivery, error) {
	return q.SettleAndClaimAt(ctx, settles, kinds, q.now(), leaseFor, limit)
}

// SettleAndClaimAt settles each of settles as FinishAt or ReleaseAt would, each on its own
// (a stale delivery fails only its own result), and then claims up to limit due tasks, of
// kinds when kinds is not empty (as ClaimKindsAt, else as ClaimDueAt; nothing when limit is
// 0), all in one atomic, durable step: one fsync for a worker's whole round. The error is for
// the call as a whole (validation of kinds, leaseFor or limit, storage); an invalid Settle
// is reported in its own result.
func (q *Queue) SettleAndClaimAt(ctx context.Context, settles []Settle, kinds []string, now time.Time, leaseFor time.Duration, limit int) ([]SettleResult, []TaskDelivery, error) {
	if err := q.begin(ctx); err != nil {
		return nil, nil, err
	}
	for _, k := range kinds {
		if err := validateNonBlank("kind", k); err != nil {
			return nil, nil, err
		}
	}
	if limit < 0 {
		return nil, nil, invalid("limit", "must not be negative")
	}
	if limit > 0 && leaseFor <= 0 {
		return nil, nil, invalid("lease_for", "must be positive")
	}
	if _, err := nanos("now", now); err != nil {
		return nil, nil, err
	}
	if err := validateWorker(ctx); err != nil {
		return nil, nil, err
	}
	rb, rerr := q.running()
	if rerr != nil {
		return nil, nil, rerr
	}
	res, d, err := rb.SettleAndClaim(ctx, settles, kinds, now, leaseFor, limit)
	return res, d, wrap(err)
}
