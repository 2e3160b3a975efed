package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
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
