package work

import "time"

// SetClock sets the clock of the queues opened afterwards, until the returned restore is
// called: the prune crash test's child runs its load at explicit times, and its background
// pruner must prune by them.
func SetClock(now func() time.Time) (restore func()) {
	old := wallClock
	wallClock = now
	return func() { wallClock = old }
}
