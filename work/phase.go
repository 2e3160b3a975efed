package work

import (
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// Phase is what users of other queues call a pending task: derived from the task and a
// time, never stored. A task that is not pending has no phase ("").
type Phase string

const (
	// PhaseAvailable: due; a claim at that time may take it.
	PhaseAvailable Phase = projection.PhaseAvailable
	// PhaseScheduled: its run time is later (submitted with a RunAt, or retried for later).
	PhaseScheduled Phase = projection.PhaseScheduled
	// PhaseRetrying: released by a worker after an attempt (the runner's backoff), to run
	// again later. Once its run time comes it is available.
	PhaseRetrying Phase = projection.PhaseRetrying
)

// PhaseAt is the task's phase at now, "" when the task is not pending.
func (t Task) PhaseAt(now time.Time) Phase {
	if t.State != TaskPending {
		return ""
	}
	r := projection.Task{
		State:           events.StatePending,
		ScheduledAt:     t.ScheduledAt.UnixNano(),
		Attempts:        t.Attempts,
		AttemptsAtRetry: t.AttemptsAtRetry,
	}
	return Phase(r.PendingPhase(now.UnixNano()))
}

func validPhase(p Phase) bool {
	return p == PhaseAvailable || p == PhaseScheduled || p == PhaseRetrying
}
