package worktest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/worklog/worklog/work"
)

// Kinds are the six error kinds of package work; every error the API returns matches
// exactly one of them.
var Kinds = []error{
	work.ErrInvalidRequest,
	work.ErrTaskNotFound,
	work.ErrIdempotencyConflict,
	work.ErrStaleDelivery,
	work.ErrInvalidTransition,
	work.ErrBackend,
}

// CheckError checks err against the error rules of package work: it matches exactly one of
// Kinds with errors.Is, errors.As gives a *work.Error whose Kind is that sentinel and whose
// detail is set, and its text is the seed's message for the kind
// ("invalid work request field F: M", "task not found: ID",
// "idempotency key was reused for different work: KEY (FIELD differs from ID)", "delivery no longer owns ID",
// "invalid work transition: M", "work backend failed: M"). It returns the detail, and an
// error describing the first rule broken, if any. The detail is nil when errors.As finds none.
func CheckError(err error) (*work.Error, error) {
	if err == nil {
		return nil, errors.New("no error")
	}
	var matched []error
	for _, k := range Kinds {
		if errors.Is(err, k) {
			matched = append(matched, k)
		}
	}
	var we *work.Error
	if !errors.As(err, &we) {
		we = nil
	}
	if len(matched) != 1 {
		return we, fmt.Errorf("matches %d kinds %v, want exactly one", len(matched), matched)
	}
	if we == nil {
		return nil, errors.New("errors.As finds no *work.Error")
	}
	if we.Kind != matched[0] {
		return we, fmt.Errorf("matches %v but its *work.Error has Kind %v", matched[0], we.Kind)
	}
	text := err.Error()
	var want string
	switch we.Kind {
	case work.ErrInvalidRequest:
		if we.Field == "" {
			return we, errors.New("invalid request without a Field")
		}
		want = "invalid work request field " + we.Field + ": " + we.Message
	case work.ErrTaskNotFound:
		want = "task not found: " + we.ID
	case work.ErrIdempotencyConflict:
		if we.Key == "" {
			return we, errors.New("idempotency conflict without a Key")
		}
		if we.Field == "" || we.ID == "" {
			return we, errors.New("idempotency conflict without the differing Field and the existing ID")
		}
		want = "idempotency key was reused for different work: " + we.Key + " (" + we.Field + " differs from " + we.ID + ")"
	case work.ErrStaleDelivery:
		want = "delivery no longer owns " + we.ID
	case work.ErrInvalidTransition:
		want = "invalid work transition: " + we.Message
	case work.ErrBackend:
		if !strings.HasPrefix(text, "work backend failed: ") {
			return we, fmt.Errorf("text %q lacks the prefix %q", text, "work backend failed: ")
		}
		return we, nil
	}
	if text != want {
		return we, fmt.Errorf("text %q, want %q", text, want)
	}
	return we, nil
}
