//go:build race

package work_test

// raceEnabled: the race detector multiplies every allocation's footprint, so the memory bound
// of TestLargeValueMemory means nothing under it.
const raceEnabled = true
