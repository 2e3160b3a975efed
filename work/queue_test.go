package work_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

// spyBackend is a custom Backend that records which methods the Queue called and fails each
// with err.
type spyBackend struct {
	calls    []string
	err      error
	closeErr error
}

func (b *spyBackend) Submit(ctx context.Context, sessionID string, r work.TaskRequest, now time.Time) (work.Task, error) {
	b.calls = append(b.calls, "Submit")
	return work.Task{}, b.err
}

func (b *spyBackend) Task(ctx context.Context, sessionID, taskID string) (work.Task, bool, error) {
	b.calls = append(b.calls, "Task")
	return work.Task{}, false, b.err
}

func (b *spyBackend) Cancel(ctx context.Context, sessionID, taskID string, now time.Time) (work.Task, error) {
	b.calls = append(b.calls, "Cancel")
	return work.Task{}, b.err
}

func (b *spyBackend) ClaimDue(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]work.TaskDelivery, error) {
	b.calls = append(b.calls, "ClaimDue")
	return nil, b.err
}

func (b *spyBackend) Finish(ctx context.Context, d work.TaskDelivery, o work.Outcome, now time.Time) (work.Task, error) {
	b.calls = append(b.calls, "Finish")
	return work.Task{}, b.err
}

func (b *spyBackend) RequestWake(ctx context.Context, sessionID string, r work.WakeRequest, now time.Time) (work.Wake, error) {
	b.calls = append(b.calls, "RequestWake")
	return work.Wake{}, b.err
}

func (b *spyBackend) ClaimWakes(ctx context.Context, now time.Time, leaseFor time.Duration, limit int) ([]work.WakeDelivery, error) {
	b.calls = append(b.calls, "ClaimWakes")
	return nil, b.err
}

func (b *spyBackend) AckWake(ctx context.Context, d work.WakeDelivery) error {
	b.calls = append(b.calls, "AckWake")
	return b.err
}

func (b *spyBackend) Close() error {
	b.calls = append(b.calls, "Close")
	return b.closeErr
}

var now = time.Unix(100, 0)

// The seed validates in WorkQueue and SessionWork, before the backend is called.
func TestQueueValidatesBeforeTheBackend(t *testing.T) {
	ctx := context.Background()
	b := &spyBackend{}
	q := work.New(b)
	d := work.NewTaskDelivery(work.Task{ID: "task_1"}, 1, now, "token")
	invalid := []struct {
		field string
		call  func() error
	}{
		{"session_id", func() error { _, err := q.Session(" ").SubmitAt(ctx, work.TaskRequest{Kind: "k"}, now); return err }},
		{"kind", func() error { _, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: " "}, now); return err }},
		{"idempotency_key", func() error {
			_, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "k", IdempotencyKey: " "}, now)
			return err
		}},
		{"input", func() error {
			_, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "k", Input: json.RawMessage("{")}, now)
			return err
		}},
		{"run_at", func() error {
			_, err := q.Session("s").SubmitAt(ctx, work.TaskRequest{Kind: "k", RunAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}, now)
			return err
		}},
		{"task_id", func() error { _, _, err := q.Session("s").Task(ctx, ""); return err }},
		{"task_id", func() error { _, err := q.Session("s").CancelAt(ctx, "\t", now); return err }},
		{"payload", func() error {
			_, err := q.Session("s").WakeAt(ctx, work.WakeRequest{Payload: json.RawMessage("]")}, now)
			return err
		}},
		{"lease_for", func() error { _, err := q.ClaimDueAt(ctx, now, 0, 1); return err }},
		{"limit", func() error { _, err := q.ClaimWakesAt(ctx, now, time.Second, 0); return err }},
		{"outcome", func() error { _, err := q.FinishAt(ctx, d, work.Outcome{}, now); return err }},
		{"output", func() error { _, err := q.FinishAt(ctx, d, work.Success(json.RawMessage("{")), now); return err }},
		{"task_id", func() error { _, err := q.FinishAt(ctx, work.TaskDelivery{}, work.Success(nil), now); return err }},
	}
	for _, c := range invalid {
		err := c.call()
		var we *work.Error
		if !errors.As(err, &we) || we.Kind != work.ErrInvalidRequest || we.Field != c.field {
			t.Errorf("got %v, want an invalid %s", err, c.field)
		}
	}
	if len(b.calls) != 0 {
		t.Errorf("invalid requests reached the backend: %v", b.calls)
	}
}

func TestQueueOverACustomBackend(t *testing.T) {
	ctx := context.Background()
	cause := errors.New("disk full")
	b := &spyBackend{err: cause}
	q := work.New(b)
	s := q.Session("session_1")
	if s.ID() != "session_1" {
		t.Errorf("Session.ID() = %q", s.ID())
	}
	calls := []func() error{
		func() error { _, err := s.SubmitAt(ctx, work.TaskRequest{Kind: "k"}, now); return err },
		func() error { _, _, err := s.Task(ctx, "task_1"); return err },
		func() error { _, err := s.CancelAt(ctx, "task_1", now); return err },
		func() error { _, err := s.WakeAt(ctx, work.WakeRequest{}, now); return err },
		func() error { _, err := q.ClaimDueAt(ctx, now, time.Second, 1); return err },
		func() error {
			_, err := q.FinishAt(ctx, work.NewTaskDelivery(work.Task{ID: "task_1"}, 1, now, "t"), work.Success(nil), now)
			return err
		},
		func() error { _, err := q.ClaimWakesAt(ctx, now, time.Second, 1); return err },
		func() error { return q.AckWakeAt(ctx, work.NewWakeDelivery(work.Wake{ID: "wake_1"}, 1, now, "t"), now) },
	}
	// A plain error from a custom backend becomes an ErrBackend error that wraps it.
	for _, call := range calls {
		err := call()
		if !errors.Is(err, work.ErrBackend) || !errors.Is(err, cause) {
			t.Errorf("got %v, want an ErrBackend error wrapping %v", err, cause)
		}
		if _, problem := worktest.CheckError(err); problem != nil {
			t.Error(problem)
		}
	}
	want := "Submit Task Cancel RequestWake ClaimDue Finish ClaimWakes AckWake"
	if got := strings.Join(b.calls, " "); got != want {
		t.Errorf("backend calls %s, want %s (AckWakeAt without a timed ack calls AckWake)", got, want)
	}

	// An error that already has a kind passes through unchanged.
	b.err = &work.Error{Kind: work.ErrTaskNotFound, ID: "task_1"}
	for _, call := range calls {
		if err := call(); err != b.err {
			t.Errorf("got %v, want the backend's %v", err, b.err)
		}
	}

	// A custom backend keeps no log.
	for _, err := range []error{
		q.ReadLog(ctx, 0, func(events.Event) error { return nil }),
		q.Verify(ctx),
	} {
		if !errors.Is(err, work.ErrBackend) {
			t.Errorf("got %v, want ErrBackend", err)
		}
	}
}

func TestQueueCloseOverACustomBackend(t *testing.T) {
	ctx := context.Background()
	closeErr := errors.New("flush failed")
	b := &spyBackend{closeErr: closeErr}
	q := work.New(b)
	err := q.Close()
	if !errors.Is(err, work.ErrBackend) || !errors.Is(err, closeErr) {
		t.Errorf("Close = %v, want an ErrBackend error wrapping %v", err, closeErr)
	}
	if err := q.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := q.ClaimDueAt(ctx, now, time.Second, 1); !errors.Is(err, work.ErrBackend) || !errors.Is(err, work.ErrClosed) {
		t.Errorf("a claim after Close = %v", err)
	}
	if got := strings.Join(b.calls, " "); got != "Close" {
		t.Errorf("backend calls %s, want one Close", got)
	}
	if work.BackendOf(q) != work.Backend(b) {
		t.Error("Backend() is not the backend the queue was made with")
	}
}
