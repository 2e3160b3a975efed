package pebblelog

import (
	"testing"

	"github.com/worklog/worklog/projection"
)

// A reader's add after a drop in its shard (a commit it may have read before) is not kept;
// one with no drop since its mark is. The same for a key across a clear (a prune).
func TestDurableCacheAddAfterDropIsRefused(t *testing.T) {
	c := newDurableCache(1 << 20)
	old := &projection.Task{ID: "t1"}
	_, m, ok := c.task("t1")
	if ok {
		t.Fatal("an empty cache answered")
	}
	c.invalidate(map[string]projection.Task{"t1": {}}, nil) // a commit wrote t1 after the mark
	c.addTask(old, m)
	if _, _, ok := c.task("t1"); ok {
		t.Fatal("a record read before a commit that wrote it was kept after the commit's drop")
	}
	_, m, _ = c.task("t1")
	c.addTask(old, m)
	if _, _, ok := c.task("t1"); !ok {
		t.Fatal("a record read with no drop since was not kept")
	}
	c.invalidate(map[string]projection.Task{"t1": {}}, nil)
	if _, _, ok := c.task("t1"); ok {
		t.Fatal("a committed write left its record in the cache")
	}

	k := durableKey{session: "s", key: "k"}
	_, m, _ = c.key(k)
	c.clear() // a prune freed the key after the mark
	c.addKey(k, "t1", m)
	if _, _, ok := c.key(k); ok {
		t.Fatal("a key read before a prune was kept after it")
	}
}

// The cache keeps no value a reader owns (longer than cachedValueMax), and stays within
// its bound.
func TestDurableCacheBounds(t *testing.T) {
	c := newDurableCache(durableShards * 4096)
	_, m, _ := c.task("big")
	c.addTask(&projection.Task{ID: "big", Input: make([]byte, cachedValueMax+1)}, m)
	if _, _, ok := c.task("big"); ok {
		t.Fatal("a task with an input longer than cachedValueMax was cached")
	}
	for i := range 10_000 {
		id := string(rune('a'+i%26)) + string(rune(i))
		_, m, _ := c.task(id)
		c.addTask(&projection.Task{ID: id, Input: make([]byte, 100)}, m)
	}
	for i := range c.shards {
		if sh := &c.shards[i]; sh.bytes > c.max {
			t.Fatalf("shard %d holds %d bytes, bound %d", i, sh.bytes, c.max)
		}
	}
}
