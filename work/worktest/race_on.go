//go:build race

package worktest

// raceEnabled: the race detector is on (race_off.go).
const raceEnabled = true
