//go:build race

package proptest

const raceEnabled = true
