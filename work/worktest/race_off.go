//go:build !race

package worktest

// raceEnabled: the race detector is on. submit_many/total_size_limit then leaves out its
// batch of exactly 64 MiB: instrumented, its commit took over Pebble's 30 s stall watchdog
// (Options.StallTimeout) at load 27 on 2 cores. TestSubmitManyMemory (package postgres)
// submits such batches to every backend without it.
const raceEnabled = false
