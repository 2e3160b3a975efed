package pebblelog

import (
	"errors"
	"fmt"
	"strings"
)

// The kinds of error the store returns. Check with errors.Is; the values Open returns are
// *OpenError, which carries the directory, the file, the field and the cause.
var (
	// ErrNotAStore: Open was pointed at something that is not a worklog store (a foreign or
	// non-empty directory without the marker, a file, a marker of an unknown form, a marker
	// beside someone else's database; with ReadOnly, a missing or empty directory).
	// Returned by Open.
	ErrNotAStore = errors.New("pebblelog: not a worklog store")
	// ErrFormatTooNew: the store was written by a newer build (its marker or its format key
	// names a newer format). Returned by Open.
	ErrFormatTooNew = errors.New("pebblelog: store format is newer than this build")
	// ErrFormatTooOld: the store is of an earlier development format (1 to 6) that this build
	// neither reads nor upgrades; nothing in it was changed. The OpenError's Hint says how to
	// move its data: export it with an earlier build, import it with this one. Returned by
	// Open.
	ErrFormatTooOld = errors.New("pebblelog: store format is older than this build reads")
	// ErrLocked: another process holds the store (its WORKLOG.lock or Pebble's LOCK), or
	// it is already open in this one (OpenError.Detail says which: share the open store).
	// Returned by Open.
	ErrLocked = errors.New("pebblelog: store is already open")
	// ErrCorruptStore: a file of the store is damaged or missing, so acknowledged data may be
	// missing or unreadable. Open refuses such a store (OpenError.File names the file when it
	// is known) and changes none of its files; a running store that finds damage fails
	// (every later call returns ErrStoreFailed wrapping it).
	ErrCorruptStore = errors.New("pebblelog: store is damaged")
	// ErrInvalidOptions: an Options field is out of range. Options.Validate returns an
	// *OptionError naming it; Open, which checks options before it touches the directory, an
	// *OpenError of this kind wrapping that *OptionError. It is the one sentinel of every
	// worklog options struct (work.ErrInvalidOptions, runner.ErrInvalidConfig: the same value).
	ErrInvalidOptions = errors.New("worklog: invalid options")
	// ErrClosed: a call on a closed store (every Store method but Close and Dir).
	ErrClosed = errors.New("pebblelog: store closed")
	// ErrStoreFailed: a write, an fsync or a read of the store failed in a way after which
	// nothing can be assumed about what is on disk; every later call fails until the store is
	// reopened. Open returns it (in an *OpenError, the cause wrapped) when reading or writing
	// the directory fails for a reason other than what it holds: try again once the cause is
	// fixed.
	ErrStoreFailed = errors.New("pebblelog: store failed; reopen it")
	// ErrReadOnlyStore: Update on a store opened read-only; and Open for writing of a
	// directory that cannot be written (a read-only mount, another user's store).
	ErrReadOnlyStore = errors.New("pebblelog: store opened read-only")
)

// OptionError refuses one field of an options struct: the one error shape of every worklog
// options struct (work.OptionError and runner.ConfigError are this type; it is declared here,
// in the lowest package with options, so that all of them share it). It matches
// ErrInvalidOptions.
type OptionError struct {
	Options string // the struct, package-qualified: "pebblelog.Options", "work.Options", "runner.Config"
	Field   string // the field as spelled in Go: "MaxConns", "Heartbeat"
	Message string // what is wrong, and what is allowed
}

func (e *OptionError) Error() string {
	name := e.Field
	if e.Options != "" {
		name = e.Options + "." + e.Field
	}
	return "invalid " + name + ": " + e.Message
}

// Is matches ErrInvalidOptions.
func (e *OptionError) Is(target error) bool { return target == ErrInvalidOptions }

// OpenError is the error Open (and Options.Validate) returns when it refuses a directory or
// options. errors.Is(err, Kind) holds, and errors.Unwrap gives the cause, if any: callers
// read the fields instead of the message.
type OpenError struct {
	Dir    string // the store's directory, as given to Open
	Kind   error  // ErrNotAStore, ErrFormatTooNew, ErrFormatTooOld, ErrLocked, ErrCorruptStore, ErrInvalidOptions, ErrReadOnlyStore or ErrStoreFailed
	Field  string // ErrInvalidOptions: the Options field at fault ("MemTableSize")
	File   string // the file at fault, relative to Dir, when one is ("000012.log", "MANIFEST-000001")
	Offset int64  // the byte offset in File where the damage starts; -1 when unknown or no file
	Detail string // what is wrong, as a sentence without the directory
	Hint   string // what the user can do, if anything
	Err    error  // the underlying cause, if any
}

func (e *OpenError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v", e.Kind)
	if e.Dir != "" {
		fmt.Fprintf(&b, ": %s", e.Dir)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ": Options.%s", e.Field)
	}
	if e.File != "" {
		fmt.Fprintf(&b, ": %s", e.File)
		if e.Offset >= 0 {
			fmt.Fprintf(&b, " at offset %d", e.Offset)
		}
	}
	if e.Detail != "" {
		fmt.Fprintf(&b, ": %s", e.Detail)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Hint != "" {
		fmt.Fprintf(&b, "; %s", e.Hint)
	}
	return b.String()
}

// Is reports whether target is the error's kind.
func (e *OpenError) Is(target error) bool { return target == e.Kind }

func (e *OpenError) Unwrap() error { return e.Err }
