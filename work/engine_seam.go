package work

import (
	engineapi "github.com/worklog/worklog/internal/engine"
)

// init installs the constructor through which a backend package of this module (postgres)
// turns its engine into a Queue, without an exported seam in this package's API.
func init() {
	engineapi.NewQueue = func(e engineapi.Engine, c engineapi.Config) any { return newEngineQueue(e, c) }
}

// newEngineQueue is a Queue over worklog's event-sourced backend on e.
func newEngineQueue(e engine, c engineapi.Config) *Queue {
	maxValue := c.MaxValueBytes
	if maxValue <= 0 {
		maxValue = DefaultMaxValueBytes
	}
	lb := &logBackend{eng: watched(e), ids: newIDSource(c.Entropy), maxValue: maxValue, clock: wallClock,
		ownedValueMin: c.OwnedValueMin, ownedOutputMin: c.OwnedOutputMin}
	q := &Queue{b: lb, log: lb, maxValue: maxValue}
	if c.Retention > 0 {
		q.stopPruner = q.startPruner(c.Retention, c.PruneInterval, c.Logger)
	}
	return q
}
