package work

import "testing"

// TestEngineCapsResolved: the optional interfaces each of work's engines has are found when
// its queue is built (engineCaps), and worklog's backend offers every Backend capability, so
// a capability cannot be lost on the way to the queue (Prune answered "not supported" on
// every backend for a round when a wrapper hid them). postgres's TestServerClockDecides and
// pruner tests cover its engine.
func TestEngineCapsResolved(t *testing.T) {
	mem := NewInMemory()
	defer mem.Close()
	durable, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer durable.Close()
	for _, c := range []struct {
		name                                string
		q                                   *Queue
		pruner, watcher, stager, after, peb bool
	}{
		{"in-memory", mem, true, false, false, false, false},
		{"pebble", durable, true, false, true, true, true},
	} {
		lb := c.q.b.(*logBackend)
		got := lb.caps
		if (got.pruner != nil) != c.pruner || (got.watcher != nil) != c.watcher || (got.stager != nil) != c.stager ||
			(got.after != nil) != c.after || (got.checkpoint != nil) != c.peb {
			t.Errorf("%s: engine caps %+v", c.name, got)
		}
		bc := c.q.caps
		if bc.running == nil || bc.ackAt == nil || bc.log == nil || bc.verify == nil || bc.prune == nil ||
			bc.wait == nil || bc.checkpoint == nil || bc.clock == nil || bc.session == nil {
			t.Errorf("%s: backend caps %+v: worklog's backend lacks one", c.name, bc)
		}
	}
}
