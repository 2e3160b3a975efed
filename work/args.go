package work

import (
	"encoding/json"
	"fmt"
	"reflect"
)

// Args is a typed task input: Kind names its task kind; the value is encoded as JSON.
//
// A type that implements Args names its kind once, where it is declared:
//
//	type ThumbnailArgs struct {
//		Image string `json:"image"`
//	}
//
//	func (ThumbnailArgs) Kind() string { return "thumbnail" }
//
// RequestFor turns a value into a TaskRequest, DecodeInput turns a claimed Task's input back
// into the value, and runner.Typed runs a handler on the decoded value.
type Args interface{ Kind() string }

// RequestFor is the TaskRequest for a: Kind a.Kind(), Input a as JSON; the caller may set
// the other fields (key, run time, priority, wake, headers) on the result.
//
// A value that does not encode as JSON, or whose Kind is blank, is an ErrInvalidRequest
// naming "input" or "kind"; Submit validates the rest (the input's size, the kind's length)
// as for any request.
func RequestFor(a Args) (TaskRequest, error) {
	if a == nil || isNilPointer(a) {
		return TaskRequest{}, invalid("input", "RequestFor was given a nil Args")
	}
	kind := a.Kind()
	if blank(kind) {
		return TaskRequest{}, invalid("kind", fmt.Sprintf("%T.Kind() returned a blank kind", a))
	}
	input, err := json.Marshal(a)
	if err != nil {
		return TaskRequest{}, invalid("input", fmt.Sprintf("kind %q: %T does not encode as JSON: %v", kind, a, err))
	}
	return TaskRequest{Kind: kind, Input: input}, nil
}

// DecodeInput decodes t.Input into an A; an input that does not decode (or a kind that is
// not A's, when A implements Args) is an ErrInvalidRequest naming "input" and the kind.
//
// An empty input (a task submitted without one) decodes as A's zero value. Fields of the
// input that A does not have are ignored, as encoding/json does, so that a new field in a
// newer producer's input does not fail an older worker's tasks.
func DecodeInput[A any](t Task) (A, error) {
	var a A
	if want, ok := kindOf[A](); ok && want != t.Kind {
		return a, invalid("input", fmt.Sprintf("task %s is of kind %q, not %T's kind %q", t.ID, t.Kind, a, want))
	}
	if len(t.Input) == 0 {
		return a, nil
	}
	if err := json.Unmarshal(t.Input, &a); err != nil {
		return a, invalid("input", fmt.Sprintf("kind %q: task %s's input does not decode into %T: %v", t.Kind, t.ID, a, err))
	}
	return a, nil
}

// kindOf is A's Kind when A implements Args, asked of a zero A (of a new A's element when A
// is a pointer type, so that a Kind method with a pointer receiver is not called on nil).
func kindOf[A any]() (string, bool) {
	var a A
	if args, ok := any(a).(Args); ok && !isNilPointer(args) {
		return args.Kind(), true
	}
	if t := reflect.TypeFor[A](); t.Kind() == reflect.Pointer {
		if args, ok := reflect.New(t.Elem()).Interface().(Args); ok {
			return args.Kind(), true
		}
	}
	return "", false
}

// isNilPointer reports whether v is a nil pointer (or other nil reference) boxed in an
// interface: its Kind method may then dereference nil.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
