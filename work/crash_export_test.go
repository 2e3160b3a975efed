package work

import "time"

// SetPrunerClock sets the background pruner's clock until the returned restore is called:
// the prune crash test's child runs its load at explicit times, and its background pruner
// must prune by them.
func SetPrunerClock(now func() time.Time) (restore func()) {
	old := prunerClock
	prunerClock = now
	return func() { prunerClock = old }
}
