//go:build race

package pebblelog

// raceEnabled: the race detector multiplies every allocation's footprint, so a memory bound
// (TestBlobVerifyMemory) means nothing under it.
const raceEnabled = true
