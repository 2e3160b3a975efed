package work

// NewRerunQueue is an in-memory queue whose commands each run their closure twice, the first
// time against an older state (rerunEngine), for the external conformance test.
var NewRerunQueue = newRerunQueue

// NewRecordingQueue is an in-memory queue that reports the type of every event its commands
// append (recordingEngine), for the every-type conformance test.
var NewRecordingQueue = newRecordingQueue

// SubmitTxRecording puts a submission into a recording queue's inbox (committed) or not.
var SubmitTxRecording = submitTxRecording

// BackendOf is the backend under q (Queue.Backend was public before; only tests used it):
// New(BackendOf(q)) is a second queue over q's state, with every capability of q.
func BackendOf(q *Queue) Backend { return q.b }

// SetWaitBlocks sets the hook each waiter calls as it blocks (waitBlocks) until the returned
// restore is called.
func SetWaitBlocks(fn func()) (restore func()) {
	waitBlocks = fn
	return func() { waitBlocks = nil }
}

// SetPruneGroup sets the subjects per prune command until the returned restore is called.
func SetPruneGroup(n int) (restore func()) {
	old := pruneGroup
	pruneGroup = n
	return func() { pruneGroup = old }
}
