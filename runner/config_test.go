package runner

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/work"
)

// TestConfigDefaults: every zero optional field of Config takes its documented default
// (TestConfigErrors refuses every field out of range), and every field is in one of the two
// tables.
func TestConfigDefaults(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	h := map[string]Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }}
	r, err := New(q, Config{Handlers: h, Concurrency: 2, LeaseFor: 9 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := r.cfg
	for _, d := range []struct {
		field     string
		got, want any
	}{
		{"Prefetch", c.Prefetch, 0},
		{"Heartbeat", c.Heartbeat, 3 * time.Second},
		{"Heartbeat (runner)", r.heartbeat, 3 * time.Second},
		{"MaxAttempts", c.MaxAttempts, DefaultMaxAttempts},
		{"MaxAttempts (runner)", r.maxAttempts, uint32(DefaultMaxAttempts)},
		{"Backoff (first)", between(c.Backoff(1, nil), DefaultBackoffBase/2, DefaultBackoffBase), true},
		{"Backoff (last)", between(c.Backoff(1000, nil), DefaultBackoffMax/2, DefaultBackoffMax), true},
		{"WakeConcurrency", c.WakeConcurrency, DefaultWakeConcurrency},
		{"WakeLeaseFor", c.WakeLeaseFor, 9 * time.Second},
		{"WorkerID", c.WorkerID, ""}, // work.DefaultWorker() at each claim
		{"Logger", r.log, slog.Default()},
		{"Hooks", r.hooks, Hooks(NoHooks{})},
		{"WakeHandler", c.WakeHandler == nil, true},
		{"WakeSessions", c.WakeSessions == nil, true}, // every session's wakes; refusals: TestWakeSessionsRunner
	} {
		if d.got != d.want {
			t.Errorf("default %s = %v, want %v", d.field, d.got, d.want)
		}
	}
	// Handlers, Concurrency, LeaseFor: required (TestConfigErrors).
	optionerr.FieldsCovered(t, Config{}, "Handlers", "Concurrency", "Prefetch", "LeaseFor", "Heartbeat", "MaxAttempts",
		"Backoff", "WakeHandler", "WakeConcurrency", "WakeLeaseFor", "WorkerID", "Logger", "Hooks", "WakeSessions")
}

func between(d, lo, hi time.Duration) bool { return lo <= d && d <= hi }
