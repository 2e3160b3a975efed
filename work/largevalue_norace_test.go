//go:build !race

package work_test

const raceEnabled = false
