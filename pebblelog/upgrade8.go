package pebblelog

// The upgrade to format 8: the schedules (h) and their index by next tick (H), kept by the
// fold of schedule_set, schedule_removed and a tick's task_submitted v3 (state_schedules.go).
//
// A store of an older format holds none of those events: a build that knows no schedule
// cannot write one, and decoding refuses event types it does not know. So the two
// keyspaces follow from the log as empty, and the step only clears them (nothing is there
// unless a crashed earlier attempt of this very upgrade left something, which it cannot:
// it writes nothing) before upgrade writes the synced format key and the marker. What the
// step buys is the format key: a build of format 7 or older refuses the store from then on,
// so no process that ignores schedules claims from a queue whose ticks it would skip.
//
// It is applied when the format key is below 8, after the earlier steps (7 is the per-kind
// policies' step; until both are merged, a store of format 6 goes straight to 8).
func (s *Store) buildFormat8() error {
	return s.clearKeyspaces(prefixSchedule, prefixScheduleDue)
}
