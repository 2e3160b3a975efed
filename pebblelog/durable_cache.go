package pebblelog

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/worklog/worklog/projection"
)

// durableCache keeps what ViewDurable read for an idempotent repeat, so that the next repeat
// of the same key is answered from memory: the idempotency keys found (a key names its
// record until a prune deletes both), and the task and wake records they named, filled with
// their small values (the three Pebble reads of a repeat were most of its cost: the key, the
// record, the submit's event for the input).
//
// The invariant: an entry equals what Pebble holds for it now. The writer, after each
// committed batch, drops every record the batch wrote (invalidate) and, after a batch that
// pruned, everything (clear); a reader adds what it read only if no such drop touched its
// shard between the start of its read and the add (the shard's generation), so a value read
// before a commit is never added after the commit's drop. What ViewDurable reports as
// durable stays decided by the records' sequences, cached or not.
//
// Values are shared with the readers, as the record cache's are: only values a reader copies
// before handing them out are kept (an input or payload up to cachedValueMax, an output below
// BlobMin for a task, up to cachedValueMax for a wake; OwnedValueMin); a record with a longer
// one is read from Pebble every time. Bounded by Options.RecordCacheSize, as the writer's
// record cache is; when a shard is full it drops arbitrary entries.
type durableCache struct {
	seed   maphash.Seed
	epoch  atomic.Uint64 // bumped by clear: a key read before a prune is not added after it
	shards [durableShards]durableShard
	max    int // bytes a shard holds at most
}

const durableShards = 32

type durableShard struct {
	mu    sync.Mutex
	gen   atomic.Uint64 // bumped by every drop in the shard
	bytes int
	tasks map[string]projection.Task
	wakes map[string]projection.Wake
	keys  map[durableKey]string // a task's or wake's idempotency key → its id
}

type durableKey struct {
	wake         bool
	session, key string
}

// newDurableCache returns a cache of at most max bytes; nil (no cache) when max ≤ 0.
func newDurableCache(max int) *durableCache {
	if max <= 0 {
		return nil
	}
	c := &durableCache{seed: maphash.MakeSeed(), max: max / durableShards}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.tasks, sh.wakes, sh.keys = map[string]projection.Task{}, map[string]projection.Wake{}, map[durableKey]string{}
	}
	return c
}

func (c *durableCache) shardOf(s string) *durableShard {
	return &c.shards[maphash.String(c.seed, s)%durableShards]
}

func (c *durableCache) keyShard(k durableKey) *durableShard {
	return c.shardOf(k.session + "\x00" + k.key)
}

// mark is what a reader notes before its read: the shard's generation and the epoch.
type durableMark struct{ gen, epoch uint64 }

func (c *durableCache) mark(sh *durableShard) durableMark {
	return durableMark{gen: sh.gen.Load(), epoch: c.epoch.Load()}
}

// fresh reports, with sh locked, whether nothing was dropped since m.
func (c *durableCache) fresh(sh *durableShard, m durableMark) bool {
	return sh.gen.Load() == m.gen && c.epoch.Load() == m.epoch
}

func (c *durableCache) key(k durableKey) (string, durableMark, bool) {
	sh := c.keyShard(k)
	m := c.mark(sh)
	sh.mu.Lock()
	id, ok := sh.keys[k]
	sh.mu.Unlock()
	return id, m, ok
}

func (c *durableCache) addKey(k durableKey, id string, m durableMark) {
	sh := c.keyShard(k)
	sh.mu.Lock()
	if c.fresh(sh, m) {
		sh.keys[k] = id
		sh.bytes += recordOverhead + len(k.session) + len(k.key) + len(id)
		c.evict(sh)
	}
	sh.mu.Unlock()
}

func (c *durableCache) task(id string) (projection.Task, durableMark, bool) {
	return cacheGet(c, id, shardTasks)
}

func (c *durableCache) addTask(t *projection.Task, m durableMark) {
	if len(t.Input) > cachedValueMax || len(t.Outcome.Output) >= BlobMin {
		return
	}
	cacheAdd(c, t.ID, t, taskBytes, shardTasks, m)
}

func (c *durableCache) wake(id string) (projection.Wake, durableMark, bool) {
	return cacheGet(c, id, shardWakes)
}

func (c *durableCache) addWake(x *projection.Wake, m durableMark) {
	if len(x.Payload) > cachedValueMax || len(x.Outcome.Output) > cachedValueMax {
		return
	}
	cacheAdd(c, x.ID, x, wakeBytes, shardWakes, m)
}

func shardTasks(sh *durableShard) map[string]projection.Task { return sh.tasks }
func shardWakes(sh *durableShard) map[string]projection.Wake { return sh.wakes }

// cacheGet is a record's entry, with the mark its reader takes before reading it.
func cacheGet[R any](c *durableCache, id string, records func(*durableShard) map[string]R) (R, durableMark, bool) {
	sh := c.shardOf(id)
	m := c.mark(sh)
	sh.mu.Lock()
	r, ok := records(sh)[id]
	sh.mu.Unlock()
	return r, m, ok
}

// cacheAdd keeps a record read since m, unless a drop came in between.
func cacheAdd[R any](c *durableCache, id string, r *R, size func(*R) int, records func(*durableShard) map[string]R, m durableMark) {
	sh := c.shardOf(id)
	sh.mu.Lock()
	if c.fresh(sh, m) {
		recs := records(sh)
		if old, ok := recs[id]; ok {
			sh.bytes -= size(&old)
		}
		recs[id] = *r
		sh.bytes += size(r)
		c.evict(sh)
	}
	sh.mu.Unlock()
}

// cacheDrop drops a record's entry (sh locked).
func cacheDrop[R any](sh *durableShard, id string, size func(*R) int, records func(*durableShard) map[string]R) {
	recs := records(sh)
	if old, ok := recs[id]; ok {
		sh.bytes -= size(&old)
		delete(recs, id)
	}
}

// evict drops arbitrary entries of sh (locked) until it is within its bound.
func (c *durableCache) evict(sh *durableShard) {
	if sh.bytes <= c.max {
		return
	}
	for id, t := range sh.tasks {
		if sh.bytes <= c.max*3/4 {
			return
		}
		sh.bytes -= taskBytes(&t)
		delete(sh.tasks, id)
	}
	for id, x := range sh.wakes {
		if sh.bytes <= c.max*3/4 {
			return
		}
		sh.bytes -= wakeBytes(&x)
		delete(sh.wakes, id)
	}
	for k, id := range sh.keys {
		if sh.bytes <= c.max*3/4 {
			return
		}
		sh.bytes -= recordOverhead + len(k.session) + len(k.key) + len(id)
		delete(sh.keys, k)
	}
}

// invalidate drops the records a committed batch wrote. The writer calls it after the
// batch is visible to readers, before it answers the batch's callers.
func (c *durableCache) invalidate(tasks map[string]projection.Task, wakes map[string]projection.Wake) {
	for id := range tasks {
		c.drop(c.shardOf(id), func(sh *durableShard) { cacheDrop(sh, id, taskBytes, shardTasks) })
	}
	for id := range wakes {
		c.drop(c.shardOf(id), func(sh *durableShard) { cacheDrop(sh, id, wakeBytes, shardWakes) })
	}
}

func (c *durableCache) drop(sh *durableShard, fn func(*durableShard)) {
	sh.mu.Lock()
	sh.gen.Add(1)
	fn(sh)
	sh.mu.Unlock()
}

// clear drops everything: after a batch that deleted records and keys (a prune).
func (c *durableCache) clear() {
	c.epoch.Add(1)
	for i := range c.shards {
		c.drop(&c.shards[i], func(sh *durableShard) {
			clear(sh.tasks)
			clear(sh.wakes)
			clear(sh.keys)
			sh.bytes = 0
		})
	}
}

// durableCacheSize is the durable cache's bound for Options.RecordCacheSize: four times
// the writer's record cache (16 MiB by default), since it holds the records of every key
// repeated lately, not only the few a batch touches; a cache smaller than the keys repeated
// in turn is nearly all misses (each read adds, each add evicts what the next read needs).
func durableCacheSize(recordCacheSize int) int {
	return 4 * recordCacheSize
}
