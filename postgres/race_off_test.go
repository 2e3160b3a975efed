//go:build !race

package postgres

const raceEnabled = false
