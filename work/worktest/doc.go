// Package worktest is the conformance suite every worklog backend must pass.
//
// A backend's own test calls Run with a Harness that makes fresh queues and reopens them
// (here a durable Backend, mystore, over a directory):
//
//	func TestConformance(t *testing.T) {
//		dirs := map[*work.Queue]string{}
//		worktest.Run(t, worktest.Harness{
//			New: func(t *testing.T) *work.Queue {
//				dir := t.TempDir()
//				q := work.New(mystore.Open(dir))
//				dirs[q] = dir
//				return q
//			},
//			Reopen: func(t *testing.T, q *work.Queue) *work.Queue {
//				q.Close()
//				return work.New(mystore.Open(dirs[q]))
//			},
//		})
//	}
//
// Run ports every scenario of the seed's own suite (everruns tests/session_work.rs) and adds
// one for each rule of the seed and of the spec (shared/spec/work-api.md) that those leave
// untested, and one for each rule and error of part 2 (shared/spec/work-api-2.md: Extend,
// Release, ClaimKinds, Session.Tasks; and Stats and SettleAndClaim, documented in
// work/queue_worker.go), in running*.go. It uses only the public API plus Queue.Verify, Queue.ReadLog and Queue.Backend,
// passes explicit times everywhere (the ...At methods) and never sleeps. After every subtest
// it runs Queue.Verify on the live queue, the bbolt habit: a consistency check after every
// test.
//
// Every error the suite sees goes through CheckError: it must match exactly one of the six
// kind sentinels, carry a *work.Error whose text follows the seed's message, and never
// contain a lease token.
package worktest
