package main

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Flag values that read as a person would write them. pflag's own numeric flags report a
// mistake as `invalid argument "x" for "--at-seq" flag: strconv.ParseUint: parsing "x":
// invalid syntax`; these say `--at-seq: "x" is not a sequence number (a whole number, 0 or
// more)`.

// badFlagValue is the error a flag's Set returns: why the text is not a value of the flag,
// as the end of a sentence whose start is the flag and the text.
type badFlagValue struct{ reason string }

func (e *badFlagValue) Error() string { return e.reason }

// wholeValue is a flag holding a whole number (uint64). noun names what the number is ("a
// sequence number"); help shows the flag as `--name N`.
type wholeValue struct {
	p    *uint64
	noun string // "a sequence number", "a number of events", ...
	hint string // what the number may be, in parentheses after the reason
}

func (v *wholeValue) String() string { return strconv.FormatUint(*v.p, 10) }
func (v *wholeValue) Type() string   { return "N" }

func (v *wholeValue) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	switch {
	case err == nil:
		*v.p = n
		return nil
	case errors.Is(err, strconv.ErrRange):
		return &badFlagValue{fmt.Sprintf("is too large for %s (at most %d)", v.noun, uint64(math.MaxUint64))}
	case strings.HasPrefix(strings.TrimSpace(s), "-"):
		return &badFlagValue{fmt.Sprintf("is not %s: it cannot be negative (%s)", v.noun, v.hint)}
	}
	return &badFlagValue{fmt.Sprintf("is not %s (%s)", v.noun, v.hint)}
}

func seqValue(p *uint64) *wholeValue {
	return &wholeValue{p: p, noun: "a sequence number", hint: "a whole number, 0 or more"}
}

func countValue(p *uint64, hint string) *wholeValue {
	return &wholeValue{p: p, noun: "a number of events", hint: hint}
}

func seedValue(p *uint64) *wholeValue {
	return &wholeValue{p: p, noun: "a seed", hint: "a whole number, 0 or more"}
}

// invalidFlag matches pflag's InvalidValueError, which cobra hands to the flag error func:
// `invalid argument "<value, Go-quoted>" for "--name" flag: <cause>` (or "-s, --name").
var invalidFlag = regexp.MustCompile(`^invalid argument ("(?:[^"\\]|\\.)*") for "(?:-[^,"]+, )?(--[^"]+)" flag: `)

// flagErrorText rewrites a flag parse error into one plain sentence that names the flag and
// the text given. Errors it does not recognise (an unknown flag, a missing value) pass as
// they are: pflag words those well.
func flagErrorText(err error) string {
	m := invalidFlag.FindStringSubmatch(err.Error())
	if m == nil {
		return err.Error()
	}
	value, uerr := strconv.Unquote(m[1])
	if uerr != nil {
		return err.Error()
	}
	name := m[2]
	var bad *badFlagValue
	var ne *strconv.NumError
	switch {
	case errors.As(err, &bad):
		return fmt.Sprintf("%s: %q %s", name, value, bad.reason)
	case errors.As(err, &ne) && ne.Func == "ParseBool":
		return fmt.Sprintf("%s: %q is not true or false (%s alone means true)", name, value, name)
	}
	cause := err.Error()[len(m[0]):]
	return fmt.Sprintf("%s: %q is not a valid value: %s", name, value, cause)
}

// The instants a store can hold: event times are int64 Unix nanoseconds.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

// parseTime reads an RFC 3339 time flag.
func parseTime(flag, s string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		if _, zerr := time.Parse(time.RFC3339Nano, s+"Z"); zerr == nil {
			return 0, fmt.Errorf("--%s: %q has no time zone: write %sZ for UTC, or an offset such as %s+02:00", flag, s, s, s)
		}
		return 0, fmt.Errorf("--%s: %q is not an RFC 3339 time (for example 2026-03-02T09:00:00Z)", flag, s)
	}
	if t.Before(minTime) || t.After(maxTime) {
		// UnixNano is undefined out there: it would wrap to a time on the other side.
		return 0, fmt.Errorf("--%s: %q is outside the times a store can hold (%s to %s)", flag, s,
			minTime.UTC().Format(time.RFC3339), maxTime.UTC().Format(time.RFC3339))
	}
	return t.UnixNano(), nil
}
