//go:build race

package postgres

// raceEnabled: the race detector is on (TestVerifyHeap is skipped: the heap is not the
// product's there).
const raceEnabled = true
