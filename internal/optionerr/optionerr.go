// Package optionerr builds and checks the one error shape of worklog's option structs
// (work.Options, postgres.Options, runner.Config, pebblelog.Options): each package validates
// its struct in one step, before anything is opened or started, and refuses the first field
// out of range with an *Error naming the struct and the field. The type is
// pebblelog.OptionError (the lowest package with options, which work imports); every package
// exports it under its own name (work.OptionError, runner.ConfigError: aliases, so one
// errors.As target catches all of them) and ErrInvalid under its own (work.ErrInvalidOptions,
// pebblelog.ErrInvalidOptions, runner.ErrInvalidConfig: the same value).
package optionerr

import (
	"errors"
	"reflect"
	"slices"

	"github.com/worklog/worklog/pebblelog"
)

// ErrInvalid is matched (errors.Is) by every *Error: pebblelog.ErrInvalidOptions.
var ErrInvalid = pebblelog.ErrInvalidOptions

// Error refuses one field of an options struct: pebblelog.OptionError.
type Error = pebblelog.OptionError

// New returns an *Error for field of options (the struct's qualified name).
func New(options, field, message string) *Error {
	return &Error{Options: options, Field: field, Message: message}
}

// T is the part of testing.TB the table tests' helpers use.
type T interface {
	Helper()
	Errorf(format string, args ...any)
}

// Want reports to t unless err is an *Error naming options.field and matching ErrInvalid.
// what says which case of a table failed.
func Want(t T, what string, err error, options, field string) {
	t.Helper()
	var oe *Error
	if !errors.As(err, &oe) || !errors.Is(err, ErrInvalid) || oe.Options != options || oe.Field != field {
		t.Errorf("%s: %v, want an option error naming %s.%s", what, err, options, field)
	}
}

// FieldsCovered reports to t every field of the struct v that covered does not name: each
// options struct's table test lists every field (its refusals, its default, or both), so a
// new field cannot join the struct without joining the test.
func FieldsCovered(t T, v any, covered ...string) {
	t.Helper()
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		if f := rt.Field(i).Name; !slices.Contains(covered, f) {
			t.Errorf("%s.%s is in no case of its table test: add its refusals and its default", rt.Name(), f)
		}
	}
}
