package work

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"

	"github.com/worklog/worklog/events"
)

// Limits on what the in-memory backend and the durable store accept. Options.MaxValueBytes
// changes the value limit of a durable store.
const (
	// DefaultMaxValueBytes bounds one JSON value (input, payload, output): 1 MiB.
	DefaultMaxValueBytes = 1 << 20
	// maxTextBytes bounds ids, kinds, keys, summaries and error messages.
	maxTextBytes = 64 << 10
)

func blank(s string) bool { return strings.TrimFunc(s, unicode.IsSpace) == "" }

func validateNonBlank(field, v string) *Error {
	if blank(v) {
		return invalid(field, "must not be blank")
	}
	if len(v) > maxTextBytes {
		return invalid(field, fmt.Sprintf("is %d bytes, more than the limit of %d", len(v), maxTextBytes))
	}
	return nil
}

func validateKey(key string) *Error {
	if key == "" {
		return nil
	}
	return validateNonBlank("idempotency_key", key)
}

func validateJSON(field string, v json.RawMessage, max int) *Error {
	if v == nil {
		return nil
	}
	if len(v) > max {
		return invalid(field, fmt.Sprintf("is %d bytes, more than the limit of %d", len(v), max))
	}
	if !json.Valid(v) {
		return invalid(field, "must be valid JSON")
	}
	return nil
}

func validateText(field, v string) *Error {
	if len(v) > maxTextBytes {
		return invalid(field, fmt.Sprintf("is %d bytes, more than the limit of %d", len(v), maxTextBytes))
	}
	return nil
}

// The instants worklog can store: Unix nanoseconds in an int64, years 1678 to 2262.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

func nanos(field string, t time.Time) (int64, *Error) {
	if t.Before(minTime) || t.After(maxTime) {
		return 0, invalid(field, "is outside the time range worklog stores (years 1678 to 2262)")
	}
	return t.UnixNano(), nil
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// leaseExpiry is now+d, or an error when it leaves the time range; a claim then claims nothing.
func leaseExpiry(now int64, d time.Duration) (int64, *Error) {
	if d > 0 && now > math.MaxInt64-int64(d) {
		return 0, invalid("lease_for", "lease expiration is outside the time range")
	}
	return now + int64(d), nil
}

func validateClaim(leaseFor time.Duration, limit int) *Error {
	if leaseFor <= 0 {
		return invalid("lease_for", "must be positive")
	}
	if limit <= 0 {
		return invalid("limit", "must be positive")
	}
	return nil
}

func validateTaskRequest(r *TaskRequest, maxValue int) *Error {
	if err := validateNonBlank("kind", r.Kind); err != nil {
		return err
	}
	if err := validateKey(r.IdempotencyKey); err != nil {
		return err
	}
	if strings.HasPrefix(r.IdempotencyKey, schedulePrefix) {
		return invalid("idempotency_key", "the prefix "+schedulePrefix+" is the schedules' (Session.SetSchedule)")
	}
	if err := validateJSON("input", r.Input, maxValue); err != nil {
		return err
	}
	if !r.RunAt.IsZero() {
		if _, err := nanos("run_at", r.RunAt); err != nil {
			return err
		}
	}
	if r.Priority < events.MinPriority || r.Priority > events.MaxPriority {
		return invalid("priority", fmt.Sprintf("%d is not in %d..%d", r.Priority, events.MinPriority, events.MaxPriority))
	}
	if msg := events.CheckHeaders(r.Headers); msg != "" {
		return invalid("headers", msg)
	}
	return nil
}

func validateWakeRequest(r *WakeRequest, maxValue int) *Error {
	if err := validateKey(r.IdempotencyKey); err != nil {
		return err
	}
	return validateJSON("payload", r.Payload, maxValue)
}

func validateOutcome(o *Outcome, maxValue int) *Error {
	switch o.State {
	case TaskSucceeded:
		if o.Error != "" {
			return invalid("outcome", "a success carries no error message")
		}
		if err := validateText("outcome", o.Summary); err != nil {
			return err
		}
		return validateJSON("output", o.Output, maxValue)
	case TaskFailed:
		if o.Summary != "" || o.Output != nil {
			return invalid("outcome", "a failure carries only its error message")
		}
		return validateText("outcome", o.Error)
	case TaskCanceled:
		if o.Summary != "" || o.Output != nil || o.Error != "" {
			return invalid("outcome", "a cancellation carries no summary, output or error")
		}
		return nil
	}
	return invalid("outcome", fmt.Sprintf("state %s is not terminal", o.State))
}

// sameJSON compares two JSON texts as values: object key order and whitespace do not
// matter, numbers compare by their literal text (1 and 1.0 differ, as in the seed).
// Both texts have been validated before they were stored.
func sameJSON(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	ca, errA := canonicalJSON(a)
	cb, errB := canonicalJSON(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

// canonicalJSON re-encodes a JSON text with sorted object keys and no whitespace, keeping
// number literals as written. Duplicate object keys: the last wins, as in serde_json.
func canonicalJSON(b []byte) ([]byte, error) {
	if len(b) == 0 {
		b = []byte("null")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // maps encode with sorted keys; json.Number as written
		return nil, err
	}
	return buf.Bytes(), nil
}
