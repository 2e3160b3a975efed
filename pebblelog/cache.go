package pebblelog

import (
	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/projection"
)

// recordCache holds the task and wake records the writer committed most recently, so that the
// next commands on the same records (a claim after a submit, a finish after a claim, an ack
// after a claim, a duplicate submit) read them with a map lookup instead of a Pebble Get that
// walks the memtables and every level, plus a msgpack decode.
//
// Only the writer goroutine touches it, and only with the records of batches that Pebble
// accepted (applied to the memtable, in commit order), so it always equals the records the
// writer would read from the DB: the writer is the only one that writes them. It is bounded
// by an estimate of the bytes it holds (Options.RecordCacheSize); when full it drops
// arbitrary entries (Go's map iteration order), which is enough for a queue's access
// pattern: the records a command reads are nearly always ones written moments before.
type recordCache struct {
	max   int
	bytes int
	tasks map[string]projection.Task
	wakes map[string]projection.Wake
}

func newRecordCache(max int) *recordCache {
	return &recordCache{max: max, tasks: make(map[string]projection.Task), wakes: make(map[string]projection.Wake)}
}

func (c *recordCache) task(id string) (projection.Task, bool) {
	t, ok := c.tasks[id]
	return t, ok
}

func (c *recordCache) wake(id string) (projection.Wake, bool) {
	x, ok := c.wakes[id]
	return x, ok
}

// merge adds the records a committed batch wrote (its latest version of each).
func (c *recordCache) merge(tasks map[string]projection.Task, wakes map[string]projection.Wake) {
	if c.max <= 0 {
		return
	}
	for id, t := range tasks {
		if old, ok := c.tasks[id]; ok {
			c.bytes -= taskBytes(&old)
		}
		c.tasks[id] = t
		c.bytes += taskBytes(&t)
	}
	for id, x := range wakes {
		if old, ok := c.wakes[id]; ok {
			c.bytes -= wakeBytes(&old)
		}
		c.wakes[id] = x
		c.bytes += wakeBytes(&x)
	}
	c.evict()
}

// evict drops arbitrary entries, wakes and tasks in turn, until the estimate fits.
func (c *recordCache) evict() {
	for c.bytes > c.max && (len(c.tasks) > 0 || len(c.wakes) > 0) {
		for id, t := range c.tasks {
			c.bytes -= taskBytes(&t)
			delete(c.tasks, id)
			break
		}
		for id, x := range c.wakes {
			if c.bytes <= c.max {
				break
			}
			c.bytes -= wakeBytes(&x)
			delete(c.wakes, id)
			break
		}
	}
}

// recordOverhead approximates a record's fixed cost in the cache: the struct, its map slot
// and string headers.
const recordOverhead = 320

func taskBytes(t *projection.Task) int {
	return recordOverhead + len(t.ID) + len(t.SessionID) + len(t.Kind) + len(t.Input) +
		len(t.IdempotencyKey) + len(t.LeaseToken) + len(t.SettledToken) + len(t.CompletionWakeID) +
		outcomeBytes(&t.Outcome)
}

func wakeBytes(x *projection.Wake) int {
	return recordOverhead + len(x.ID) + len(x.SessionID) + len(x.Payload) + len(x.IdempotencyKey) +
		len(x.TaskID) + len(x.LeaseToken) + len(x.AckedToken) + outcomeBytes(&x.Outcome)
}

func outcomeBytes(o *events.Outcome) int {
	return len(o.Summary) + len(o.Output) + len(o.Error)
}
