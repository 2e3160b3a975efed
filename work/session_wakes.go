package work

import (
	"context"
	"time"

	"github.com/worklog/worklog/projection"
)

// SessionWakeClaimer is implemented by a backend that can claim the wakes of chosen sessions
// (Queue.ClaimSessionWakes, which validates and then calls it). worklog's own backends
// implement it; over a custom Backend given to New that does not, the call fails with
// ErrBackend.
type SessionWakeClaimer interface {
	ClaimSessionWakes(ctx context.Context, sessions []string, now time.Time, leaseFor time.Duration, limit int) ([]WakeDelivery, error)
}

// ClaimSessionWakes claims wakes of the given sessions at the queue's clock's time.
func (q *Queue) ClaimSessionWakes(ctx context.Context, sessions []string, leaseFor time.Duration, limit int) ([]WakeDelivery, error) {
	return q.ClaimSessionWakesAt(ctx, sessions, q.now(), leaseFor, limit)
}

// ClaimSessionWakesAt is ClaimWakesAt restricted to the wakes of sessions: up to limit
// unacknowledged wakes of those sessions that are unclaimed or whose lease expired at now,
// in ClaimWakes' order among them (the order they became available, ties by creation
// order), each leased and fenced as ClaimWakes' are and recorded with the worker identity of
// ctx (WithWorker). Wakes of other sessions are left as they are. A session named twice
// counts once. Its cost is bounded by the chosen sessions' wakes, whatever other sessions
// hold: each session has its own index of available wakes, and the claim merges theirs.
//
// An empty sessions is ErrInvalidRequest naming "sessions"; a blank (or too long) session id
// in it names "session_id"; leaseFor and limit are checked as ClaimWakes checks them.
func (q *Queue) ClaimSessionWakesAt(ctx context.Context, sessions []string, now time.Time, leaseFor time.Duration, limit int) ([]WakeDelivery, error) {
	if err := q.begin(ctx); err != nil {
		return nil, err
	}
	if err := validateSessions(sessions); err != nil {
		return nil, err
	}
	if err := validateClaim(leaseFor, limit); err != nil {
		return nil, err
	}
	if err := validateWorker(ctx); err != nil {
		return nil, err
	}
	if q.caps.sessWakes == nil {
		return nil, unsupported("Queue.ClaimSessionWakes", "SessionWakeClaimer")
	}
	d, err := q.caps.sessWakes.ClaimSessionWakes(ctx, sessions, now, leaseFor, limit)
	return d, wrap(err)
}

// validateSessions checks the sessions of ClaimSessionWakes and WaitSessionWakes.
func validateSessions(sessions []string) error {
	if len(sessions) == 0 {
		return invalid("sessions", "must name at least one session")
	}
	for _, s := range sessions {
		if err := validateNonBlank("session_id", s); err != nil {
			return err
		}
	}
	return nil
}

// ClaimSessionWakes is ClaimWakes' claim over the merge of the sessions' own available-wake
// indexes (projection.IndexSessionWakes, merged as ClaimKinds merges kinds: mergeScans), so it
// reads one entry per session to start and one per wake claimed.
func (b *logBackend) ClaimSessionWakes(ctx context.Context, sessions []string, now time.Time, leaseFor time.Duration, limit int) ([]WakeDelivery, error) {
	sessions = distinct(sessions)
	scan := func(tx txn, maxAt int64, fn func(projection.IndexEntry) bool) error {
		return mergeScans(tx, projection.IndexSessionWakes, sessions, maxAt, fn)
	}
	return claim(ctx, b, now, leaseFor, limit, scan, "wakelease", b.claimWake)
}
