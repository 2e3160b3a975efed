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

// CutSharedWriterAnswers makes q, while elected, call cut for each round it serves, before it
// runs (ran false) and after (ran true, before the answer is sent): true closes the sender's
// connection there, so the sender loses the answer. nil removes it.
func CutSharedWriterAnswers(q *work.Queue, cut func(ran bool) bool) {
	v, ok := queues.Load(q)
	if !ok || v.(*engine).sw == nil {
		panic("CutSharedWriterAnswers: not an open queue with SharedWriter")
	}
	if cut == nil {
		v.(*engine).sw.cut.Store(nil)
		return
	}
	v.(*engine).sw.cut.Store(&cut)
}
