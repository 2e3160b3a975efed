package work

import "github.com/worklog/worklog/pebblelog"

// StoreOf returns the Pebble store under a durable queue, for the retention benchmarks'
// disk figures (Pebble's metrics, the space of each keyspace); nil for another backend.
func StoreOf(q *Queue) *pebblelog.Store {
	if pe, ok := q.pebble(); ok {
		return pe.st
	}
	return nil
}
