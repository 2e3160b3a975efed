package work

// NewRerunQueue is an in-memory queue whose commands each run their closure twice, the first
// time against an older state (rerunEngine), for the external conformance test.
var NewRerunQueue = newRerunQueue
