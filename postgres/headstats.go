package postgres

import (
	"sync/atomic"
	"time"
)

// headStats counts the writer's committed groups and how long each held the log head
// (issue 24 §2: the serialization of every writer of every process on the log_head row).
// Read-only instrumentation: the writer adds to it (three lines of attempt, writer.go), only
// BenchmarkProcesses reads it. A group's hold is measured from its first round trip's answer
// (BEGIN and the head's lock granted) to its commit batch's answer (COMMIT done): the lock is
// taken up to one network leg before the first and released up to one before the second,
// so the figure is the server's hold within a round trip. Its wait is from before the pool's
// connection is acquired to that first answer: the pool, the round trip and the queue on the
// lock behind other writers.
type headStats struct {
	groups atomic.Int64 // committed groups
	held   atomic.Int64 // nanoseconds, summed over them
	wait   atomic.Int64 // nanoseconds, summed over them
}

// record adds one committed group: start before its connection was acquired, locked when
// its first batch answered, done when its commit batch answered.
func (h *headStats) record(start, locked, done time.Time) {
	h.groups.Add(1)
	h.held.Add(int64(done.Sub(locked)))
	h.wait.Add(int64(locked.Sub(start)))
}
