package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// ctxKey marks the context a TaskStart hook returned.
type ctxKey struct{}

// ctxHooks puts the task's id in the context the handler and the runner's log records get.
type ctxHooks struct{ *recordingHooks }

func (h ctxHooks) TaskStart(ctx context.Context, d work.TaskDelivery) context.Context {
	return context.WithValue(h.recordingHooks.TaskStart(ctx, d), ctxKey{}, d.Task.ID)
}

// captureHandler keeps every record with the ctxKey value of its context.
type captureHandler struct {
	mu      *sync.Mutex
	records *[]captured
}

type captured struct {
	msg   string
	attrs map[string]any
	ctxID any
}

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h captureHandler) WithGroup(string) slog.Handler            { return h }
func (h captureHandler) Handle(ctx context.Context, r slog.Record) error {
	c := captured{msg: r.Message, attrs: map[string]any{}, ctxID: ctx.Value(ctxKey{})}
	r.Attrs(func(a slog.Attr) bool { c.attrs[a.Key] = a.Value.Any(); return true })
	h.mu.Lock()
	*h.records = append(*h.records, c)
	h.mu.Unlock()
	return nil
}

// TestTaskLogRecordsCarryTheTaskAndItsContext: a task's log records name task_id, session,
// kind and attempt, and are logged with the context TaskStart returned (where a tracing
// hook's span lives), so a handler wrapping slog can add the trace id.
func TestTaskLogRecordsCarryTheTaskAndItsContext(t *testing.T) {
	q := openQueue(t)
	var mu sync.Mutex
	var recs []captured
	h := newHooks()
	start(t, q, runner.Config{
		Handlers: map[string]runner.Handler{"boom": func(context.Context, work.Task) (json.RawMessage, error) {
			return nil, runner.Permanent(errors.New("no"))
		}},
		Concurrency: 1, LeaseFor: time.Minute,
		Logger: slog.New(captureHandler{&mu, &recs}),
		Hooks:  ctxHooks{h},
	})
	task, err := q.Session("s-log").Submit(context.Background(), work.TaskRequest{Kind: "boom"})
	if err != nil {
		t.Fatal(err)
	}
	h.next(t)
	mu.Lock()
	defer mu.Unlock()
	for _, c := range recs {
		if c.msg != "runner: task failed" {
			continue
		}
		want := map[string]any{"task_id": task.ID, "session": "s-log", "kind": "boom", "attempt": uint64(1)}
		for k, v := range want {
			got := c.attrs[k]
			if n, ok := got.(uint64); ok && v == uint64(1) {
				got = n
			}
			if got != v {
				t.Errorf("record %q: %s = %v (%T), want %v", c.msg, k, c.attrs[k], c.attrs[k], v)
			}
		}
		if c.ctxID != task.ID {
			t.Errorf("record %q was logged without the context TaskStart returned (ctx value %v)", c.msg, c.ctxID)
		}
		return
	}
	t.Fatalf("no \"runner: task failed\" record among %d", len(recs))
}

// Issue 45.4: the runner's log reads well in JSON: results are words, durations are seconds
// with the unit in the key (never a Duration's nanoseconds), ids are strings; a retry is
// INFO, a failure on the last attempt WARN, a permanent failure ERROR.
func TestLogRecordsAreTypedForJSON(t *testing.T) {
	q := openQueue(t)
	var logs syncBuffer
	h := newHooks()
	r := start(t, q, runner.Config{
		Handlers: map[string]runner.Handler{
			"flaky": func(context.Context, work.Task) (json.RawMessage, error) { return nil, errors.New("try again") },
			"boom": func(context.Context, work.Task) (json.RawMessage, error) {
				return nil, runner.Permanent(errors.New("no"))
			},
		},
		Concurrency: 2, LeaseFor: time.Minute, MaxAttempts: 2, Hooks: h,
		Backoff: func(uint32, error) time.Duration { return time.Millisecond },
		Logger:  slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	flaky, boom := submit(t, q, "flaky", "1"), submit(t, q, "boom", "1")
	for range 3 {
		h.next(t)
	}
	if _, err := stopWithin(t, r, context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	type rec = map[string]any
	var recs []rec
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m rec
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		recs = append(recs, m)
	}
	find := func(msg, id string) rec {
		t.Helper()
		for _, m := range recs {
			if m["msg"] == msg && (id == "" || m["task_id"] == id) {
				return m
			}
		}
		t.Fatalf("no record %q of %q in:\n%s", msg, id, logs.String())
		return nil
	}
	for _, c := range []struct {
		msg, id, level, result string
	}{
		{"runner: task will be retried", flaky.ID, "INFO", "retried"},
		{"runner: task failed on its last attempt", flaky.ID, "WARN", "failed"},
		{"runner: task failed", boom.ID, "ERROR", "failed"},
	} {
		m := find(c.msg, c.id)
		if m["level"] != c.level || m["result"] != c.result {
			t.Errorf("%q: level %v, result %v (%T); want %s, %q", c.msg, m["level"], m["result"], m["result"], c.level, c.result)
		}
		if _, ok := m["task_id"].(string); !ok {
			t.Errorf("%q: task_id %v (%T), want a string", c.msg, m["task_id"], m["task_id"])
		}
		if d, ok := m["duration_seconds"].(float64); !ok || d <= 0 || d > 60 {
			t.Errorf("%q: duration_seconds %v (%T), want seconds", c.msg, m["duration_seconds"], m["duration_seconds"])
		}
	}
	if d, ok := find("runner: task will be retried", flaky.ID)["retry_in_seconds"].(float64); !ok || d < 0 || d > 1 {
		t.Errorf("retry_in_seconds %v, want seconds", d)
	}
	started := find("runner: started", "")
	if started["lease_seconds"] != 60.0 || started["lease"] != nil || started["lease_margin_seconds"] != 12.0 {
		t.Errorf("runner: started: lease_seconds %v, lease_margin_seconds %v, lease %v; want 60 and 12 seconds, no nanoseconds",
			started["lease_seconds"], started["lease_margin_seconds"], started["lease"])
	}
}
