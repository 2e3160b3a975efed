package work

import (
	"errors"
	"fmt"
)

// The six kinds of error. Every error the API returns matches exactly one of them with
// errors.Is, and errors.As gives a *Error with the detail.
var (
	// ErrInvalidRequest: a blank id, kind or key, a non-positive lease or limit, invalid
	// JSON, an oversized value, a time out of range. Error.Field names the field.
	ErrInvalidRequest = errors.New("work: invalid request")
	// ErrTaskNotFound: no such task in this session. Error.ID names it.
	ErrTaskNotFound = errors.New("work: task not found")
	// ErrIdempotencyConflict: a key was reused for a different request; nothing was stored.
	// Error.Key names the key, Error.Field the first field of the intent that differs, and
	// Error.ID the task or wake the key already names.
	ErrIdempotencyConflict = errors.New("work: idempotency conflict")
	// ErrStaleDelivery: the delivery no longer owns its task or wake (it was claimed again,
	// settled, acknowledged, or never existed). Error.ID names it.
	ErrStaleDelivery = errors.New("work: stale delivery")
	// ErrInvalidTransition: e.g. settling the same delivery again with another outcome.
	ErrInvalidTransition = errors.New("work: invalid transition")
	// ErrBackend: storage failed, the queue is closed (wraps ErrClosed), or the context is
	// done (wraps ctx.Err()).
	ErrBackend = errors.New("work: backend failed")
)

// ErrClosed is wrapped inside the ErrBackend error of any call made after Close.
var ErrClosed = errors.New("work: queue closed")

// Error carries the detail of a failure. Kind is one of the six sentinels.
type Error struct {
	Kind    error  // one of the sentinels above
	Field   string // ErrIdempotencyConflict: the first differing field of the intent ("kind", "run_at", "wake", "input"; "payload" for a wake); ErrInvalidRequest: "session_id", "task_id", "wake_id", "kind", "idempotency_key", "lease_for", "limit", "input", "payload", "outcome", "output", "run_at", "now", "kinds", "sessions", "reason", "states", "phases", "requests", "priority", "headers"
	ID      string // ErrTaskNotFound, ErrStaleDelivery: the task or wake id; ErrIdempotencyConflict: the existing task or wake the key names
	Key     string // ErrIdempotencyConflict
	Message string
	cause   error // ErrBackend: ErrClosed, ctx.Err() or the storage error
}

// Error follows the seed's messages.
func (e *Error) Error() string {
	switch e.Kind {
	case ErrInvalidRequest:
		return fmt.Sprintf("invalid work request field %s: %s", e.Field, e.Message)
	case ErrTaskNotFound:
		return "task not found: " + e.ID
	case ErrIdempotencyConflict:
		msg := "idempotency key was reused for different work: " + e.Key
		if e.Field != "" {
			msg += " (" + e.Field + " differs from " + e.ID + ")"
		}
		return msg
	case ErrStaleDelivery:
		return "delivery no longer owns " + e.ID
	case ErrInvalidTransition:
		return "invalid work transition: " + e.Message
	case ErrBackend:
		return "work backend failed: " + e.Message
	}
	return e.Message
}

// Is matches the error's kind sentinel.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the cause of an ErrBackend error (ErrClosed, a context error, a storage
// error), or nil.
func (e *Error) Unwrap() error { return e.cause }

func invalid(field, message string) *Error {
	return &Error{Kind: ErrInvalidRequest, Field: field, Message: message}
}

func notFound(id string) *Error { return &Error{Kind: ErrTaskNotFound, ID: id} }

func conflict(key, field, id string) *Error {
	return &Error{Kind: ErrIdempotencyConflict, Key: key, Field: field, ID: id}
}

func stale(id string) *Error { return &Error{Kind: ErrStaleDelivery, ID: id} }

func badTransition(message string) *Error {
	return &Error{Kind: ErrInvalidTransition, Message: message}
}

// backendErr wraps cause as an ErrBackend error. A cause that is already a *Error of any
// kind is returned unchanged so that an error never matches two kinds.
func backendErr(cause error) error {
	if cause == nil {
		return nil
	}
	var we *Error
	if errors.As(cause, &we) {
		return cause
	}
	return &Error{Kind: ErrBackend, Message: cause.Error(), cause: cause}
}

// NewBackendError wraps a custom backend's failure as an ErrBackend error (seed:
// WorkError::backend).
func NewBackendError(cause error) error { return backendErr(cause) }
