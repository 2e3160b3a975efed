package work_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/worklog/worklog/work"
	"github.com/worklog/worklog/work/worktest"
)

func TestErrorText(t *testing.T) {
	for _, c := range []struct {
		err  *work.Error
		want string
	}{
		{&work.Error{Kind: work.ErrInvalidRequest, Field: "kind", Message: "must not be blank"}, "invalid work request field kind: must not be blank"},
		{&work.Error{Kind: work.ErrTaskNotFound, ID: "task_1"}, "task not found: task_1"},
		{&work.Error{Kind: work.ErrIdempotencyConflict, Key: "export-42", Field: "run_at", ID: "task_1"}, "idempotency key was reused for different work: export-42 (run_at differs from task_1)"},
		{&work.Error{Kind: work.ErrStaleDelivery, ID: "wake_1"}, "delivery no longer owns wake_1"},
		{&work.Error{Kind: work.ErrInvalidTransition, Message: "already settled"}, "invalid work transition: already settled"},
		{&work.Error{Kind: work.ErrBackend, Message: "disk full"}, "work backend failed: disk full"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
		if _, problem := worktest.CheckError(c.err); problem != nil {
			t.Errorf("%q: %v", c.err, problem)
		}
		for _, k := range worktest.Kinds {
			if got := errors.Is(c.err, k); got != (k == c.err.Kind) {
				t.Errorf("errors.Is(%q, %v) = %v", c.err, k, got)
			}
		}
	}
}

func TestNewBackendError(t *testing.T) {
	if work.NewBackendError(nil) != nil {
		t.Error("NewBackendError(nil) is not nil")
	}
	cause := errors.New("disk full")
	err := work.NewBackendError(cause)
	if !errors.Is(err, work.ErrBackend) || !errors.Is(err, cause) || err.Error() != "work backend failed: disk full" {
		t.Errorf("NewBackendError(%v) = %v", cause, err)
	}
	if _, problem := worktest.CheckError(err); problem != nil {
		t.Error(problem)
	}
	// Context errors and ErrClosed are causes inside ErrBackend, never kinds of their own.
	for _, c := range []error{context.Canceled, context.DeadlineExceeded, work.ErrClosed} {
		err := work.NewBackendError(c)
		if !errors.Is(err, c) {
			t.Errorf("%v does not wrap %v", err, c)
		}
		if _, problem := worktest.CheckError(err); problem != nil {
			t.Errorf("%v: %v", err, problem)
		}
	}
	// An error that already has a kind keeps it, so that no error matches two kinds.
	nf := &work.Error{Kind: work.ErrTaskNotFound, ID: "task_1"}
	if got := work.NewBackendError(nf); got != error(nf) {
		t.Errorf("NewBackendError of a kinded error = %v, want it unchanged", got)
	}
	wrapped := fmt.Errorf("lookup: %w", nf)
	got := work.NewBackendError(wrapped)
	if errors.Is(got, work.ErrBackend) || !errors.Is(got, work.ErrTaskNotFound) {
		t.Errorf("NewBackendError of a wrapped kinded error = %v", got)
	}
}

func TestCheckErrorRejects(t *testing.T) {
	for _, err := range []error{
		nil,
		errors.New("plain"),
		work.ErrClosed,
		&work.Error{Kind: work.ErrInvalidRequest, Message: "no field"},
		&work.Error{Kind: work.ErrIdempotencyConflict},
		&work.Error{Kind: errors.New("not a kind"), Message: "x"},
		errors.Join(&work.Error{Kind: work.ErrTaskNotFound, ID: "a"}, &work.Error{Kind: work.ErrStaleDelivery, ID: "a"}),
		fmt.Errorf("context: %w", &work.Error{Kind: work.ErrTaskNotFound, ID: "a"}),
	} {
		if _, problem := worktest.CheckError(err); problem == nil {
			t.Errorf("CheckError(%v) found nothing wrong", err)
		}
	}
}
