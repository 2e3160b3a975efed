package work

import (
	engineapi "github.com/worklog/worklog/internal/engine"
)

// engineCaps are the optional interfaces of an engine, asserted once, when its queue is built
// (resolveCaps): nothing asserts on an engine after that, so a capability cannot be lost
// behind a wrapper, and every use reads as a nil check on a field.
type engineCaps struct {
	pruner     engineapi.Pruner        // Queue.Prune; nil: ErrPruneNotSupported
	watcher    engineapi.Watcher       // other processes' commits wake this queue's waiters
	stager     valueStager             // large values written before the command is queued (engine.go)
	after      afterPruner             // space reclaimed in the background after a prune (prune_pace.go)
	checkpoint Checkpointer            // Queue.Checkpoint; nil on engines without one (Pebble's has it)
	durable    engineapi.DurableHead   // Queue.Follow reads up to its head; nil: to the log's end (follow.go)
	inbox      engineapi.Inbox         // submissions committed by other transactions (inbox.go)
	viewer     engineapi.DurableViewer // an idempotent repeat answered by a read, outside the writer (engine.go, readRepeat)
	forward    engineapi.Forwarder     // a worker's round run by another process (forward.go)
}

func resolveCaps(e engine) engineCaps {
	var c engineCaps
	c.pruner, _ = e.(engineapi.Pruner)
	c.watcher, _ = e.(engineapi.Watcher)
	c.stager, _ = e.(valueStager)
	c.after, _ = e.(afterPruner)
	c.checkpoint, _ = e.(Checkpointer)
	c.durable, _ = e.(engineapi.DurableHead)
	c.inbox, _ = e.(engineapi.Inbox)
	c.viewer, _ = e.(engineapi.DurableViewer)
	c.forward, _ = e.(engineapi.Forwarder)
	return c
}

// The engines outside this package (postgres's, replay's read-only one) build their queue
// through engineapi.NewQueue, which is newEngineQueue: set here, before any package that
// imports work runs, so that work's exported API names no internal type.
func init() {
	engineapi.NewQueue = func(e engineapi.Engine, c engineapi.Config) any { return newEngineQueue(e, c) }
	engineapi.ErrClosed = ErrClosed
}

// newEngineQueue is a Queue over worklog's event-sourced backend on e, configured by c: the
// one constructor of every engine's queue (NewInMemory, Open, and postgres.Open through
// engineapi.NewQueue alike).
func newEngineQueue(e engineapi.Engine, c engineapi.Config) *Queue {
	maxValue := c.MaxValueBytes
	if maxValue <= 0 {
		maxValue = DefaultMaxValueBytes
	}
	clock := c.Clock
	if clock == nil {
		clock = wallClock
	}
	caps := resolveCaps(e)
	lb := &logBackend{eng: e, caps: caps, hub: newWaitHub(caps.watcher), ids: newIDSource(c.Entropy),
		maxValue: maxValue, clock: clock, ownedValueMin: c.OwnedValueMin, ownedOutputMin: c.OwnedOutputMin,
		borrowedInputMin: c.BorrowedInputMin}
	q := &Queue{b: lb, caps: resolveBackendCaps(lb), maxValue: maxValue, clock: clock}
	if caps.forward != nil {
		caps.forward.SetForwardServer(lb.serveForwarded)
	}
	if c.Retention > 0 {
		q.stopPruner = q.startPruner(c.Retention, c.PruneInterval, c.Logger)
	}
	if caps.inbox != nil {
		q.stopInbox = lb.startInbox(c.Logger)
	}
	return q
}
