package runner

import (
	"errors"
	"fmt"
	"strings"
)

// ErrStopped is returned by Start on a runner that was stopped.
var ErrStopped = errors.New("runner: stopped")

// ErrStarted is returned by Start on a runner already started.
var ErrStarted = errors.New("runner: already started")

// permanentError marks a handler's error as final: the task fails without a retry.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks err as permanent: a handler returning it (or an error wrapping it) fails
// its task at once, without a retry. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// PanicError is the error a handler's panic turns into: it is treated as any other error
// (a retry, or a failure on the last attempt), and its message, which the log records,
// includes the stack.
type PanicError struct {
	Value any
	Stack []byte
}

func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v\n\n%s", p.Value, p.Stack) }

// Causes of a handler's context cancellation (context.Cause).
var (
	ErrCancelRequested = errors.New("runner: a cancel of the task was requested")
	ErrLeaseLost       = errors.New("runner: the task's lease was lost")
	ErrStopping        = errors.New("runner: stopping, the task is released")
)

// maxMessage bounds the error text recorded with a failure or a release (the queue takes
// 64 KiB); a panic's stack is cut to fit.
const maxMessage = 16 << 10

// message is err's text as the queue records it: cut to maxMessage bytes of valid UTF-8.
func message(err error) string {
	s := err.Error()
	if len(s) > maxMessage {
		s = strings.ToValidUTF8(s[:maxMessage], "") + " [cut]"
	}
	return s
}
