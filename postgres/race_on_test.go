//go:build race

package postgres

// raceEnabled: the race detector is on (TestVerifyHeap fills fewer tasks: it slows the fill
// several times).
const raceEnabled = true
