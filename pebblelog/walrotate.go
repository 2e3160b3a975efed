package pebblelog

import "github.com/cockroachdb/pebble/v2"

// rotateFirstWAL gives a new store a WAL whose chunks carry synced offsets before anything
// is written into it (docs/design.md §7.2).
//
// pebble.Open creates a new database's first WAL before it ratchets the database to the
// configured format (pebbleFormat), and whether a WAL's chunks carry the synced offset
// (FormatWALSyncChunks) is fixed when the WAL is created. So every batch of a store's first
// session used to go into a WAL without synced offsets, where nothing proves that a damaged
// chunk had been synced: after a crash in that session a flipped byte anywhere in it was
// taken for a torn tail, and every acknowledged batch after it was dropped without a word.
// A flush of the (empty) memtable rotates the WAL: the next one is created at the ratcheted
// format. It runs before the format key, the store's first write; the empty first WAL
// becomes obsolete. Called only while a store is being created (exists false: a new
// directory, or a creation a crash interrupted, whose first WAL Pebble's Open has already
// replayed and flushed).
func rotateFirstWAL(db *pebble.DB) error {
	return db.Flush()
}
