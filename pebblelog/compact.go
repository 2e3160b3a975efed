package pebblelog

import (
	"context"
	"fmt"
)

// KeyspaceUsage estimates the bytes each keyspace (by its prefix byte, keys.go) takes in the
// store's sstables, from Pebble's EstimateDiskUsage: what the memtables and the WAL hold is
// not in it. For the retention benchmarks and replay's stats: where the space goes.
func (s *Store) KeyspaceUsage() (_ map[byte]uint64, err error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave(&err)
	out := map[byte]uint64{}
	for _, p := range []byte{prefixMeta, prefixEvent, prefixSession, prefixTask, prefixWake, prefixTaskKey, prefixWakeKey,
		prefixDue, prefixAvailable, prefixKindDue, prefixSessionTask, prefixCount, prefixPrunable, prefixPruned, prefixSubject} {
		n, err := s.db.EstimateDiskUsage([]byte{p}, []byte{p + 1})
		if err != nil {
			return nil, fmt.Errorf("pebblelog: estimating the size of keyspace %q: %w", p, err)
		}
		if n > 0 {
			out[p] = n
		}
	}
	return out, nil
}

// CompactRange compacts the keys of [start, end) (for the benchmarks' strategies).
func (s *Store) CompactRange(ctx context.Context, start, end []byte) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave(&err)
	return s.db.Compact(ctx, start, end, false)
}
