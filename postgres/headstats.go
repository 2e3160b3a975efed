package postgres

import (
	"sync/atomic"
	"time"
)

// headStats counts the writer's committed groups and how long each held the log head
// (issue 24 §2: the serialization of every writer of every process on the log_head row).
// Read-only instrumentation: the writer adds to it (attempt and begin, writer.go), only
// BenchmarkProcesses and tests read it. A group's hold is measured from its first round trip's answer
// (BEGIN and the head's lock granted) to its commit batch's answer (COMMIT done): the lock is
// taken up to one network leg before the first and released up to one before the second,
// so the figure is the server's hold within a round trip. Its wait is from before the pool's
// connection is acquired to that first answer: the pool, the round trip and the queue on the
// lock behind other writers.
type headStats struct {
	groups atomic.Int64 // committed groups
	held   atomic.Int64 // nanoseconds, summed over them
	wait   atomic.Int64 // nanoseconds, summed over them
	reads  atomic.Int64 // records and keys read from the server under the lock, summed over them

	// The cache at each group's begin when another writer had committed since the last
	// (catchup.go): kept (caught up with the events since, dropped the entries they name,
	// summed in dropped) or started over.
	kept, restarted, dropped atomic.Int64

	// The fast path (fast.go): groups committed (or answered) in one round trip, and those
	// that ran the ordinary way after it: needed a read, found another writer's commit, or
	// else (a closure failed, a write refused, a connection lost before its commit).
	fast, fastRead, fastStale, fastOther atomic.Int64
	// fastKey: of fastOther, the batches refused for a key taken as absent and found stored.
	fastKey atomic.Int64
}

// record adds one committed group: start before its connection was acquired, locked when
// its first batch answered, done when its commit batch answered; reads the records and keys
// it read from the server.
func (h *headStats) record(start, locked, done time.Time, reads int) {
	h.groups.Add(1)
	h.held.Add(int64(done.Sub(locked)))
	h.wait.Add(int64(locked.Sub(start)))
	h.reads.Add(int64(reads))
}

// caughtUp counts a begin that found other writers' events since its cache's head: ok when
// the cache was kept, dropped the entries those events named.
func (h *headStats) caughtUp(ok bool, dropped int) {
	if ok {
		h.kept.Add(1)
		h.dropped.Add(int64(dropped))
	} else {
		h.restarted.Add(1)
	}
}

// fastMissed counts a group the fast path gave to the ordinary one.
func (h *headStats) fastMissed(needRead, stale bool) {
	switch {
	case needRead:
		h.fastRead.Add(1)
	case stale:
		h.fastStale.Add(1)
	default:
		h.fastOther.Add(1)
	}
}
