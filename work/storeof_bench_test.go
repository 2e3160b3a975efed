package work

import (
	"time"

	"github.com/worklog/worklog/pebblelog"
)

// StoreOf returns the Pebble store under a durable queue, for the retention benchmarks'
// disk figures (Pebble's metrics, the space of each keyspace); nil for another backend.
func StoreOf(q *Queue) *pebblelog.Store {
	if pe, ok := q.pebble(); ok {
		return pe.Store()
	}
	return nil
}

// SetPruneBudget sets the time a paced prune group should take (zero: no pacing) until the
// returned restore is called.
func SetPruneBudget(d time.Duration) (restore func()) {
	old := pruneBudget
	pruneBudget = d
	return func() { pruneBudget = old }
}

// DefaultPruneBudgetForBench is the default pruneBudget, for the benchmarks' paced variant.
var DefaultPruneBudgetForBench = pruneBudget

// SetPrunePause sets the wait after each paced prune group, as a multiple of its time,
// until the returned restore is called.
func SetPrunePause(f float64) (restore func()) {
	old := prunePause
	prunePause = f
	return func() { prunePause = old }
}

// SetCompactAfterPrune turns the background compaction after a prune on or off until the
// returned restore is called.
func SetCompactAfterPrune(on bool) (restore func()) {
	old := compactAfterPrune
	compactAfterPrune = on
	return func() { compactAfterPrune = old }
}
