package work

import (
	"context"
	engineapi "github.com/worklog/worklog/internal/engine"
	"slices"
)

// rerunEngine is the in-memory engine with the habit of pebblelog's writer that
// engine.update documents: a command's closure may run twice. Here every closure first runs
// against the state before the previous command, as if that command had failed in a shared
// group and been dropped, and its result is thrown away; then it runs for real. A closure
// that carries anything over from its first run (an output, a domain error) answers wrongly,
// and the conformance suite (TestConformanceRerun) fails.
type rerunEngine struct {
	*memEngine
	prev int // the log's length before the last command that appended
}

// newRerunQueue is NewInMemory over a rerunEngine.
func newRerunQueue() *Queue {
	return newEngineQueue(&rerunEngine{memEngine: newMemEngine()}, engineapi.Config{})
}

func (e *rerunEngine) Update(ctx context.Context, fn func(tx txn) error) error {
	e.mu.Lock()
	// A prune compacts the log: prev then counts events no longer there (min), and the
	// scratch needs the pruned ranges to fold across the gaps.
	scratch := &memEngine{log: slices.Clone(e.log[:min(e.prev, len(e.log))]), pruned: e.pruned}
	e.mu.Unlock()
	if err := scratch.refold(); err != nil {
		return err
	}
	_ = scratch.Update(ctx, fn) // the first run: whatever it did is dropped

	e.mu.Lock()
	n := len(e.log)
	e.mu.Unlock()
	err := e.memEngine.Update(ctx, fn)
	e.mu.Lock()
	if len(e.log) > n {
		e.prev = n
	}
	e.mu.Unlock()
	return err
}
