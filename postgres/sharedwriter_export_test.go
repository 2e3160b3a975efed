package postgres

import "github.com/worklog/worklog/work"

// SharedWriterState reports q's shared writer (Options.SharedWriter), for the tests of
// package postgres_test: whether it is elected, whether it holds a connection to the elected
// process, and its rounds sent to that process and run for others.
func SharedWriterState(q *work.Queue) (leading, connected bool, forwarded, served int64) {
	v, ok := queues.Load(q)
	if !ok || v.(*engine).sw == nil {
		return false, false, 0, 0
	}
	s := v.(*engine).sw
	c := s.cur.Load()
	return s.leading.Load(), c != nil && !c.isDead(), s.forwarded.Load(), s.served.Load()
}
