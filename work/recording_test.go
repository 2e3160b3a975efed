package work

import (
	"context"
	engineapi "github.com/worklog/worklog/internal/engine"

	"github.com/worklog/worklog/events"
)

// recordingEngine is the in-memory engine reporting the type of every event a command
// appends, for the test that the conformance suite exercises every event type.
type recordingEngine struct {
	*memEngine
	seen func(events.Type)
}

// newRecordingQueue is NewInMemory over a recordingEngine.
func newRecordingQueue(seen func(events.Type)) *Queue {
	return NewEngineQueue(&recordingEngine{memEngine: newMemEngine(), seen: seen}, engineapi.Config{})
}

func (e *recordingEngine) Update(ctx context.Context, fn func(tx txn) error) error {
	e.mu.RLock()
	n := len(e.log)
	e.mu.RUnlock()
	err := e.memEngine.Update(ctx, fn)
	e.mu.RLock()
	defer e.mu.RUnlock()
	for _, ev := range e.log[min(n, len(e.log)):] { // commands may interleave: the set is what counts
		e.seen(ev.Type())
	}
	return err
}
