package work

import (
	engineapi "github.com/worklog/worklog/internal/engine"
)

// init installs the constructor through which a backend package of this module (postgres)
// turns its engine into a Queue, without an exported seam in this package's API.
func init() {
	engineapi.NewQueue = func(e engineapi.Engine, c engineapi.Config) any { return newEngineQueue(e, c) }
}

// engineCaps are the optional interfaces of an engine, asserted once, when its queue is built
// (resolveCaps): nothing asserts on an engine after that, so a capability cannot be lost
// behind a wrapper, and every use reads as a nil check on a field.
type engineCaps struct {
	pruner  engineapi.Pruner  // Queue.Prune; nil: ErrPruneNotSupported
	watcher engineapi.Watcher // other processes' commits wake this queue's waiters
	stager  valueStager       // large values written before the command is queued (engine.go)
	after   afterPruner       // space reclaimed in the background after a prune (prune_pace.go)
	pebble  *pebbleEngine     // Queue.Checkpoint; nil on other engines
}

func resolveCaps(e engine) engineCaps {
	var c engineCaps
	c.pruner, _ = e.(engineapi.Pruner)
	c.watcher, _ = e.(engineapi.Watcher)
	c.stager, _ = e.(valueStager)
	c.after, _ = e.(afterPruner)
	c.pebble, _ = e.(*pebbleEngine)
	return c
}

// newEngineQueue is a Queue over worklog's event-sourced backend on e.
func newEngineQueue(e engine, c engineapi.Config) *Queue {
	maxValue := c.MaxValueBytes
	if maxValue <= 0 {
		maxValue = DefaultMaxValueBytes
	}
	caps := resolveCaps(e)
	lb := &logBackend{eng: e, caps: caps, hub: newWaitHub(caps.watcher), ids: newIDSource(c.Entropy),
		maxValue: maxValue, clock: wallClock, ownedValueMin: c.OwnedValueMin, ownedOutputMin: c.OwnedOutputMin}
	q := &Queue{b: lb, log: lb, maxValue: maxValue}
	if c.Retention > 0 {
		q.stopPruner = q.startPruner(c.Retention, c.PruneInterval, c.Logger)
	}
	return q
}
