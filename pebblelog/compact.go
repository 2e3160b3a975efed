package pebblelog

import (
	"context"
	"fmt"
	"sync"
)

// Reclaiming the space of pruned history (docs/design.md §11, "Memory and disk").
//
// Pebble frees space only when a compaction drops what a tombstone covers. A prune deletes
// the oldest part of the log (with range deletions for runs of it), and of the time-ordered
// keyspaces (records, subject index), but leaves those tombstones for Pebble's own picker,
// which compacts by level size and tombstone density. BenchmarkRetentionWindows (10 windows of
// 20,000 tasks, pruned each window) measured three ways: leaving it to Pebble, the live
// sstables went 18 → 28 → 20 → 28 MB from window to window; compacting the log's span up
// to the last pruned sequence after each prune kept them at 14 to 18 MB, for 0.5 to 1.8 s
// of compaction a window (2 to 5% of the window's work), in the background; compacting the
// whole keyspace (rewriting everything live each time) is in docs/performance.md. So after a
// prune the log span that prune emptied is compacted, in the background, once: the next
// prune's compaction starts where this one ended. Everything else stays with Pebble.

// compactor runs CompactPruned in the background, one at a time: a request while one runs
// makes one more run after it. Close stops it (stop) before it closes the database.
type compactor struct {
	mu      sync.Mutex
	running bool
	again   bool
	stopped bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	from    uint64 // the log below this sequence was compacted after the prunes that emptied it
}

// CompactPrunedLater compacts the log span emptied by the prunes since the last such
// compaction, in a goroutine of its own: never on the writer's path. Queue.Prune calls it
// after a prune that removed events. A failure is logged (Options.Logger): the space is then
// left to Pebble's own compactions.
func (s *Store) CompactPrunedLater() {
	c := &s.comp
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if c.running {
		c.again = true
		return
	}
	if c.ctx == nil {
		c.ctx, c.cancel = context.WithCancel(context.Background())
	}
	c.running = true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			if err := s.CompactPruned(c.ctx); err != nil && c.ctx.Err() == nil {
				s.opts.Logger.Warn(fmt.Sprintf("worklog: compacting the pruned log of %s: %v", s.dir, err))
			}
			c.mu.Lock()
			if !c.again || c.stopped {
				c.running = false
				c.mu.Unlock()
				return
			}
			c.again = false
			c.mu.Unlock()
		}
	}()
}

// stop cancels a running compaction and waits for it; later requests do nothing. Close
// calls it before it takes the store's close lock, which a running compaction holds for
// reading.
func (c *compactor) stop() {
	c.mu.Lock()
	c.stopped = true
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// CompactPruned compacts the log's keys from the end of the last span it compacted to the end
// of the last pruned range, now. It returns at once when nothing was pruned since.
func (s *Store) CompactPruned(ctx context.Context) (err error) {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave(&err)
	ranges, err := reader{r: s.db}.PrunedRanges()
	if err != nil || len(ranges) == 0 {
		return err
	}
	s.comp.mu.Lock()
	from, to := s.comp.from, ranges[len(ranges)-1].To+1
	s.comp.mu.Unlock()
	if to <= from {
		return nil
	}
	if err := s.fh.call("a compaction", func() error { return s.db.Compact(ctx, eventKey(from), eventKey(to), false) }); err != nil {
		return fmt.Errorf("pebblelog: compacting the log from seq %d to %d: %w", from, to, err)
	}
	s.comp.mu.Lock()
	s.comp.from = max(s.comp.from, to)
	s.comp.mu.Unlock()
	return nil
}

// Tools is the store's surface for benchmarks and tools, apart from the queue's API: what a
// store reader or writer never needs (where the space goes, compacting a range now).
type Tools struct{ s *Store }

// Tools returns the store's tools surface.
func (s *Store) Tools() Tools { return Tools{s} }

// KeyspaceUsage estimates the bytes each keyspace (by its prefix byte, keys.go) takes in the
// store's sstables, from Pebble's EstimateDiskUsage: what the memtables and the WAL hold is
// not in it. For the retention benchmarks: where the space goes.
func (t Tools) KeyspaceUsage() (_ map[byte]uint64, err error) {
	s := t.s
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave(&err)
	out := map[byte]uint64{}
	for _, p := range []byte{prefixMeta, prefixEvent, prefixSession, prefixTask, prefixWake, prefixTaskKey, prefixWakeKey,
		prefixDue, prefixAvailable, prefixKindDue, prefixSessionTask, prefixCount, prefixPrunable, prefixPruned, prefixSubject,
		prefixSessionWake} {
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

// CompactRange compacts the keys of [start, end) now: for the benchmarks that compare ways of
// reclaiming space.
func (t Tools) CompactRange(ctx context.Context, start, end []byte) (err error) {
	s := t.s
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave(&err)
	return s.fh.call("a compaction", func() error { return s.db.Compact(ctx, start, end, false) })
}
