package pebblelog

// Durable returns the last sequence whose event is durable, a channel that is closed once that
// may have grown (or the store failed), and the store's failure, if it failed.
//
// It is what Queue.Follow reads up to: a batch is visible to ReadLog a moment before its fsync
// returns (Pebble's ApplyNoSyncWait, and its own synced commits alike), and a machine crash in
// that moment would take it back, so a follower must not hand it out yet. The syncer advances
// the value once a batch's SyncWait returned, before it answers the batch's callers; with
// Options.NoSync, once the batch is committed (nothing is ever known durable then). On Open
// it is the last sequence found. The channel is taken before the value is read: a follower
// that reads up to the value and then waits on the channel misses no advance. A failed store
// closes it and every later call returns a closed channel and the failure.
func (s *Store) Durable() (seq uint64, grown <-chan struct{}, err error) {
	seq, grown = s.fh.durable.Load()
	return seq, grown, s.fh.err()
}
