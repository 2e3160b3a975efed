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
		{"LeaseMargin", c.LeaseMargin, 9 * time.Second / 5},
		{"Timeout", c.Timeout, time.Duration(0)}, // no limit
		{"KindTimeouts", c.KindTimeouts == nil, true},
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
	optionerr.FieldsCovered(t, Config{}, "Handlers", "Concurrency", "Prefetch", "LeaseFor", "Heartbeat", "LeaseMargin", "Timeout", "KindTimeouts", "MaxAttempts",
		"Backoff", "WakeHandler", "WakeConcurrency", "WakeLeaseFor", "WorkerID", "Logger", "Hooks", "WakeSessions")
}

// TestLeaseMarginDefault: the default margin is LeaseFor/5, or half of what a Heartbeat
// leaves of the lease when that is shorter (a margin of LeaseFor-Heartbeat or more is
// refused: TestConfigErrors).
func TestLeaseMarginDefault(t *testing.T) {
	q := work.NewInMemory()
	defer q.Close()
	h := map[string]Handler{"k": func(context.Context, work.Task) (json.RawMessage, error) { return nil, nil }}
	for _, c := range []struct{ lease, hb, want time.Duration }{
		{10 * time.Second, 0, 2 * time.Second},
		{10 * time.Second, 9 * time.Second, 500 * time.Millisecond},
		{2, 0, 0},
	} {
		r, err := New(q, Config{Handlers: h, Concurrency: 1, LeaseFor: c.lease, Heartbeat: c.hb})
		if err != nil {
			t.Fatal(err)
		}
		if r.cfg.LeaseMargin != c.want {
			t.Errorf("LeaseFor %v, Heartbeat %v: margin %v, want %v", c.lease, c.hb, r.cfg.LeaseMargin, c.want)
		}
	}
}

func between(d, lo, hi time.Duration) bool { return lo <= d && d <= hi }
