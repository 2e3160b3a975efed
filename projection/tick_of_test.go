package projection

import (
	"testing"
	"time"
)

// TickOf finds a tick's schedule from its task's key and RunAt, whatever the name holds
// (colons included), and nothing in any other key.
func TestTickOf(t *testing.T) {
	tick := time.Date(2026, 3, 1, 12, 1, 0, 0, time.UTC).UnixNano()
	for _, c := range []struct {
		task Task
		name string
		ok   bool
	}{
		{Task{HasRunAt: true, RunAt: tick, IdempotencyKey: TickKey("daily", tick)}, "daily", true},
		{Task{HasRunAt: true, RunAt: tick, IdempotencyKey: TickKey("a:b:2026", tick)}, "a:b:2026", true},
		{Task{HasRunAt: true, RunAt: tick + int64(time.Second), IdempotencyKey: TickKey("daily", tick)}, "", false},
		{Task{HasRunAt: false, RunAt: tick, IdempotencyKey: TickKey("daily", tick)}, "", false},
		{Task{HasRunAt: true, RunAt: tick, IdempotencyKey: "daily:2026-03-01T12:01:00Z"}, "", false},
		{Task{HasRunAt: true, RunAt: tick, IdempotencyKey: "schedule::2026-03-01T12:01:00Z"}, "", false},
	} {
		if name, ok := TickOf(&c.task); name != c.name || ok != c.ok {
			t.Errorf("TickOf(key %q, RunAt %d) = %q, %v; want %q, %v", c.task.IdempotencyKey, c.task.RunAt, name, ok, c.name, c.ok)
		}
	}
	if got, want := TickKey("daily", tick), "schedule:daily:2026-03-01T12:01:00Z"; got != want {
		t.Errorf("TickKey = %q, want %q (work.TickKey's format)", got, want)
	}
}
