package runner

import (
	"errors"
	"fmt"
	"strings"
	"time"
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
// (a retry, or a failure on the last attempt). Its message, which the log records, includes
// the whole stack; what the queue records (a release's reason, a failure's message) is only
// the panic's value and the frame that panicked (Summary), so that a task that keeps
// panicking does not write a stack into the log on every retry.
type PanicError struct {
	Value any
	Stack []byte
}

func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v\n\n%s", p.Value, p.Stack) }

// Summary is the panic's value and the frame that panicked ("panic: v\n\tat f (file:line)"),
// at most maxPanicSummary bytes.
func (p *PanicError) Summary() string {
	s := cut(fmt.Sprintf("panic: %v", p.Value), maxPanicSummary/2)
	if fn, at := panicFrame(p.Stack); fn != "" {
		s += "\n\tat " + fn + " (" + at + ")"
	}
	return cut(s, maxPanicSummary)
}

// panicFrame finds, in a goroutine stack as debug.Stack prints it, the first frame below
// the call to panic that is not the runtime's (a nil dereference passes through
// runtime.sigpanic): the function that panicked and its file:line.
func panicFrame(stack []byte) (fn, at string) {
	lines := strings.Split(string(stack), "\n")
	i := 0
	for i < len(lines) && !strings.HasPrefix(lines[i], "panic(") {
		i++
	}
	for i += 2; i+1 < len(lines); i += 2 {
		if strings.HasPrefix(lines[i], "runtime.") {
			continue
		}
		at = strings.TrimSpace(lines[i+1])
		if j := strings.LastIndex(at, " +0x"); j > 0 {
			at = at[:j]
		}
		fn = lines[i]
		if j := strings.LastIndexByte(fn, '('); j > 0 {
			fn = fn[:j]
		}
		return fn, at
	}
	return "", ""
}

// Causes of a handler's context cancellation (context.Cause, errors.Is).
var (
	ErrCancelRequested = errors.New("runner: a cancel of the task was requested")
	// ErrLeaseLost: a heartbeat found the task claimed by another worker (or settled).
	ErrLeaseLost = errors.New("runner: the task's lease was lost")
	ErrStopping  = errors.New("runner: stopping, the task is released")
	// ErrLeaseExpired: the lease could not be extended (the queue could not be reached) and
	// runs out within Config.LeaseMargin; another worker may claim the task once it has. The
	// runner records nothing of the attempt (TaskResult: LeaseLost, with this error).
	ErrLeaseExpired = errors.New("runner: the task's lease could not be extended and is running out")
	// ErrTimeout: the attempt ran past its time limit (Config.Timeout, KindTimeouts). The
	// cause is an error that wraps it and says the limit: "runner: timeout after 30s".
	ErrTimeout = errors.New("runner: timeout")
)

// timeoutError is the cause of an attempt that ran past its limit d.
func timeoutError(d time.Duration) error { return fmt.Errorf("%w after %v", ErrTimeout, d) }

// What the queue records of an error, in bytes (the queue takes up to 64 KiB): a failure's
// message is cut to maxMessage, a release's reason, written again on every retry, to
// maxReason, and a panic is recorded as its value and the frame that panicked (the whole
// stack goes to the log).
const (
	maxMessage      = 16 << 10
	maxReason       = 1 << 10
	maxPanicSummary = 512
)

// message is err's text as a failure records it.
func message(err error) string { return errorText(err, maxMessage) }

// reason is err's text as a release records it.
func reason(err error) string { return errorText(err, maxReason) }

// errorText is err's text cut to limit bytes, a panic's by its Summary.
func errorText(err error, limit int) string {
	if p, ok := err.(*PanicError); ok {
		return cut(p.Summary(), limit)
	}
	var p *PanicError
	if errors.As(err, &p) {
		// A wrapped panic: the wrapper's text up to the stack.
		s := err.Error()
		if i := strings.Index(s, "\n\ngoroutine "); i >= 0 {
			s = s[:i]
		}
		return cut(s, limit)
	}
	return cut(err.Error(), limit)
}

// cut shortens s to at most limit bytes of valid UTF-8, marking the cut.
func cut(s string, limit int) string {
	const mark = " [cut]"
	if len(s) <= limit {
		return s
	}
	return strings.ToValidUTF8(s[:limit-len(mark)], "") + mark
}

// StopError is Stop's account of what it could not do: tasks it released because ctx ended
// while their handlers ran, wake handlers it canceled, and results it could not record (the
// queue was closed, the store failed, or it stopped answering). errors.Is matches ctx's error
// (Err) and the store's (StoreErr: work.ErrClosed, work.ErrBackend, ...).
type StopError struct {
	Released      int   // tasks whose handlers were still running when ctx ended: canceled and released
	WakesCanceled int   // wake handlers still running when ctx ended: canceled, their wakes unacknowledged
	Unrecorded    int   // results not recorded: those tasks are delivered again when their leases expire
	Abandoned     bool  // a call to the queue was still going StopGrace after Stop gave up on it
	Err           error // ctx's error when ctx ended first
	StoreErr      error // why the first unrecorded result was not recorded
}

func (e *StopError) Error() string {
	var parts []string
	if e.Released > 0 {
		parts = append(parts, fmt.Sprintf("%d task(s) still running were released", e.Released))
	}
	if e.WakesCanceled > 0 {
		parts = append(parts, fmt.Sprintf("%d wake handler(s) still running were canceled", e.WakesCanceled))
	}
	if e.Unrecorded > 0 {
		parts = append(parts, fmt.Sprintf("%d result(s) could not be recorded (their tasks are delivered again when their leases expire): %v",
			e.Unrecorded, e.StoreErr))
	}
	if e.Abandoned {
		parts = append(parts, "a call to the queue did not return and was left behind")
	}
	s := "runner: stop: " + strings.Join(parts, "; ")
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ctx's error and the store's.
func (e *StopError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Err, e.StoreErr} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
